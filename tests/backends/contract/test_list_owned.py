"""Contract: ``list_owned`` reports every active job this provider started, with its task, try and team,
and none that ended (what the reaper and the spend report read)."""

from __future__ import annotations

from dataclasses import replace

from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import LONG_JOB, BackendWorld, py, wait_ended, wait_state


def test_list_owned_reports_active_jobs_with_their_task_and_not_ended_ones(world: BackendWorld) -> None:
    backend = world.backend()
    request = world.request("owned", LONG_JOB, try_number=2, attempt=3)
    request = replace(
        request,
        identity=replace(request.identity, team="vision"),
        max_runtime_s=600.0,
    )
    running = backend.submit(request)
    done = backend.submit(world.request("owned_done", py("print('quick')")))
    wait_state(backend, running, JobState.RUNNING)
    wait_ended(backend, done)

    owned = {o.handle.job_id: o for o in world.backend().list_owned()}  # another process sees the same
    assert running.job_id in owned, sorted(owned)
    assert done.job_id not in owned, owned[done.job_id]
    mine = owned[running.job_id]
    assert mine.task == request.identity.task
    assert (mine.try_number, mine.team, mine.nodes, mine.gpus) == (2, "vision", 1, 1.0), mine
    assert mine.state is JobState.RUNNING and mine.state.active
    assert mine.handle.name == request.identity.name and mine.handle.attempt == 3
    assert mine.started_at is not None and mine.started_at >= running.submitted_at - 5
    assert mine.max_runtime_s == 600.0

    backend.cancel(running, "contract test: list_owned after cancel")
    wait_ended(backend, running)
    assert running.job_id not in {o.handle.job_id for o in backend.list_owned()}


def test_list_owned_reports_queued_jobs_and_the_owner_try_mark(world: BackendWorld) -> None:
    backend = world.backend()
    world.hold_capacity()
    queued = backend.submit(world.request("owned_queued", py("print('held')")))
    wait_state(backend, queued, JobState.QUEUED)
    backend.mark(queued, owner_try=4)  # a later try took the job over: it owns it now
    (found,) = [o for o in backend.list_owned() if o.handle.job_id == queued.job_id]
    assert found.state is JobState.QUEUED and found.try_number == 4, found
    assert found.started_at is None
