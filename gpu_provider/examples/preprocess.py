"""Example pipeline, stage 1: make the training data for one data interval.

A stand-in for a real feature pipeline. It generates a synthetic binary classification data set (16 numeric
features, a label drawn from a small random "teacher" network plus noise), seeded from the data interval so the
same interval always gives the same bytes and different intervals give different data, standardises the features
with the training split's mean and standard deviation, and writes::

    <out>/train.npz   X: float32 (n_train, 16), y: int8 (n_train,)
    <out>/test.npz    X: float32 (n_test, 16),  y: int8 (n_test,)
    <out>/meta.json   interval, seed, sizes, label balance, the standardisation statistics

Usage (the example DAG passes the run's data interval)::

    python jobs/preprocess.py --start 2024-01-01T00:00:00+00:00 --end 2024-01-02T00:00:00+00:00 \\
        --out file:///tmp/pipeline/data [--rows 10000]

Needs only numpy, the standard library and ``gpu_provider.runtime``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import zipfile
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np

from gpu_provider.runtime import declare_output

N_FEATURES = 16
TEST_FRACTION = 0.2


def uri_to_path(uri: str) -> Path:
    """Map a ``file://`` URI or a plain path to a local path (this example does not read or write ``s3://``)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    raise SystemExit(f"error: {uri!r}: this example reads and writes only file:// URIs and plain paths")


def as_uri(location: str) -> str:
    """The URI to declare for an output location: URIs as given, plain paths as absolute ``file://`` URIs."""
    return location if urlparse(location).scheme else Path(location).resolve().as_uri()


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez``, but byte-for-byte reproducible (fixed member timestamps) and written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(member, "w", force_zip64=True) as stream:
                np.lib.format.write_array(stream, np.asarray(array), allow_pickle=False)
    os.replace(tmp, path)


def write_json(path: Path, data: dict[str, object]) -> None:
    """Write ``data`` as stable, human-readable JSON, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def parse_instant(text: str) -> datetime:
    """Parse an ISO 8601 date or date-time, as Airflow renders ``data_interval_start``/``_end``."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"error: {text!r} is not an ISO 8601 date or date-time") from None


def interval_seed(start: datetime, end: datetime) -> int:
    """A 63-bit seed derived from the data interval: stable across machines and Python versions."""
    digest = hashlib.sha256(f"{start.isoformat()}/{end.isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def make_dataset(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Raw features (float64, deliberately badly scaled) and 0/1 labels from a random two-layer teacher."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 20.0, size=N_FEATURES)
    offset = rng.normal(0.0, 10.0, size=N_FEATURES)
    x = rng.normal(size=(rows, N_FEATURES)) * scale + offset
    teacher_hidden = rng.normal(size=(N_FEATURES, 8)) / np.sqrt(N_FEATURES)
    teacher_out = rng.normal(size=8)
    z = (x - offset) / scale  # the teacher sees well-scaled inputs; the student has to standardise
    score = np.tanh(z @ teacher_hidden) @ teacher_out + 0.3 * rng.normal(size=rows)
    y = (score > np.median(score)).astype(np.int8)
    return x, y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="--out accepts a file:// URI or a plain path (s3:// is not supported by this example).",
    )
    parser.add_argument("--start", required=True, help="data interval start, ISO 8601")
    parser.add_argument("--end", required=True, help="data interval end, ISO 8601")
    parser.add_argument("--out", required=True, help="output folder: file:///abs/path or a path")
    parser.add_argument("--rows", type=int, default=8_000, help="rows to generate (default: %(default)s)")
    args = parser.parse_args(argv)

    start, end = parse_instant(args.start), parse_instant(args.end)
    if end <= start:
        parser.error(f"--end ({args.end}) must be after --start ({args.start})")
    if args.rows < 10:
        parser.error("--rows must be at least 10")

    seed = interval_seed(start, end)
    x, y = make_dataset(seed, args.rows)
    n_test = max(1, round(args.rows * TEST_FRACTION))
    n_train = args.rows - n_test

    # Standardise with the training split's statistics only (no peeking at the test split).
    mean = x[:n_train].mean(axis=0)
    std = x[:n_train].std(axis=0)
    std[std == 0] = 1.0
    x = ((x - mean) / std).astype(np.float32)

    out = uri_to_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_npz(out / "train.npz", {"X": x[:n_train], "y": y[:n_train]})
    write_npz(out / "test.npz", {"X": x[n_train:], "y": y[n_train:]})
    meta: dict[str, object] = {
        "interval": {"start": start.isoformat(), "end": end.isoformat()},
        "seed": seed,
        "features": N_FEATURES,
        "train_rows": n_train,
        "test_rows": n_test,
        "positive_rate": float(y.mean()),
        "feature_mean": mean.tolist(),
        "feature_std": std.tolist(),
    }
    write_json(out / "meta.json", meta)

    print(
        f"preprocess: interval {start.isoformat()} .. {end.isoformat()} (seed {seed}): "
        f"{n_train} train + {n_test} test rows x {N_FEATURES} features, "
        f"positive rate {float(y.mean()):.3f}, written to {out}"
    )
    declare_output(as_uri(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
