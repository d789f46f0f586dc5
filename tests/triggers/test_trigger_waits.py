"""The trigger's wait rules against a scripted backend: per-job errors stay with their job, deadlines
and queue limits fire, and the spot wait counts time waiting for capacity, not time since submission.

The scripted backend is a test double of a *service* (it implements the contract with an in-memory
table), so these tests exercise the real trigger, shared poller and watch.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.exceptions import GpuJobStatusError
from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("scripted")  # every test here talks to the scripted backend


def _handle(job_id: str, capacity: str = "on-demand", submitted_at: float | None = None) -> JobHandle:
    return JobHandle("scripted", job_id, f"gp-{job_id}", 1, capacity, submitted_at or time.time())


def _trigger(handle: JobHandle, **kwargs: Any) -> GpuJobTrigger:
    return GpuJobTrigger(backend={"name": "scripted"}, handle=handle.to_dict(), poll_interval=0.02, **kwargs)


async def _first(trigger: GpuJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("no event")


def _run(*triggers: GpuJobTrigger, timeout: float = 20) -> list[dict[str, Any]]:
    async def all_of() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(_first(t) for t in triggers)))

    return asyncio.run(asyncio.wait_for(all_of(), timeout))


def test_one_bad_job_does_not_fail_the_other_deferred_tasks_of_its_backend() -> None:
    """Defect 5: an unknown state for one job used to fail the whole poll and every subscriber."""
    good = [_handle(f"good-{i}") for i in range(3)]
    bad = _handle("bad")
    for handle in good:
        ScriptedBackend.table[handle.job_id] = JobStatus(state=JobState.SUCCEEDED)
    ScriptedBackend.table[bad.job_id] = GpuJobStatusError("scripted backend: unknown remote job state 'WEIRD'")
    events = _run(*(_trigger(h) for h in [*good, bad]))
    assert [e["status"] for e in events[:3]] == ["succeeded"] * 3
    assert events[3]["status"] == "poll_error"
    assert "unknown remote job state 'WEIRD'" in events[3]["message"]
    assert max(ScriptedBackend.polls) == 4, "the four jobs shared one poll call"


def test_a_deferred_task_honours_its_execution_timeout() -> None:
    """Defect 7: a job that never ends fires a deadline event at the task's deadline."""
    handle = _handle("slow")
    ScriptedBackend.table[handle.job_id] = JobStatus(state=JobState.RUNNING)
    started = time.monotonic()
    (event,) = _run(_trigger(handle, deadline=time.time() + 0.5))
    assert event["status"] == "deadline"
    assert 0.4 < time.monotonic() - started < 10
    assert "execution_timeout" in event["message"]


def test_the_deadline_fires_even_when_the_status_cannot_be_read() -> None:
    handle = _handle("unreadable")
    ScriptedBackend.table[handle.job_id] = GpuJobStatusError("no answer for this job")
    (event,) = _run(_trigger(handle, deadline=time.time() + 0.2))
    assert event["status"] == "deadline"


def test_an_on_demand_attempt_queued_past_its_queue_timeout_fires_queue_timeout() -> None:
    """Issue 18.5: on-demand attempts get an optional queue deadline too."""
    handle = _handle("queued")
    ScriptedBackend.table[handle.job_id] = JobStatus(
        state=JobState.QUEUED, reason="CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
    )
    (event,) = _run(_trigger(handle, queue_timeout=0.3))
    assert event["status"] == "queue_timeout"
    assert event["job_status"]["reason"] == "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"


def test_the_spot_wait_counts_time_waiting_for_capacity_not_time_since_submission() -> None:
    """Issue 15: a job re-queued by a restart inside the job hours after submission is not timed out at once."""
    handle = _handle("restarted", capacity="spot", submitted_at=time.time() - 3 * 3600)
    ScriptedBackend.table[handle.job_id] = JobStatus(state=JobState.QUEUED, queued_since=time.time(), restarts=1)

    async def scenario() -> dict[str, Any]:
        task = asyncio.ensure_future(_first(_trigger(handle, spot_wait_timeout=1.0)))
        await asyncio.sleep(0.5)
        assert not task.done(), "fired before the job had waited spot_wait_timeout for capacity"
        return await asyncio.wait_for(task, 10)

    event = asyncio.run(scenario())
    assert event["status"] == "capacity_timeout"
    assert event["job_status"]["restarts"] == 1


def test_an_ended_job_is_not_polled_again_while_its_triggers_read_the_end() -> None:
    """A job's end is final: while its trigger is still reading the end (its logs, on a loaded triggerer)
    the shared poller asks the service only about the jobs still running, and a trigger subscribing
    to the ended job later gets the end at once, without a call (a CI run saw a tick with half the ended jobs)."""
    from gpu_provider.backends.base import resolve_backend
    from gpu_provider.triggers.gpu_job import SharedPoller

    done, running = _handle("done"), _handle("running")
    ScriptedBackend.table[done.job_id] = JobStatus(state=JobState.SUCCEEDED)
    ScriptedBackend.table[running.job_id] = JobStatus(state=JobState.RUNNING)

    async def scenario() -> None:
        poller = SharedPoller.for_backend(resolve_backend({"name": "scripted"}), 0.02)
        reading = poller.subscribe(done)  # never leaves until the end of the scenario
        other = poller.subscribe(running)
        first = await reading.get()
        assert isinstance(first, JobStatus) and first.state is JobState.SUCCEEDED
        while len(ScriptedBackend.polls) < 4:
            await asyncio.sleep(0.01)
        late = poller.subscribe(done)
        polls_before = len(ScriptedBackend.polls)
        again = late.get_nowait()
        assert isinstance(again, JobStatus) and again.state is JobState.SUCCEEDED
        assert len(ScriptedBackend.polls) == polls_before, "the late subscriber's end came without a call"
        for handle, queue in [(done, reading), (done, late), (running, other)]:
            poller.unsubscribe(handle, queue)

    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert ScriptedBackend.polls[0] == 2
    assert set(ScriptedBackend.polls[1:]) == {1}, ScriptedBackend.polls
