"""Giving up on status reads leaves no job running for nobody (issue 24, item 4), on every backend world.

After too many failed reads in a row the owning task's wait gives up. With an Airflow retry to come, the
job is left for that retry, which reattaches; with none, nobody would ever watch the job again, so the task
cancels it and says so, instead of promising a retry that will not come.
"""

from __future__ import annotations

import json
import logging
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_provider.backends.base import Backend, JobHandle, JobState
from gpu_provider.backends.local import LocalBackend
from gpu_provider.engine.attempts import AttemptEngine, Fail
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.exceptions import GpuJobPollError
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import OnDemand
from tests.backends.contract.worlds import LONG_JOB, BackendWorld, poll_one, py, wait_ended, wait_state
from tests.backends.faults.reads import break_reads
from tests.harness import Harness, wait_for

log = logging.getLogger("test-status-give-up")


def _runner(backend: Backend, record: AttemptRecord) -> AttemptRunner:
    engine = AttemptEngine(OnDemand(), [record], try_number=1, backend_name=backend.name)
    return AttemptRunner(
        backend, engine, log=log, label="Airflow task d.t of run r", stop=threading.Event(), persist=lambda r: None
    )


@dataclass
class GaveUp:
    backend: Backend
    record: AttemptRecord
    runner: AttemptRunner
    why: str
    restore: Callable[[], None]


def _gave_up(world: BackendWorld, name: str) -> GaveUp:
    """A running job whose status reads fail, the message of the wait that gave up on them, and what undoes
    the fault."""
    backend = world.backend()
    handle = backend.submit(world.request(name, LONG_JOB))
    wait_state(backend, handle, JobState.RUNNING)
    record = AttemptRecord.new(handle, try_number=1)
    runner = _runner(world.backend(), record)
    restore = break_reads(world, handle)
    with pytest.raises(GpuJobPollError) as raised:
        runner.wait(record, poll_interval=0.02)
    return GaveUp(backend, record, runner, str(raised.value), restore)


def test_with_no_retry_left_the_job_is_cancelled_and_the_message_says_so(world: BackendWorld) -> None:
    gave_up = _gave_up(world, "give_up_last")
    record = gave_up.record
    assert "times in a row" in gave_up.why, gave_up.why

    step = gave_up.runner.gave_up_reading(record, gave_up.why, retry=None)

    assert isinstance(step, Fail) and step.record is record, step
    message = str(step.error)
    assert isinstance(step.error, GpuJobPollError)
    assert "No Airflow retry is left" in message and "it was cancelled" in message, message
    assert "reattach" not in message, "no retry will come: the message must not promise one"
    assert record.state is JobState.CANCELLED
    gave_up.restore()
    ended = wait_ended(gave_up.backend, record.handle)
    assert ended.state is JobState.CANCELLED, ended


def test_with_a_retry_left_the_job_is_left_for_the_retry_and_the_message_says_what_it_does(
    world: BackendWorld,
) -> None:
    gave_up = _gave_up(world, "give_up_retry")
    record = gave_up.record

    step = gave_up.runner.gave_up_reading(record, gave_up.why, retry="try 2 of 2")

    assert isinstance(step, Fail) and step.record is None, step
    message = str(step.error)
    assert "left running" in message and "try 2 of 2" in message and "reattaches" in message, message
    if world.name != "kubernetes":  # its broken read stays broken: the pod's phase was overwritten
        gave_up.restore()
        assert poll_one(gave_up.backend, record.handle).state is JobState.RUNNING
    else:
        assert world.emulator.get("pods", world._pod(record.handle)) is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("retries", "try_number", "max_tries", "expected"),
    [
        (0, 1, 0, None),
        (2, 1, 2, "try 2 of 3"),
        (2, 3, 2, None),
        # a cleared task: Airflow raised max_tries, so try 4 has retries again
        (2, 4, 5, "try 5 of 6"),
        # a task instance that does not say (an older runner): retries decides
        (1, 1, None, "try 2 of 2"),
    ],
)
def test_the_operator_reads_whether_a_retry_follows_from_the_task_instance(
    retries: int, try_number: int, max_tries: int | None, expected: str | None
) -> None:
    from gpu_provider.operators import GpuJobOperator

    operator = GpuJobOperator(task_id="t", command=["true"], backend="local", retries=retries)
    ti = types.SimpleNamespace(try_number=try_number, max_tries=max_tries)
    assert operator._next_retry(ti) == expected


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_task_with_retries_0_whose_reads_keep_failing_cancels_its_job_and_says_so(
    harness: Harness, deferrable: bool
) -> None:
    """End to end (the operator in a DAG run, local backend): the promise of a retry is gone. Deferred, the
    trigger gives up and the task, resumed with its poll-error event, decides."""
    release = harness.tmp / "release"
    command = list(py(f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.1)"))
    dag_id = f"give_up_reads_{'deferred' if deferrable else 'sync'}"
    dag = harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command={command!r},
            poll_interval=0.05,
            retries=0,
            deferrable={deferrable},
        )
        """,
    )
    proc, out_file, log_file = harness.start(dag, dag_id)
    backend = LocalBackend(state_dir=str(harness.state_dir))

    def running() -> JobHandle | None:
        jobs = backend.list_jobs()
        return jobs[0] if jobs and poll_one(backend, jobs[0]).state is JobState.RUNNING else None

    handle = wait_for(running, 90, "the task's job to run")
    request = Path(str(handle.extra["job_dir"])) / "request.json"
    saved = request.read_bytes()
    request.write_text("{not json")  # every status read of the job fails from now on
    proc.wait(timeout=120)
    request.write_bytes(saved)
    log = log_file.read_text()
    tasks = json.loads(out_file.read_text())["tasks"]
    assert tasks["job"]["state"] == "failed", log[-4000:]
    assert "No Airflow retry is left to watch the job, so it was cancelled" in log, log[-4000:]
    assert "will reattach" not in log
    assert wait_ended(backend, handle).state is JobState.CANCELLED
