"""Contract: a job found by its id or its name (what ``GpuJobSensor`` waits on), and the task it belongs to."""

from __future__ import annotations

import pytest

from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import BackendWorld, py, wait_ended


def test_lookup_by_id_and_by_name_finds_the_job_and_its_task(world: BackendWorld) -> None:
    request = world.request("lookup", py("print('found me')"), try_number=2, attempt=3)
    submitted = world.backend().submit(request)
    other = world.backend().submit(world.request("lookup_other", py("print('not me')")))

    by_id = world.backend().lookup(job_id=submitted.job_id)
    by_name = world.backend().lookup(name=request.identity.name)
    for found in (by_id, by_name):
        assert found is not None
        assert (found.backend, found.job_id, found.name, found.attempt, found.capacity) == (
            submitted.backend,
            submitted.job_id,
            submitted.name,
            3,
            submitted.capacity,
        ), found
    # a found handle serves every other call of the contract: status, logs, the task it belongs to
    assert by_id is not None and wait_ended(world.backend(), by_id).state is JobState.SUCCEEDED
    assert world.backend().task_of(by_id) == request.identity.task
    assert world.backend().lookup(job_id=other.job_id) is not None
    assert world.backend().task_of(other) != request.identity.task


def test_lookup_of_an_unknown_id_or_name_is_none_and_bad_input_is_refused(world: BackendWorld) -> None:
    world.backend().submit(world.request("lookup_known", py("print('x')")))
    backend = world.backend()
    assert backend.lookup(job_id="00000000-0000-4000-8000-000000000000") is None
    assert backend.lookup(name="gp-no-such-job-t1-a1") is None
    with pytest.raises(ValueError, match="exactly one of job_id= and name="):
        backend.lookup(job_id="a", name="b")
    with pytest.raises(ValueError, match="exactly one of job_id= and name="):
        backend.lookup()
    with pytest.raises(ValueError, match="name=''"):
        backend.lookup(name="")
