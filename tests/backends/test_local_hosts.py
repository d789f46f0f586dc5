"""The local backend on more than one machine: a job records its host; another host reads it only
through a shared state directory, and is refused clearly (the job left alone) without one.

A second machine is simulated by the host name this process reports (``socket.gethostname``) and,
for "not shared", by a state directory of its own.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.backends.local import LocalBackend
from gpu_provider.exceptions import GpuJobElsewhereError
from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.backends.test_local import GRACE, Local, job, wait_for

HERE = socket.gethostname()
OTHER = "triggerer-2.example.internal"
#: a job that runs until the test lets it end (creates the file it waits for)
WAITS = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("released")
"""


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Local]:
    """A local backend on this host; every job it started is killed at the end, pass or fail."""
    harness = Local(LocalBackend(state_dir=str(tmp_path / "state"), grace_period=GRACE, gpus=[]), tmp_path)
    try:
        yield harness
    finally:
        monkeypatch.setattr(socket, "gethostname", lambda: HERE)  # the teardown reads the jobs from their host
        harness.close()


def as_host(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """From here on this process reports ``name`` as its host name."""
    monkeypatch.setattr(socket, "gethostname", lambda: name)


def _running_job(local: Local) -> tuple[JobHandle, Path]:
    release = local.tmp / "release"
    handle = local.submit(job(WAITS, str(release)))
    local.wait(handle, JobState.RUNNING)
    return handle, release


def test_a_job_records_the_host_that_started_it(machine: Local) -> None:
    handle, release = _running_job(machine)
    assert handle.extra["host"] == HERE
    release.touch()
    assert machine.wait(handle).state is JobState.SUCCEEDED


def test_another_host_without_the_state_dir_is_refused_and_the_job_left_alone(
    machine: Local, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle, release = _running_job(machine)
    as_host(monkeypatch, OTHER)
    elsewhere = LocalBackend(state_dir=str(machine.tmp / "other-machine-state"), grace_period=GRACE, gpus=[])
    status = elsewhere.poll([handle])[handle.job_id]
    assert isinstance(status, GpuJobElsewhereError)
    message = str(status)
    assert f"runs on host {HERE!r}, and this process runs on {OTHER!r}" in message
    assert "[gpu_provider] local_state_dir" in message and "deferrable=False" in message and "batch" in message
    with pytest.raises(GpuJobElsewhereError):
        elsewhere.cancel(handle, "from the wrong machine")

    # back on the job's own host: it was neither failed nor stopped, and ends normally
    as_host(monkeypatch, HERE)
    assert machine.poll(handle).state is JobState.RUNNING
    release.touch()
    assert machine.wait(handle).state is JobState.SUCCEEDED


def test_a_shared_state_dir_lets_another_host_read_and_cancel(machine: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    handle, _ = _running_job(machine)
    as_host(monkeypatch, OTHER)
    shared = LocalBackend(state_dir=str(machine.backend.state_dir), grace_period=GRACE, gpus=[])
    status = shared.poll([handle])[handle.job_id]
    assert isinstance(status, JobStatus) and status.state is JobState.RUNNING
    # no signal to a pid of another machine: the cancel goes through the job's folder, and its own
    # supervisor stops it
    shared.cancel(handle, "cancelled from the triggerer's host")
    ended = wait_for("the job cancelled", lambda: _ended(shared, handle), timeout=10)
    assert ended.state is JobState.CANCELLED


def _ended(backend: LocalBackend, handle: JobHandle) -> JobStatus | None:
    status = backend.poll([handle])[handle.job_id]
    assert isinstance(status, JobStatus), status
    return status if status.state.terminal else None


def test_a_deferred_task_whose_trigger_runs_on_another_host_gets_the_reason(
    machine: Local, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The trigger on a triggerer host without the worker's state dir: a poll-error event saying why,
    at once (no retries that cannot help), and the job is not failed."""
    handle, release = _running_job(machine)
    as_host(monkeypatch, OTHER)  # the trigger runs on another machine
    triggerer_backend = LocalBackend(state_dir=str(tmp_path / "triggerer-state"), grace_period=GRACE, gpus=[])
    trigger = GpuJobTrigger(backend=triggerer_backend.spec(), handle=handle.to_dict(), poll_interval=0.2)

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    event = asyncio.run(asyncio.wait_for(first(), 20))
    assert event["status"] == names.EVENT_POLL_ERROR
    assert f"runs on host {HERE!r}" in event["message"] and OTHER in event["message"]

    # the operator turns this event into the task's error (GpuJobPollError with the message); the job
    # itself was neither failed nor stopped
    as_host(monkeypatch, HERE)
    assert machine.poll(handle).state is JobState.RUNNING
    release.touch()
    assert machine.wait(handle).state is JobState.SUCCEEDED
