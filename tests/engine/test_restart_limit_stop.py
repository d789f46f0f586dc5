"""The stop of an attempt at its restart limit (SageMaker managed spot restarting a reclaimed job inside its attempt)
is the mechanism of a move back to spot: written on the record before it is sent, then the normal wait (the worker's,
or the trigger's) waits for the job's end, and only then does the capacity policy's next attempt go. The worker is
not blocked inside ``after_wait``, nothing fires the restart limit again for that attempt, and a try that reads the
record after a crash waits for the end instead of stopping the job again.

On the SageMaker emulator: its hosts are processes, and the stopped job's program decides when it ends after
SIGTERM (it holds until the test releases it, as a job writing its last checkpoint does), so "still stopping" is a
state the test controls, not a race."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import SpotFallback, names
from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus
from gpu_provider.engine.attempts import AttemptEngine, Submit, Wait
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.engine.watch import ENDED, RESTART_LIMIT
from gpu_provider.operators._deferral import job_trigger, outcome_of
from gpu_provider.operators._plan import Plan
from gpu_provider.records import AttemptRecord
from tests.backends.contract.worlds import SageMakerBackendWorld, poll_one, read_until
from tests.harness import wait_for
from tests.sagemaker_world import SageMakerWorld

#: the emulator's SIGTERM-to-SIGKILL grace in these tests: longer than any wait here, so the job's program alone
#: decides when a stop ends (the test's release)
HELD_GRACE_S = 120.0
POLL_S = 0.2
LABEL = "Airflow task d.t of run r"


class Lines(logging.Handler):
    """The messages a logger got."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def held(sagemaker: SageMakerWorld, tmp_path: Path) -> Iterator[Path]:
    """The release file of a held stop (see the module doc); released and the grace restored at teardown."""
    emulator = sagemaker.emulator
    grace = emulator.grace_period
    emulator.grace_period = HELD_GRACE_S
    release = tmp_path / "release"
    try:
        yield release
    finally:
        release.touch()
        emulator.grace_period = grace


#: a long job that counts its runs and says each; asked to stop in its second run (after the service restarted it),
#: it holds until the release file exists (at most 60 s), then exits, as a program saving its checkpoint does
HELD_JOB = """
import os, signal, sys, time
runs, release = sys.argv[1], sys.argv[2]
with open(runs, 'a') as f:
    f.write('run\\n')
with open(runs) as f:
    n = len(f.read().split())
def on_term(signum, frame):
    print(f'run {n} asked to stop', flush=True)
    until = time.monotonic() + 60
    while n > 1 and not os.path.exists(release) and time.monotonic() < until:
        time.sleep(0.05)
    print(f'run {n} stopped', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print(f'run-start {n}', flush=True)
for i in range(600):
    print(f'run {n} tick {i}', flush=True)
    time.sleep(0.1)
"""


def held_job(tmp_path: Path, release: Path) -> tuple[str, ...]:
    """The command of :data:`HELD_JOB` (a script file: SageMaker takes 256 characters per argument)."""
    script = tmp_path / "held_job.py"
    script.write_text(HELD_JOB)
    return (sys.executable, str(script), str(tmp_path / "runs"), str(release))


def _runner(
    backend: Backend, records: list[AttemptRecord], try_number: int, saved: list[Any], log: Any
) -> AttemptRunner:
    """A runner on the SageMaker backend whose persist keeps a copy of each save in ``saved``."""
    engine = AttemptEngine(
        SpotFallback(after_preemptions=1, backoff=0), records, try_number=try_number, backend_name="sagemaker"
    )
    return AttemptRunner(
        backend,
        engine,
        log=log,
        label=f"{LABEL} (try {try_number})",
        stop=threading.Event(),
        persist=lambda records: saved.append([r.to_dict() for r in records]),
        cancel_retry_s=0.0,
    )


def _restarted_spot_job(world: SageMakerBackendWorld, backend: Backend, tmp_path: Path, release: Path) -> JobHandle:
    """A spot job the service has restarted once inside its attempt, running its second run now."""
    handle = backend.submit(world.request("rlimit", held_job(tmp_path, release), capacity=names.SPOT))
    read_until(backend, handle, lambda lines: any("run-start 1" in line for line in lines), timeout=60)
    world.restart_inside(handle)
    read_until(backend, handle, lambda lines: any("run 2 tick 0" in line for line in lines), timeout=60)
    return handle


