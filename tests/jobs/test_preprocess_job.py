"""gpu_provider.examples.preprocess as a real process: determinism per data interval, standardisation, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from jobrun import Launcher

FILES = ("train.npz", "test.npz", "meta.json")
WEEK = ("2024-03-04T00:00:00+00:00", "2024-03-11T00:00:00+00:00")


def preprocess(launcher: Launcher, out: str, start: str, end: str, rows: int = 1000) -> str:
    """Run the program and return what it printed."""
    return launcher.run("preprocess", ["--start", start, "--end", end, "--out", out, "--rows", str(rows)]).output


def test_same_interval_gives_the_same_bytes(launcher: Launcher, tmp_path: Path) -> None:
    preprocess(launcher, (tmp_path / "a").as_uri(), *WEEK)
    preprocess(launcher, str(tmp_path / "b"), *WEEK)  # a plain path works too
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_another_interval_gives_other_data(launcher: Launcher, tmp_path: Path) -> None:
    preprocess(launcher, str(tmp_path / "a"), *WEEK)
    preprocess(launcher, str(tmp_path / "b"), "2024-03-11T00:00:00+00:00", "2024-03-18T00:00:00+00:00")
    with np.load(tmp_path / "a" / "train.npz") as a, np.load(tmp_path / "b" / "train.npz") as b:
        assert a["X"].shape == b["X"].shape
        assert not np.array_equal(a["X"], b["X"])
    seeds = {json.loads((tmp_path / d / "meta.json").read_text())["seed"] for d in ("a", "b")}
    assert len(seeds) == 2


def test_outputs_are_split_and_standardised(launcher: Launcher, tmp_path: Path) -> None:
    printed = preprocess(launcher, (tmp_path / "data").as_uri(), *WEEK, rows=1000)
    assert "800 train + 200 test rows x 16 features" in printed
    with np.load(tmp_path / "data" / "train.npz") as train, np.load(tmp_path / "data" / "test.npz") as test:
        assert train["X"].shape == (800, 16) and train["X"].dtype == np.float32
        assert test["X"].shape == (200, 16) and test["y"].shape == (200,)
        assert set(np.unique(train["y"])) == {0, 1}
        np.testing.assert_allclose(train["X"].mean(axis=0), 0.0, atol=1e-5)
        np.testing.assert_allclose(train["X"].std(axis=0), 1.0, atol=1e-4)
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["interval"] == {"start": WEEK[0], "end": WEEK[1]}
    assert 0.4 < meta["positive_rate"] < 0.6


def test_bad_interval_and_s3_are_refused(launcher: Launcher, tmp_path: Path) -> None:
    backwards = launcher.start("preprocess", ["--start", WEEK[1], "--end", WEEK[0], "--out", str(tmp_path)])
    assert backwards.wait() == 2 and "must be after --start" in backwards.output
    s3 = launcher.start("preprocess", ["--start", WEEK[0], "--end", WEEK[1], "--out", "s3://bucket/data"])
    assert s3.wait() != 0 and "only file:// URIs and plain paths" in s3.output
