"""A move back to spot is destructive (it stops a running attempt): only the try that owns the attempt, read from
the service at that moment, makes it, and only while the attempt runs. A zombie try stands down and leaves the
job alone. Against the real local backend (its jobs are processes; its owner mark and stop files are real)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import SpotFallback, SpotReturn, names
from gpu_provider.backends.base import JobState
from gpu_provider.backends.local import common as local_common
from gpu_provider.engine.attempts import AttemptEngine, Submit, Succeed, Wait
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.engine.watch import ENDED, SPOT_RETURNED
from gpu_provider.exceptions import GpuJobCancelledError
from gpu_provider.records import AttemptRecord
from tests.backends.contract.worlds import LONG_JOB, LocalBackendWorld, poll_one, wait_ended, wait_state

log = logging.getLogger("test-spot-return")
DECISION = {"score": 9, "saving_usd": 3.5, "summary": "spot placement score 9 in us-east-1 (>= 7)"}


@pytest.fixture
def world(tmp_path: Path) -> Any:
    built = LocalBackendWorld(tmp_path)
    try:
        yield built
    finally:
        built.cleanup()


def _runner(world: LocalBackendWorld, record: AttemptRecord, try_number: int) -> AttemptRunner:
    policy = SpotFallback(backoff=0, spot_return=SpotReturn(check_every=1, instance_types=["p4d.24xlarge"]))
    engine = AttemptEngine(policy, [record], try_number=try_number, backend_name="local")
    runner = AttemptRunner(
        world.backend(),
        engine,
        log=log,
        label=f"Airflow task d.t of run r (try {try_number})",
        stop=threading.Event(),
        persist=lambda records: None,
        cancel_retry_s=0.0,
    )
    runner.spot_decision = dict(DECISION)
    return runner


def test_a_zombie_try_never_moves_an_attempt_a_later_try_owns_and_the_owner_does(world: LocalBackendWorld) -> None:
    backend = world.backend()
    handle = backend.submit(world.request("zombie", LONG_JOB, capacity=names.ON_DEMAND, try_number=1))
    running = wait_state(backend, handle, JobState.RUNNING)
    backend.mark(handle, owner_try=2)  # Airflow replaced try 1; try 2 reattached and took the attempt over
    stale = AttemptRecord.new(handle, try_number=1)  # what the zombie try 1 still believes
    stale.update(running)
    stale.owner_try = 1

    with pytest.raises(GpuJobCancelledError, match="owned by Airflow try 2, which took it over; this try \\(1\\)"):
        _runner(world, stale, 1).after_wait(stale, running, SPOT_RETURNED)
    assert stale.interruption is None and stale.spot_return is None
    job_dir = Path(handle.extra.get("job_dir") or world.state_dir / local_common.JOBS_DIR / handle.job_id)
    assert not (job_dir / local_common.CANCEL_FILE).exists(), "the zombie asked the job to stop"
    assert poll_one(backend, handle).state is JobState.RUNNING

    # the owner (try 2) moves it: the stop goes through the backend, and the attempt is a planned move
    owned = AttemptRecord.new(handle, try_number=2)
    owned.update(running)
    owner = _runner(world, owned, 2)
    assert owner.after_wait(owned, running, SPOT_RETURNED) == Wait(owned), "it waits for the job's checkpoint"
    assert (owned.interruption, owned.spot_return) == (names.MOVED_TO_SPOT, DECISION)
    reason = (job_dir / local_common.CANCEL_FILE).read_text()
    assert names.SPOT_RETURN_MARK + "spot placement score 9" in reason
    ended = wait_ended(backend, handle)
    step = owner.after_wait(owned, ended, ENDED)
    assert step == Submit(attempt=2, capacity=names.SPOT), step
    assert owned.interruption == names.MOVED_TO_SPOT, "the stop it asked for stays a planned move"
    assert owner.engine.interruptions() == []


def test_no_move_of_an_attempt_that_is_not_running_now(world: LocalBackendWorld) -> None:
    """The reading said move, but a fresh read says the attempt already ended: nothing is stopped."""
    backend = world.backend()
    handle = backend.submit(world.request("ended", ("true",), capacity=names.ON_DEMAND, try_number=1))
    ended = wait_ended(backend, handle)
    record = AttemptRecord.new(handle, try_number=1)
    runner = _runner(world, record, 1)
    step = runner.after_wait(record, ended, SPOT_RETURNED)
    assert record.interruption is None and record.state is ended.state
    assert step == Succeed(record), "the attempt that ended is collected, not moved"
    job_dir = Path(handle.extra.get("job_dir") or world.state_dir / local_common.JOBS_DIR / handle.job_id)
    assert not (job_dir / local_common.CANCEL_FILE).exists()