def _stop_at_limit(runner: AttemptRunner, record: AttemptRecord, saved: list[Any], sagemaker: SageMakerWorld) -> None:
    """The sync wait sees the restart limit; ``after_wait`` sends the stop and returns a Wait at once."""
    status, outcome = runner.wait(record, POLL_S)
    assert (outcome, status.restarts) == (RESTART_LIMIT, 1), (outcome, status)
    stops_before = len(sagemaker.bodies("StopTrainingJob"))
    step = runner.after_wait(record, status, outcome)
    assert step == Wait(record), f"after_wait must not wait for the stopped job itself: {step}"
    assert poll_one(runner.backend, record.handle).state.active, "the job holds its stop until the test releases it"
    assert (record.interruption, record.state, record.restarts) == (names.PREEMPTED, JobState.RUNNING, 1), record
    # the stop was written on the record before it was sent: a crash right after the stop still knows
    assert stops_before == 0 and len(sagemaker.bodies("StopTrainingJob")) == 1
    marked = [s for s in saved if s[-1]["interruption"] == names.PREEMPTED]
    assert marked and marked[0][-1]["state"] == JobState.RUNNING.value, saved


def test_the_sync_wait_is_not_blocked_by_a_restart_limit_stop_and_the_next_attempt_follows_its_end(
    sagemaker: SageMakerWorld, held: Path, tmp_path: Path
) -> None:
    world = SageMakerBackendWorld(sagemaker)
    backend = world.backend()
    handle = _restarted_spot_job(world, backend, tmp_path, held)
    log, lines = logging.getLogger("test-restart-limit-sync"), Lines()
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    record = AttemptRecord.new(handle, try_number=1)
    saved: list[Any] = []
    runner = _runner(backend, [record], 1, saved, log)
    try:
        _stop_at_limit(runner, record, saved, sagemaker)
        assert runner.restart_limit(record) is None, "a stop already sent: its wait does not fire the limit again"

        # the wait goes on while the job stops: its samples still say restarts=1, and the job ends only once the
        # wait has read it stopping (the test releases it from the wait's first sample)
        stopping: list[JobStatus] = []

        def sample(status: JobStatus) -> None:
            if status.state.active:
                stopping.append(status)
                held.touch()

        runner.on_status = sample
        status, outcome = runner.wait(record, POLL_S)
        assert outcome == ENDED and status.state is JobState.CANCELLED, (outcome, status)
        assert stopping and all(s.restarts == 1 for s in stopping), stopping
        step = runner.after_wait(record, status, outcome)
        assert step == Submit(attempt=2, capacity=names.ON_DEMAND), step
    finally:
        runner.close()
        log.removeHandler(lines)
    assert (record.state, record.interruption, record.restarts) == (JobState.CANCELLED, names.PREEMPTED, 1), record
    assert record.reason.startswith(names.RESTART_LIMIT_MARK), record.reason
    assert record.ended_at is not None and record.billable_seconds is not None, record
    assert len(runner.engine.interruptions()) == 1, "the stop is the restart the policy counted, not a second one"
    (stop,) = sagemaker.bodies("StopTrainingJob")
    assert stop == {"TrainingJobName": handle.job_id}
    # the wait after the stop went on reading the same log: no line of the job was copied twice
    assert lines.messages.count("[job] [algo-1] run 1 tick 0") == 1, [m for m in lines.messages if "tick 0" in m]
    assert lines.messages.count("[job] [algo-1] run 2 stopped") == 1, lines.messages[-20:]


