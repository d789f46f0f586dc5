"""gpu_provider.examples.evaluate as a real process next to a real training run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from jobrun import Launcher, wait_until


def _train_args(dataset: Path, model: Path, epochs: str = "4", delay: str = "0.05") -> list[str]:
    return ["--data", dataset.as_uri(), "--out", model.as_uri(), "--epochs", epochs, "--step-delay", delay]


def _evaluate_args(dataset: Path, checkpoints: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--checkpoints",
        checkpoints.as_uri(),
        "--data",
        str(dataset),
        "--model",
        model.as_uri(),
        "--out",
        out.as_uri(),
        "--poll-interval",
        "0.1",
        *extra,
    ]


def test_evaluates_each_new_checkpoint_while_training_runs_and_stops_when_it_ends(
    dataset: Path, launcher: Launcher, tmp_path: Path
) -> None:
    checkpoints, model, out = tmp_path / "ckpt", tmp_path / "model", tmp_path / "eval"
    env = {"GPU_PROVIDER_CHECKPOINT_URI": checkpoints.as_uri(), "GPU_PROVIDER_CHECKPOINT_KEEP": "3"}
    evaluator = launcher.start("evaluate", _evaluate_args(dataset, checkpoints, model, out))
    trainer = launcher.start("train", [*_train_args(dataset, model), "--checkpoint-every", "10"], env)

    # the first evaluation is written while training still runs
    wait_until(lambda: (out / "evaluations.json").exists(), 60, "the first evaluation")
    assert trainer.proc.poll() is None, "training had already ended: nothing was evaluated while it ran"
    assert json.loads((out / "evaluations.json").read_text())["training_finished"] is False

    assert trainer.wait(60) == 0, trainer.output
    assert evaluator.wait(30) == 0, evaluator.output
    report = json.loads((out / "evaluations.json").read_text())
    steps = [e["step"] for e in report["evaluations"]]
    assert report["training_finished"] is True
    assert len(steps) >= 3 and steps == sorted(set(steps)) and all(s % 10 == 0 for s in steps), steps
    total = json.loads((model / "metrics.json").read_text())["steps"]
    assert steps[-1] == (total - 1) // 10 * 10, "the last checkpoint training wrote (one every 10 steps) is evaluated"
    assert report["evaluations"][-1]["test_accuracy"] > 0.8
    assert report["best"]["test_accuracy"] == max(e["test_accuracy"] for e in report["evaluations"])
    assert f"evaluate: step {steps[0]} (ckpt-{steps[0]:010d}): test accuracy" in evaluator.output
    assert "training ended" in evaluator.output


def test_reads_only_published_checkpoints(dataset: Path, launcher: Launcher, tmp_path: Path) -> None:
    checkpoints, model, out = tmp_path / "ckpt", tmp_path / "model", tmp_path / "eval"
    env = {"GPU_PROVIDER_CHECKPOINT_URI": checkpoints.as_uri(), "GPU_PROVIDER_CHECKPOINT_KEEP": "1"}
    launcher.run("train", [*_train_args(dataset, model, "1", "0"), "--checkpoint-every", "10"], env)
    (newest,) = [p for p in checkpoints.iterdir() if p.name.startswith("ckpt-")]
    assert (checkpoints / "LATEST").read_text().strip() == newest.name
    # a checkpoint being written, and a complete-looking folder that LATEST does not name yet
    step = int(newest.name[5:])
    shutil.copytree(newest, checkpoints / f".tmp-ckpt-{step + 10:010d}-host-1-2-3")
    shutil.copytree(newest, checkpoints / f"ckpt-{step + 20:010d}")
    launcher.run("evaluate", _evaluate_args(dataset, checkpoints, model, out))
    report = json.loads((out / "evaluations.json").read_text())
    assert [e["step"] for e in report["evaluations"]] == [step]


def test_gives_up_when_training_does_not_end(dataset: Path, launcher: Launcher, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    job = launcher.start(
        "evaluate", _evaluate_args(dataset, tmp_path / "ckpt", tmp_path / "model", out, "--max-wait", "0.5")
    )
    assert job.wait(30) == 1
    assert "training did not end within 0.5s" in job.output
    assert json.loads((out / "evaluations.json").read_text())["training_finished"] is False
