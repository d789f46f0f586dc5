"""Contract: cancel in every state; a cancel that gave up waiting for capacity is a capacity timeout."""

from __future__ import annotations

from gpu_provider import names
from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import LONG_JOB, BackendWorld, poll_one, py, wait_ended, wait_state


def test_cancel_a_queued_job_and_one_that_waited_too_long_for_capacity(world: BackendWorld) -> None:
    backend = world.backend()
    world.hold_capacity()
    plain = backend.submit(world.request("cancel_queued", py("print('never runs')"), capacity=names.SPOT))
    waited = backend.submit(world.request("cancel_capacity", py("print('never runs')"), capacity=names.SPOT))
    wait_state(backend, plain, JobState.QUEUED)
    wait_state(backend, waited, JobState.QUEUED)

    backend.cancel(plain, "cleared by a person in the UI")
    backend.cancel(waited, names.CAPACITY_TIMEOUT_MARK + "no spot capacity for 2s; trying on-demand")
    world.release_capacity()  # a cancelled job must not start once capacity comes

    cancelled = wait_ended(backend, plain)
    assert cancelled.state is JobState.CANCELLED and cancelled.interruption is None, cancelled
    timed_out = wait_ended(backend, waited)
    assert timed_out.state is JobState.CANCELLED, timed_out
    assert timed_out.interruption == names.CAPACITY_TIMEOUT, timed_out
    # another process reads the same classification from the service, not from memory
    assert poll_one(world.backend(), waited).interruption == names.CAPACITY_TIMEOUT
    assert cancelled.started_at is None and cancelled.gpu_seconds == 0, cancelled


def test_cancel_a_running_job(world: BackendWorld) -> None:
    backend = world.backend()
    handle = backend.submit(world.request("cancel_running", LONG_JOB))
    wait_state(backend, handle, JobState.RUNNING)

    backend.cancel(handle, "the task was killed")
    backend.cancel(handle, "a second cancel of the same job")  # idempotent: no error
    status = wait_ended(backend, handle, timeout=15)
    assert status.state is JobState.CANCELLED and status.interruption is None, status


def test_cancel_an_ended_job_changes_nothing(world: BackendWorld) -> None:
    backend = world.backend()
    ok = backend.submit(world.request("cancel_ended_ok", py("print('done')")))
    bad = backend.submit(world.request("cancel_ended_bad", py("import sys; sys.exit(5)")))
    assert wait_ended(backend, ok).state is JobState.SUCCEEDED
    assert wait_ended(backend, bad).state is JobState.FAILED

    backend.cancel(ok, "too late")
    backend.cancel(bad, "too late")
    after = world.backend().poll([ok, bad])
    assert after[ok.job_id].state is JobState.SUCCEEDED, after  # type: ignore[union-attr]
    assert after[bad.job_id].state is JobState.FAILED, after  # type: ignore[union-attr]
    assert after[bad.job_id].exit_code == 5, after  # type: ignore[union-attr]