def test_a_try_that_reads_the_record_after_a_crash_waits_for_the_stopped_job_in_the_trigger_then_runs_the_next(
    sagemaker: SageMakerWorld, held: Path, tmp_path: Path
) -> None:
    """Try 1 stops the attempt at its restart limit, and its worker dies right after. Try 2 reads the record from
    the task state store: it reattaches, defers, and its trigger waits for the stopped job's end (no second
    ``restart_limit``, no second stop); then the policy's next attempt follows."""
    world = SageMakerBackendWorld(sagemaker)
    backend = world.backend()
    handle = _restarted_spot_job(world, backend, tmp_path, held)
    log = logging.getLogger("test-restart-limit-crash")
    record = AttemptRecord.new(handle, try_number=1)
    saved: list[Any] = []
    first = _runner(backend, [record], 1, saved, log)
    try:
        _stop_at_limit(first, record, saved, sagemaker)
    finally:
        first.close()  # the worker is gone: only what it saved is left

    records = [AttemptRecord.from_dict(data) for data in saved[-1]]
    second = _runner(backend, records, 2, [], log)
    step = second.engine.resume()
    assert step == Wait(records[0]), step
    resumed = step.record
    second.take_over(resumed)
    assert second.restart_limit(resumed) is None
    plan = Plan(
        backend=backend,
        command=[],
        env={},
        image=None,
        checkpoint_uri=None,
        max_runtime_s=None,
        poll_interval=POLL_S,
        try_number=2,
    )
    trigger, _ = job_trigger(plan, second, resumed, None, task_label=LABEL, spend=None)
    assert trigger.restart_limit is None, trigger.serialize()

    events: list[Any] = []

    def run_trigger() -> None:
        async def first_event() -> dict[str, Any]:
            async for event in trigger.run():
                return dict(event.payload)
            raise AssertionError("the trigger ended without an event")

        try:
            events.append(asyncio.run(asyncio.wait_for(first_event(), 90)))
        except BaseException as err:  # the test thread reports it
            events.append(err)

    def reads() -> int:
        return sum(sagemaker.emulator.count(action) for action in ("DescribeTrainingJob", "ListTrainingJobs"))

    before = reads()
    waiting = threading.Thread(target=run_trigger, daemon=True)
    waiting.start()
    try:
        # the trigger reads the job while it stops (restarts=1, still in progress) and goes on waiting
        wait_for(lambda: events or reads() >= before + 3, 60, "the trigger to read the stopping job")
        assert not events, f"the trigger fired for a job whose stop was already sent: {events}"
    finally:
        held.touch()
        waiting.join(90)
    (event,) = events
    assert isinstance(event, dict) and event["status"] == names.EVENT_CANCELLED, event
    status = JobStatus.from_dict(event["job_status"])
    step = second.after_wait(resumed, status, outcome_of(event))
    second.close()
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND), step
    assert (resumed.state, resumed.interruption, resumed.restarts) == (JobState.CANCELLED, names.PREEMPTED, 1)
    assert resumed.reason.startswith(names.RESTART_LIMIT_MARK), resumed.reason
    assert len(second.engine.interruptions()) == 1
    assert sagemaker.bodies("StopTrainingJob") == [{"TrainingJobName": handle.job_id}], "one stop, by try 1 only"


def test_a_stop_that_cannot_be_sent_is_unwritten_and_the_next_wait_tries_it_again(
    sagemaker: SageMakerWorld, held: Path, tmp_path: Path
) -> None:
    """The service does not take the stop (its answers are lost): the record no longer says a stop was sent, the
    wait looks again, fires the restart limit again, and that stop goes through."""
    world = SageMakerBackendWorld(sagemaker)
    backend = world.backend()
    handle = _restarted_spot_job(world, backend, tmp_path, held)
    record = AttemptRecord.new(handle, try_number=1)
    saved: list[Any] = []
    runner = _runner(backend, [record], 1, saved, logging.getLogger("test-restart-limit-retry"))
    try:
        status, outcome = runner.wait(record, POLL_S)
        assert outcome == RESTART_LIMIT, (outcome, status)
        sagemaker.emulator.lose_response("AddTags", 20)  # the stop's reason tag comes first: every answer lost
        try:
            step = runner.after_wait(record, status, outcome)
        finally:
            sagemaker.emulator.reset_faults()
        assert step == Wait(record), step
        assert record.interruption is None and runner.restart_limit(record) == 1, record
        assert sagemaker.bodies("StopTrainingJob") == []
        assert [s[-1]["interruption"] for s in saved] == [names.PREEMPTED, None], "written before, unwritten after"

        status, outcome = runner.wait(record, POLL_S)
        assert outcome == RESTART_LIMIT, (outcome, status)
        assert runner.after_wait(record, status, outcome) == Wait(record)
        assert record.interruption == names.PREEMPTED and len(sagemaker.bodies("StopTrainingJob")) == 1
        held.touch()
        status, outcome = runner.wait(record, POLL_S)
        assert outcome == ENDED, (outcome, status)
        assert runner.after_wait(record, status, outcome) == Submit(attempt=2, capacity=names.ON_DEMAND)
    finally:
        runner.close()
    assert (record.state, record.interruption) == (JobState.CANCELLED, names.PREEMPTED), record
