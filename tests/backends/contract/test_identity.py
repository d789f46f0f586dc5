"""Contract: attempts found by identity, submit as create-or-adopt, marks on the job read back by poll."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpu_provider.backends.base import JobState, TaskKey
from gpu_provider.backends.contract.jobs import ADOPTED
from tests.backends.contract.worlds import LONG_JOB, WAIT_S, BackendWorld, poll_one, py, wait_ended, wait_state


def test_find_existing_lists_the_attempts_of_exactly_this_task_oldest_first(world: BackendWorld) -> None:
    backend = world.backend()
    task = world.task("find_same_prefix_a")
    # the same first 14 characters of the dag id (names keep only those), the same task and run id
    neighbour = TaskKey("contract_find_same_prefix_b", task.task_id, task.run_id)
    mapped = replace(task, map_index=0)  # a mapped sibling: its names extend this task's prefix
    assert neighbour.prefix.rsplit("-", 1)[0] == task.prefix.rsplit("-", 1)[0]  # only the run hash differs
    assert mapped.prefix.startswith(task.prefix + "-")
    command = py("print('attempt')")

    # attempt numbers grow across tries, so submission order is attempt order
    mine = [
        backend.submit(world.request("", command, task=task, try_number=try_number, attempt=attempt))
        for try_number, attempt in ((1, 1), (1, 2), (2, 3))
    ]
    others = [
        backend.submit(world.request("", command, task=neighbour)),
        backend.submit(world.request("", command, task=mapped)),
    ]

    found = world.backend().find_existing(task)
    assert [h.job_id for h in found] == [h.job_id for h in mine], (found, mine)
    assert [(h.name, h.attempt, h.capacity) for h in found] == [(h.name, h.attempt, h.capacity) for h in mine]
    assert [h.job_id for h in world.backend().find_existing(neighbour)] == [others[0].job_id]
    assert [h.job_id for h in world.backend().find_existing(mapped)] == [others[1].job_id]
    # a found handle is as good as the one submit returned
    assert wait_ended(backend, found[-1]).state is JobState.SUCCEEDED


def test_submitting_the_same_attempt_twice_adopts_the_first_job(world: BackendWorld) -> None:
    request = world.request("adopt", LONG_JOB)
    first = world.backend().submit(request)
    # a retried submit whose answer was lost, from the same process and from another one
    again = world.backend().submit(request)
    elsewhere = world.backend().submit(request)

    assert again.job_id == first.job_id and elsewhere.job_id == first.job_id, (first, again, elsewhere)
    # a submit that found the attempt there already says so (the operator logs the reattach), and only that one
    assert [h.take_adopted()[1] for h in (first, again, elsewhere)] == [False, True, True]
    assert again.take_adopted()[0].extra == {k: v for k, v in again.extra.items() if k != ADOPTED}
    found = world.backend().find_existing(request.identity.task)
    assert [h.job_id for h in found] == [first.job_id], found


def test_marks_on_the_job_come_back_in_its_status(world: BackendWorld, tmp_path: Path) -> None:
    backend = world.backend()
    release = tmp_path / "release"  # the job runs until the test has marked it (a failed test: 4 x WAIT_S)
    job = py(
        f"""
        import os, time
        deadline = time.monotonic() + {4 * WAIT_S}
        while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
        print('done')
        """
    )
    request = world.request("marks", job)
    handle = backend.submit(request)
    before = wait_state(backend, handle, JobState.RUNNING, JobState.STARTING)
    assert before.collected is False and before.owner_try in (None, 1), before

    backend.mark(handle, owner_try=2)  # a later try took the running job over
    taken = poll_one(world.backend(), handle)
    assert taken.owner_try == 2 and taken.collected is False, taken
    assert taken.state.active, taken  # marked while it ran

    release.touch()
    assert wait_ended(backend, handle).state is JobState.SUCCEEDED
    world.backend().mark(handle, collected=True)  # that try read the result
    collected = poll_one(world.backend(), handle)
    assert collected.collected is True and collected.owner_try == 2, collected
    assert collected.state is JobState.SUCCEEDED, collected
