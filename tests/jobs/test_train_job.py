"""gpu_provider.examples.train as real processes: 2-node data parallelism, exact resume after SIGTERM/SIGKILL."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from jobrun import EXIT_STOPPED, Job, Launcher, checkpoint_steps, free_port, wait_until

from gpu_provider.runtime import latest_checkpoint

EPOCHS, STEPS_PER_EPOCH, EVERY = 3, 40, 10
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
#: slow enough that an interruption lands mid-training (120 steps ~ 3 s), fast enough for the suite
STEP_DELAY = "0.025"


def train_args(data: Path, out: Path, step_delay: str = "0") -> list[str]:
    """The command line shared by every run, so resumed runs continue the very same plan."""
    return [
        "--data", data.as_uri(), "--out", str(out), "--epochs", str(EPOCHS),
        "--steps-per-epoch", str(STEPS_PER_EPOCH), "--batch-size", "64",
        "--checkpoint-every", str(EVERY), "--step-delay", step_delay,
    ]  # fmt: skip


def wait_all(jobs: list[Job], expected: int, timeout: float = 60) -> None:
    """Wait for every rank and check each exited with ``expected``."""
    for job in jobs:
        status = job.wait(timeout)
        assert status == expected, f"{job.log.name} exited {status}, expected {expected}:\n{job.output}"


def resumed_step(job: Job) -> int:
    """The step a resumed rank says it continued from."""
    found = re.search(r"resumed from checkpoint ckpt-(\d{10}) \(step (\d+) of (\d+)\)", job.output)
    assert found, f"no resume line in {job.log.name}:\n{job.output}"
    assert int(found[1]) == int(found[2]) and int(found[3]) == TOTAL_STEPS
    return int(found[2])


def stop_step(job: Job) -> int:
    """The step at which a rank says it stopped on request."""
    found = re.search(r"stop requested at step (\d+): checkpoint saved, exiting", job.output)
    assert found, f"no stop line in {job.log.name}:\n{job.output}"
    return int(found[1])


def latest_step(checkpoints: Path) -> int:
    """The step of the checkpoint ``LATEST`` names (the commit point of a save), -1 when there is none."""
    latest = latest_checkpoint(checkpoints.as_uri())
    return -1 if latest is None else int(latest.rstrip("/").rsplit("-", 1)[-1])


def interrupt_after(jobs: list[Job], checkpoints: Path, step: int, signum: int) -> None:
    """Once the latest checkpoint is newer than ``step``, send ``signum`` to every rank and wait for them to exit."""

    def newer_checkpoint() -> bool:
        for job in jobs:
            assert job.proc.poll() is None, f"{job.log.name} exited early:\n{job.output}"
        return latest_step(checkpoints) > step

    wait_until(newer_checkpoint, 30, f"a checkpoint after step {step}")
    for job in jobs:
        job.signal(signum)
    wait_all(jobs, EXIT_STOPPED if signum == signal.SIGTERM else -signum)


def assert_same_model(a: Path, b: Path) -> None:
    """Bit-for-bit: the same arrays, the same bytes on disk, the same metrics."""
    with np.load(a / "model.npz") as model_a, np.load(b / "model.npz") as model_b:
        assert sorted(model_a.files) == sorted(model_b.files) == ["b1", "b2", "w1", "w2"]
        for name in model_a.files:
            assert model_a[name].dtype == np.float64
            assert np.array_equal(model_a[name], model_b[name]), name
            assert model_a[name].tobytes() == model_b[name].tobytes(), name
    assert (a / "model.npz").read_bytes() == (b / "model.npz").read_bytes()
    assert json.loads((a / "metrics.json").read_text()) == json.loads((b / "metrics.json").read_text())


@pytest.fixture(scope="module")
def reference_model(dataset: Path, session_launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Model A: two nodes, no interruption, no step delay."""
    root = tmp_path_factory.mktemp("reference")
    ranks = session_launcher.start_ranks(
        "train", train_args(dataset, root / "model"), 2, {"GPU_PROVIDER_CHECKPOINT_URI": (root / "ckpt").as_uri()}
    )
    wait_all(ranks, 0)
    assert "starting from step 0 (no checkpoint)" in ranks[0].output
    return root / "model"


