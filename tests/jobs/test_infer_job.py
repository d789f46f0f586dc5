"""gpu_provider.examples.infer end to end: preprocess -> train -> infer, as real processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from jobrun import Launcher


def test_infer_end_to_end(dataset: Path, launcher: Launcher, tmp_path: Path) -> None:
    model = tmp_path / "model"
    launcher.run("train", ["--data", dataset.as_uri(), "--out", model.as_uri(), "--epochs", "2"])
    job = launcher.run(
        "infer", ["--model", model.as_uri(), "--data", str(dataset), "--out", (tmp_path / "pred").as_uri()]
    )

    predictions = np.load(tmp_path / "pred" / "predictions.npy")
    with np.load(dataset / "test.npz") as test:
        labels = test["y"]
    assert predictions.shape == labels.shape and predictions.dtype == np.int8
    assert set(np.unique(predictions)) <= {0, 1}
    metrics = json.loads((tmp_path / "pred" / "metrics.json").read_text())
    assert metrics["rows"] == len(labels)
    assert metrics["accuracy"] == pytest.approx(float(np.mean(predictions == labels)))
    assert metrics["accuracy"] > 0.8
    # the same forward pass as training's own evaluation of the test split
    assert metrics["accuracy"] == pytest.approx(json.loads((model / "metrics.json").read_text())["test_accuracy"])
    assert f"infer: {len(labels)} rows, accuracy" in job.output


@pytest.mark.parametrize("program", ["preprocess", "train", "evaluate", "infer"])
def test_help_says_which_uris_work(program: str, launcher: Launcher) -> None:
    job = launcher.run(program, ["--help"])
    assert "file://" in job.output and "s3://" in job.output
