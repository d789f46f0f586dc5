"""The attempt lifecycle as Airflow users drive it: clearing a finished task, a worker dying, a zombie
try, a duplicate job, a deferred task's execution_timeout. Real Airflow (dag.test in a child process) or
a real try runner, real local jobs and signals. (A job cancelled by a person: tests/operators/suite/.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpu_provider.backends.base import JobIdentity, JobRequest, JobState, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from tests.harness import HERE, Harness, wait_for

RUN_TRY = HERE / "run_try.py"


def _state(backend: LocalBackend, job_id: str) -> JobState:
    handle = next(h for h in backend.list_jobs() if h.job_id == job_id)
    status = backend.poll([handle])[job_id]
    assert not isinstance(status, Exception), status
    return status.state


def test_clearing_a_succeeded_task_runs_its_job_again(harness: Harness) -> None:
    """Issue 15 defect 1: a cleared task used to return the earlier try's result without running."""
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "rerun",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}),
            command={harness.toy_command(str(out), 2, 0.05)},
            poll_interval=0.2,
        )
        """,
    )
    first = harness.run(dag, "rerun")
    assert first.task()["state"] == "success", first.log[-3000:]
    second = harness.run(dag, "rerun")  # the same logical date: the same task instance, run again
    assert second.task()["state"] == "success", second.log[-3000:]
    (before,), (after,) = first.task()["xcom"]["attempts"], second.task()["xcom"]["attempts"]
    assert before["job_id"] != after["job_id"], "the cleared task must run a new job"
    assert after["attempt"] == 2 and after["collected"] is True
    assert "already succeeded" not in second.log
    backend = LocalBackend(state_dir=str(harness.state_dir))
    assert len(backend.list_jobs()) == 2


def test_an_interruption_nobody_watched_keeps_its_gpu_time(harness: Harness) -> None:
    """Issue 15 defect 3: the record was rebuilt from a bare status and showed 0 GPU-seconds."""
    out = harness.tmp / "out"

    def write_dag(poll_interval: float) -> Path:
        return harness.write_dag(
            "unwatched",
            f"""
            GpuJobOperator(
                task_id="job",
                backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=1),
                command={harness.toy_command(str(out), 60, 0.1)},
                capacity=SpotFallback(backoff=0),
                checkpoint="file://{harness.tmp / "ckpt"}",
                poll_interval={poll_interval},
                deferrable=False,
            )
            """,
        )

    # the first try polls once, at submission, and is killed before it looks again: nobody watches the job run
    dag = write_dag(poll_interval=30)
    worker, _, _ = harness.start(dag, "unwatched")
    backend = LocalBackend(state_dir=str(harness.state_dir), grace_period=1)
    handle = wait_for(lambda: backend.list_jobs(), 120, "the job to be submitted")[0]
    wait_for(lambda: _state(backend, handle.job_id) is JobState.RUNNING, 120, "the job to run")
    wait_for(lambda: (harness.tmp / "ckpt" / "LATEST").exists(), 30, "a first checkpoint")
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    backend.simulate_preemption(handle)
    wait_for(lambda: _state(backend, handle.job_id) is JobState.PREEMPTED, 30, "the spot reclaim")

    # the retry finds the reclaimed attempt at once; its on-demand attempt it polls often (30 s: a wait for nothing)
    run = harness.run(write_dag(poll_interval=0.3), "unwatched")
    task = run.task()
    assert task["state"] == "success", run.log[-3000:]
    first, second = task["xcom"]["attempts"]
    assert (first["state"], first["interruption"]) == ("PREEMPTED", "preempted")
    assert first["gpu_seconds"] > 0.3, first
    assert (second["capacity"], second["state"]) == ("on-demand", "SUCCEEDED")
    assert task["xcom"]["gpu_seconds"] > first["gpu_seconds"]


def _request(task: TaskKey, attempt: int, command: list[str]) -> JobRequest:
    return JobRequest(
        identity=JobIdentity(task=task, try_number=1, attempt=attempt, capacity="on-demand"),
        command=tuple(command),
        env={},
        resources=GpuResources(gpus=1),
        capacity="on-demand",
    )


def test_two_live_attempts_of_one_task_keep_one_and_cancel_the_other(harness: Harness) -> None:
    """Issue 15 defect 8: a duplicate live job used to keep billing unwatched."""
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "dupes",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command={harness.toy_command(str(out), 2, 0.05)},
            poll_interval=0.2,
        )
        """,
    )
    backend = LocalBackend(state_dir=str(harness.state_dir), grace_period=0.5)
    task = TaskKey("dupes", "job", "manual__2026-01-05T00:00:00+00:00")  # dag.test's run id for the harness date
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    older = backend.submit(_request(task, 1, sleeper))
    newer = backend.submit(_request(task, 2, harness.toy_args(str(out), 40, 0.2)))
    run = harness.run(dag, "dupes")
    assert run.result["run_id"] == task.run_id
    assert run.task()["state"] == "success", run.log[-3000:]
    assert "Found a second live attempt" in run.log and older.job_id in run.log
    assert _state(backend, older.job_id) is JobState.CANCELLED
    assert run.task()["xcom"]["job_id"] == newer.job_id