@pytest.mark.parametrize("first_signal", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_interrupted_twice_and_resumed_gives_the_identical_model(
    first_signal: int, dataset: Path, reference_model: Path, launcher: Launcher, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    env = {"GPU_PROVIDER_CHECKPOINT_URI": checkpoints.as_uri()}
    slow = train_args(dataset, tmp_path / "model", STEP_DELAY)

    # Attempt 1: fresh start, interrupted after step 30 (SIGTERM: stop handler; SIGKILL: no warning at all).
    ranks = launcher.start_ranks("train", slow, 2, env, "a1-")
    interrupt_after(ranks, checkpoints, 30, first_signal)
    resume_from = latest_checkpoint(checkpoints.as_uri())
    assert resume_from is not None
    if first_signal == signal.SIGTERM:
        stop_steps = {stop_step(rank) for rank in ranks}
        assert len(stop_steps) == 1, stop_steps  # the ranks agreed on the step
        assert resume_from.rstrip("/").endswith(f"/ckpt-{stop_steps.pop():010d}")

    # Attempt 2: resumes on both ranks, SIGTERM again later.
    env2 = {**env, "GPU_PROVIDER_RESUME_FROM": resume_from, "GPU_PROVIDER_ATTEMPT": "2"}
    ranks = launcher.start_ranks("train", slow, 2, env2, "a2-")
    interrupt_after(ranks, checkpoints, 70, signal.SIGTERM)
    first_resume = {resumed_step(r) for r in ranks}
    assert len(first_resume) == 1 and 30 < first_resume.pop() < TOTAL_STEPS
    if first_signal == signal.SIGKILL:
        assert resumed_step(ranks[0]) % EVERY == 0  # only the periodic checkpoints were there to resume from

    # Attempt 3: resumes again and finishes (no delay).
    resume_from = latest_checkpoint(checkpoints.as_uri())
    assert resume_from is not None
    env3 = {**env, "GPU_PROVIDER_RESUME_FROM": resume_from, "GPU_PROVIDER_ATTEMPT": "3"}
    ranks = launcher.start_ranks("train", train_args(dataset, tmp_path / "model"), 2, env3, "a3-")
    wait_all(ranks, 0)
    second_resume = {resumed_step(r) for r in ranks}
    assert len(second_resume) == 1 and 70 < second_resume.pop() < TOTAL_STEPS

    assert_same_model(reference_model, tmp_path / "model")


def test_a_stop_on_one_rank_stops_every_rank_at_the_same_step(
    dataset: Path, launcher: Launcher, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    ranks = launcher.start_ranks(
        "train", train_args(dataset, tmp_path / "model", STEP_DELAY), 2,
        {"GPU_PROVIDER_CHECKPOINT_URI": checkpoints.as_uri()},
    )  # fmt: skip
    wait_until(lambda: bool(checkpoint_steps(checkpoints)), 30, "the first checkpoint")
    ranks[1].signal(signal.SIGTERM)  # only the worker hears about it
    wait_all(ranks, EXIT_STOPPED)
    steps = {stop_step(rank) for rank in ranks}
    assert len(steps) == 1
    assert checkpoint_steps(checkpoints)[-1] == steps.pop()


@pytest.mark.parametrize("victim", [1, 0])
def test_a_dead_peer_is_a_clear_error_not_a_hang(
    victim: int, dataset: Path, launcher: Launcher, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    ranks = launcher.start_ranks(
        "train", train_args(dataset, tmp_path / "model", STEP_DELAY), 2,
        {"GPU_PROVIDER_CHECKPOINT_URI": checkpoints.as_uri()},
    )  # fmt: skip
    wait_until(lambda: bool(checkpoint_steps(checkpoints)), 30, "the first checkpoint")
    ranks[victim].signal(signal.SIGKILL)
    survivor = ranks[1 - victim]
    assert survivor.wait(15) == 1, survivor.output
    # EOF or a reset, depending on what was in flight: either way the message names the dead rank
    assert re.search(
        rf"error: (rank {victim} closed the connection|lost the connection to rank {victim})", survivor.output
    )


def test_single_node_needs_no_sockets_and_is_reproducible(dataset: Path, launcher: Launcher, tmp_path: Path) -> None:
    for name in ("one", "two"):
        job = launcher.run("train", train_args(dataset, tmp_path / name))
        assert "starting from step 0 (no checkpoint)" in job.output
        assert "GPU_PROVIDER_CHECKPOINT_URI is not set" in job.output
        assert f"done: steps {TOTAL_STEPS}" in job.output
    assert_same_model(tmp_path / "one", tmp_path / "two")
    metrics = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert metrics["steps"] == TOTAL_STEPS and metrics["nnodes"] == 1
    assert metrics["train_accuracy"] > 0.8 and metrics["test_accuracy"] > 0.8
    assert metrics["final_loss"] < 0.5


def test_ranks_that_disagree_on_the_run_refuse_to_train(dataset: Path, launcher: Launcher, tmp_path: Path) -> None:
    rendezvous = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    args = train_args(dataset, tmp_path / "model")
    rank0 = launcher.start("train", args, {**rendezvous, "NODE_RANK": "0"})
    rank1 = launcher.start("train", [*args, "--lr", "0.5"], {**rendezvous, "NODE_RANK": "1"})
    for job in (rank0, rank1):
        assert job.wait(30) == 1, job.output
        assert "disagrees on the run" in job.output
    assert not (tmp_path / "model").exists()


def test_a_missing_resume_checkpoint_is_a_clear_error(dataset: Path, launcher: Launcher, tmp_path: Path) -> None:
    missing = (tmp_path / "ckpt" / "ckpt-0000000040").as_uri()
    job = launcher.start("train", train_args(dataset, tmp_path / "model"), {"GPU_PROVIDER_RESUME_FROM": missing})
    assert job.wait() == 1
    assert f"error: cannot resume: checkpoint {missing} does not exist" in job.output
