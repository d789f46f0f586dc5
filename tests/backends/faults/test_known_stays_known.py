"""What is known stays known (issue 24, item 11), on every backend world.

A service forgets ended jobs (Batch's expiry, the local backend's prune, Kubernetes' pod garbage
collection, SageMaker's retention): a later read can only call such a job lost. That read must not
replace the end a task already recorded, and a job that was seen running keeps the GPU time it ran.
"""

from __future__ import annotations

import logging

from gpu_provider import names
from gpu_provider.backends.base import JobState
from gpu_provider.engine.attempts import AttemptEngine, Submit
from gpu_provider.engine.runner import recover
from gpu_provider.engine.watch import AttemptWatch
from gpu_provider.records import AttemptRecord, dump_records, load_records
from gpu_provider.recovery import SpotFallback
from tests.backends.contract.worlds import LONG_JOB, BackendWorld, poll_one, py, wait_ended, wait_state, wait_status

log = logging.getLogger("test-known-stays-known")


def _stored(records: list[AttemptRecord]) -> list[AttemptRecord]:
    """The records as the next try reads them back from the task state store."""
    return load_records(dump_records(records))


def test_collected_history_is_unchanged_after_the_service_forgets_the_job(world: BackendWorld) -> None:
    backend = world.backend()
    request = world.request("history", py("print('done')"))
    handle = backend.submit(request)
    done = wait_ended(backend, handle)
    assert done.state is JobState.SUCCEEDED, done
    record = AttemptRecord.new(handle, try_number=1)
    record.update(done)
    record.collected = True
    before = record.to_dict()

    forgotten = world.forget(handle)
    lost = poll_one(world.backend(), forgotten)
    assert lost.state is JobState.FAILED and lost.interruption == names.LOST, lost

    # a cleared task's next try reads every attempt of the task instance back, and asks the service again
    stored = _stored([record])
    stored[0].handle = forgotten
    (again,) = recover(world.backend(), request.identity.task, stored, log)
    assert again.state is JobState.SUCCEEDED and again.interruption is None, again
    after = again.to_dict()
    for key in ("state", "reason", "started_at", "ended_at", "gpu_seconds", "exit_code", "interruption", "collected"):
        assert after[key] == before[key], (key, after[key], before[key])

    # and a read that only says lost never overwrites a known end, wherever it comes from
    again.update(lost)
    assert (again.state, again.interruption) == (JobState.SUCCEEDED, None)
    assert again.gpu_seconds == before["gpu_seconds"]


def test_a_preempted_attempt_stays_preempted_after_its_job_is_collected_and_the_retry_goes_on_demand(
    world: BackendWorld,
) -> None:
    backend = world.backend()
    request = world.request("preempted_gc", LONG_JOB, capacity=names.SPOT)
    handle = backend.submit(request)
    wait_state(backend, handle, JobState.RUNNING)
    world.preempt(handle)
    preempted = wait_ended(backend, handle)
    assert preempted.state is JobState.PREEMPTED and preempted.interruption == names.PREEMPTED, preempted
    record = AttemptRecord.new(handle, try_number=1)
    record.update(preempted)
    gpu_seconds = record.gpu_seconds

    forgotten = world.forget(handle)  # Kubernetes' pod GC, Batch's expiry, a prune
    stored = _stored([record])
    stored[0].handle = forgotten
    records = recover(world.backend(), request.identity.task, stored, log)  # an Airflow retry (try 2) resumes

    (again,) = records
    assert again.state is JobState.PREEMPTED and again.interruption == names.PREEMPTED, again
    assert again.gpu_seconds == gpu_seconds
    engine = AttemptEngine(SpotFallback(after_preemptions=1, backoff=0), records, try_number=2, backend_name="x")
    step = engine.resume()
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND), step


def test_a_job_lost_after_it_was_seen_running_keeps_its_start_and_gpu_time(world: BackendWorld) -> None:
    backend = world.backend()
    handle = backend.submit(world.request("lost_running", LONG_JOB))
    running = wait_status(backend, handle, lambda s: s.state is JobState.RUNNING and s.gpu_seconds > 0, "to run")
    watch = AttemptWatch(backend, handle, capacity_wait=None, log=log, stream_logs=False)
    assert watch.read(running) is None

    # the job ends and the service forgets it before the wait reads it again
    backend.cancel(handle, "ended while nobody read it")
    wait_ended(world.backend(), handle)
    lost = poll_one(world.backend(), world.forget(handle))
    assert lost.state.terminal and lost.interruption == names.LOST, lost

    final = watch.complete(lost)
    record = AttemptRecord.new(handle, try_number=1)
    record.update(final)
    assert record.started_at is not None, "a job seen running must not read as never started"
    assert record.gpu_seconds >= round(running.gpu_seconds, 3) > 0, (record.gpu_seconds, running.gpu_seconds)
    assert record.interruption == names.LOST
