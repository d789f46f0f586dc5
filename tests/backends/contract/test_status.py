"""Contract: submit, poll (one job, many jobs with a bad one among them), lost jobs, spot reclaim, held capacity."""

from __future__ import annotations

import json

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.exceptions import GpuJobStatusError
from tests.backends.contract.worlds import (
    LONG_JOB,
    BackendWorld,
    poll_one,
    py,
    read_until,
    wait_ended,
    wait_state,
    wait_status,
)


def test_submit_returns_a_handle_and_poll_reaches_succeeded_or_failed(world: BackendWorld) -> None:
    backend = world.backend()
    assert backend.poll([]) == {}
    ok_request = world.request("submit_ok", py("print('hello from the contract suite')"))
    bad_request = world.request("submit_bad", py("import sys; print('about to fail'); sys.exit(3)"))
    ok, bad = backend.submit(ok_request), backend.submit(bad_request)

    assert (ok.backend, ok.name, ok.attempt, ok.capacity) == (
        backend.name,
        ok_request.identity.name,
        1,
        names.ON_DEMAND,
    )
    assert ok.job_id != bad.job_id
    # the handle travels to the trigger as JSON and works from another backend object (another process)
    ok = JobHandle.from_dict(json.loads(json.dumps(ok.to_dict())))
    other = world.backend()

    done = wait_ended(other, ok)
    assert done.state is JobState.SUCCEEDED, done
    assert done.exit_code == 0 and done.interruption is None, done
    assert done.started_at is not None and done.ended_at is not None and done.ended_at >= done.started_at, done
    assert done.gpu_seconds > 0, done
    lines = read_until(other, ok, lambda lines: any("hello from the contract suite" in line for line in lines))
    assert sum("hello from the contract suite" in line for line in lines) == 1, lines

    failed = wait_ended(backend, bad)
    assert failed.state is JobState.FAILED, failed
    assert failed.exit_code == 3 and failed.interruption is None, failed


def test_poll_many_answers_every_job_and_one_bad_job_spoils_no_other(world: BackendWorld) -> None:
    backend = world.backend()
    good = py("print('fine')")
    plan = [
        ("many_ok1", good),
        ("many_broken", good),
        ("many_failed", py("import sys; sys.exit(4)")),
        ("many_forgotten", good),
        ("many_ok2", good),
    ]
    handles = {suffix: backend.submit(world.request(suffix, command)) for suffix, command in plan}
    for handle in handles.values():
        wait_ended(backend, handle)

    unknown_state = world.break_state(handles["many_broken"])
    handles["many_forgotten"] = world.forget(handles["many_forgotten"])
    result = world.backend().poll(list(handles.values()))

    assert set(result) == {h.job_id for h in handles.values()}, result
    broken = result[handles["many_broken"].job_id]
    assert isinstance(broken, GpuJobStatusError), broken
    assert unknown_state in str(broken), f"the error should name the state it did not understand: {broken}"
    forgotten = result[handles["many_forgotten"].job_id]
    assert isinstance(forgotten, JobStatus) and forgotten.state.terminal, forgotten
    assert forgotten.interruption == names.LOST, forgotten
    for suffix in ("many_ok1", "many_ok2"):
        status = result[handles[suffix].job_id]
        assert isinstance(status, JobStatus) and status.state is JobState.SUCCEEDED, (suffix, status)
    failed = result[handles["many_failed"].job_id]
    assert isinstance(failed, JobStatus) and failed.state is JobState.FAILED and failed.exit_code == 4, failed


def test_a_job_the_service_forgot_is_lost_and_no_longer_found(world: BackendWorld) -> None:
    backend = world.backend()
    request = world.request("forgotten", py("print('soon forgotten')"))
    handle = backend.submit(request)
    assert wait_ended(backend, handle).state is JobState.SUCCEEDED

    handle = world.forget(handle)
    status = poll_one(world.backend(), handle)
    assert status.state.terminal and status.interruption == names.LOST, status
    assert world.backend().find_existing(request.identity.task) == []


def test_a_reclaimed_spot_job_is_preempted(world: BackendWorld) -> None:
    backend = world.backend()
    handle = backend.submit(world.request("preempted", LONG_JOB, capacity=names.SPOT))
    wait_state(backend, handle, JobState.RUNNING)

    world.preempt(handle)
    status = wait_ended(backend, handle, timeout=15)
    assert status.state is JobState.PREEMPTED or status.interruption == names.PREEMPTED, status
    assert status.state is not JobState.SUCCEEDED, status


def test_a_job_without_capacity_stays_queued_until_capacity_comes(world: BackendWorld) -> None:
    backend = world.backend()
    world.hold_capacity()
    handle = backend.submit(world.request("held", py("print('got capacity')"), capacity=names.SPOT))

    # without the hold both emulators start a job within about 1.5 s: 2.5 s of QUEUED answers is a hold
    seen: list[JobStatus] = []

    def held_long_enough(status: JobStatus) -> bool:
        assert status.state is JobState.QUEUED, f"a job without capacity left the queue: {status}"
        seen.append(status)
        return len(seen) >= 12

    # the reads, not the clock, measure the hold: on a loaded machine twelve reads can take far longer than 2.4 s
    wait_status(backend, handle, held_long_enough, "to stay queued", timeout=90)
    if world.held_reason is not None:
        assert world.held_reason in seen[-1].reason, seen[-1]
    # a job that has not started has no log yet: an empty read, not an error
    assert backend.logs(handle, None, max_bytes=4096).lines == []

    world.release_capacity()
    done = wait_ended(backend, handle)
    assert done.state is JobState.SUCCEEDED, done
