"""Contract: a service that restarts an interrupted job itself (SageMaker managed spot, Kubernetes Job
retries) reports the restart inside the same attempt, and the job resumes to its end.

Only worlds whose backend declares ``capabilities.restarts_inside_job`` run the restart test: the
test is defined for those worlds alone, so a backend without the capability skips nothing. The
SageMaker backend declares it (managed spot restarts a reclaimed job inside the training job); the
local and Batch backends do not.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import (
    WORLDS,
    BackendWorld,
    marked,
    py,
    read_until,
    wait_ended,
    wait_state,
    wait_status,
    worlds_where,
)

RESTARTING_WORLDS = worlds_where(lambda caps: caps.restarts_inside_job)
RUN_START = re.compile(r"contract-run-start")


def resuming_job(first_run_mark: Path) -> tuple[str, ...]:
    """A job whose first run lasts up to a minute (so a loaded machine still interrupts it while it runs)
    and whose run after a restart takes 3 s; each run prints its start line, then ticks."""
    code = py(
        """
        import os, sys, time
        print('contract-run-start', flush=True)
        first = not os.path.exists(sys.argv[1])
        open(sys.argv[1], 'a').close()
        for i in range(600 if first else 30):
            print('tick', i, flush=True)
            time.sleep(0.1)
        """
    )
    return (*code, str(first_run_mark))


def test_a_world_offers_restart_inside_exactly_when_its_backend_declares_it(world: BackendWorld) -> None:
    declares = world.backend_class().capabilities.restarts_inside_job
    offers = type(world).restart_inside is not BackendWorld.restart_inside
    assert offers == declares, (
        f"{world.name} world: capabilities.restarts_inside_job={declares} but the world "
        f"{'implements' if offers else 'does not implement'} restart_inside()"
    )
    assert (world.name in RESTARTING_WORLDS) == declares
    assert set(WORLDS) >= set(RESTARTING_WORLDS)


if RESTARTING_WORLDS:

    @pytest.mark.parametrize("world", RESTARTING_WORLDS, indirect=True)
    def test_an_interruption_inside_the_job_is_a_restart_not_an_end(world: BackendWorld, tmp_path: Path) -> None:
        backend = world.backend()
        job = resuming_job(tmp_path / "first-run-started")
        handle = backend.submit(world.request("restart", job, capacity=names.SPOT))
        wait_state(backend, handle, JobState.RUNNING)
        # RUNNING is the service's word; interrupt once the program itself has started (else the first
        # run leaves nothing behind, however slowly the machine started it)
        read_until(backend, handle, lambda lines: bool(marked(lines, RUN_START)))

        restarted_at = time.time()
        world.restart_inside(handle)
        during = wait_status(backend, handle, lambda s: s.restarts >= 1, "to report a restart")
        assert during.state.active, f"the service restarts the job: the attempt goes on ({during})"
        if during.state is JobState.QUEUED and during.queued_since is not None:
            # the spot wait counts from the restart, not from the submission
            assert during.queued_since >= restarted_at - 1, during

        done = wait_ended(backend, handle)
        assert done.state is JobState.SUCCEEDED and done.restarts == 1, done
        assert done.interruption is None, done
        lines = read_until(backend, handle, lambda lines: any("tick 29" in line for line in lines))
        starts = marked(lines, RUN_START)
        assert len(starts) == 2, f"the job should have started twice: {len(starts)} starts in its log: {lines[:40]}"
