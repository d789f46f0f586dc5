"""``on_kill`` runs in the SIGTERM handler: it must cancel the job without waiting on anything the
interrupted code may hold, and leave alone a job a later try took over."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.operators import GpuJobOperator
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("scripted")


def _killed_try(try_number: int) -> GpuJobOperator:
    op = GpuJobOperator(task_id="job", command=["true"], backend={"name": "scripted"}, deferrable=False)
    op._handle = JobHandle("scripted", "j1", "gp-j1", 1, "on-demand", time.time())
    op._try_number = try_number
    return op


def test_on_kill_cancels_even_when_the_status_read_hangs() -> None:
    """Issue 18.4: the owner check must not block the handler (the interrupted code may hold a pool lock)."""
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING)
    ScriptedBackend.poll_gate = threading.Event()  # never set: every status read hangs
    op = _killed_try(1)
    started = time.monotonic()
    op.on_kill()
    assert time.monotonic() - started < 4, "on_kill must return while Airflow still waits before SIGKILL"
    assert [job for job, _ in ScriptedBackend.cancels] == ["j1"]
    assert "was killed" in ScriptedBackend.cancels[0][1]


def test_on_kill_leaves_a_job_a_later_try_owns() -> None:
    """Issue 18.1: the zombie try's kill must not cancel the job its successor reattached to."""
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING, owner_try=2)
    _killed_try(1).on_kill()
    assert ScriptedBackend.cancels == []
    _killed_try(2).on_kill()
    assert [job for job, _ in ScriptedBackend.cancels] == ["j1"]
