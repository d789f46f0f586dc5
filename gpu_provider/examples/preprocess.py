"""Example pipeline, stage 1: make the training data for one data interval.

A stand-in for a real feature pipeline. It generates a synthetic binary classification data set (16 numeric
features, a label drawn from a small random "teacher" network plus noise), seeded from the data interval so the
same interval always gives the same bytes and different intervals give different data, standardises the features
with the training split's mean and standard deviation, and writes::

    <out>/train.npz   X: float32 (n_train, 16), y: int8 (n_train,)
    <out>/test.npz    X: float32 (n_test, 16),  y: int8 (n_test,)
    <out>/meta.json   interval, seed, sizes, label balance, the standardisation statistics

Usage (the example DAG passes the run's data interval)::

    python -m gpu_provider.examples.preprocess --start 2024-01-01T00:00:00+00:00 --end 2024-01-02T00:00:00+00:00 \\
        --out file:///tmp/pipeline/data [--rows 10000]

Needs only numpy (the ``examples`` extra), the standard library and ``gpu_provider.runtime``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from datetime import datetime

from gpu_provider.examples._common import as_uri, np, uri_to_path, write_json, write_npz
from gpu_provider.runtime import declare_output

N_FEATURES = 16
TEST_FRACTION = 0.2


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