def test_a_deferred_task_is_stopped_by_its_execution_timeout(harness: Harness) -> None:
    """Issue 15 defect 7: Airflow does not time deferred tasks out; the trigger fires the deadline itself."""
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "deferred_timeout",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command={harness.toy_command(str(out), 600, 0.1)},
            execution_timeout=timedelta(seconds=4),
            poll_interval=0.3,
            deferrable=True,
        )
        """,
    )
    run = harness.run(dag, "deferred_timeout", timeout=120)
    assert run.task()["state"] == "failed", run.log[-3000:]
    assert "execution_timeout" in run.log and "it was cancelled and this try fails" in run.log
    backend = LocalBackend(state_dir=str(harness.state_dir))
    (handle,) = backend.list_jobs()
    # the cancel was asked for before the task failed; the job's processes stop on their own time (its grace period)
    wait_for(lambda: _state(backend, handle.job_id) is JobState.CANCELLED, 30, "the job to be cancelled")


def _try(harness: Harness, try_number: int, command: list[str]) -> tuple[subprocess.Popen[str], Path]:
    spec = {
        "state_dir": str(harness.state_dir),
        "command": command,
        "try_number": try_number,
        "store": str(harness.tmp / "store.json"),
        "run_id": "manual__zombie",
        "poll_interval": 0.2,
    }
    out = harness.tmp / f"try{try_number}.json"
    log = (harness.tmp / f"try{try_number}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(RUN_TRY), json.dumps(spec), str(out)],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, out


def test_a_zombie_try_does_not_cancel_the_job_its_successor_took_over(harness: Harness) -> None:
    """Issue 18.1: Airflow starts try 2 while try 1's worker still runs, then SIGTERMs try 1."""
    release = harness.tmp / "release"
    # runs until the test releases it: however slow the machine, the job outlives both tries' start
    command = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"]
    zombie, _ = _try(harness, 1, command)
    backend = LocalBackend(state_dir=str(harness.state_dir), grace_period=1)
    try:
        handle = wait_for(lambda: backend.list_jobs(), 60, "try 1 to submit")[0]
        wait_for(lambda: _state(backend, handle.job_id) is JobState.RUNNING, 120, "the job to run")
        successor, successor_out = _try(harness, 2, command)
        wait_for(
            lambda: (s := backend.poll([handle])[handle.job_id]) and getattr(s, "owner_try", None) == 2,
            120,
            "try 2 to take the job over",
        )
        zombie.send_signal(signal.SIGTERM)  # what Airflow does to the old worker
        zombie.wait(timeout=60)
        assert _state(backend, handle.job_id) is JobState.RUNNING, "the zombie's on_kill left the job alone"
        release.touch()
        successor.wait(timeout=120)
        result = json.loads(successor_out.read_text())
        assert result["state"] == "success", result
        assert result["xcom"]["job_id"] == handle.job_id, "the successor finished the same job"
        assert _state(backend, handle.job_id) is JobState.SUCCEEDED
        assert len(backend.list_jobs()) == 1
    finally:
        release.touch()
        for proc in (zombie,):
            if proc.poll() is None:
                proc.kill()
