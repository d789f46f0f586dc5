"""A planned stop (a restart limit's, a move back to spot's) survives the death of the process that planned it.

The stop is written on the attempt's record before it is sent. Here the task process dies right after that write
(the records' save raises :class:`Crash`: what was saved is all a new try finds, and the stop is never sent), then
a new try reads the saved records, reattaches and resumes the wait, as ``execute()`` of an Airflow retry does:

- the restart limit still holds: the stop is sent again (once in all), confirmed by a fresh read, and the policy's
  next attempt follows the job's end; when the resend cannot go through either, the restart limit fires again;
- a move back to spot is sent again, and the next attempt runs on spot; but a job that fails on its own after the
  crash, before any stop was sent, has failed: it is not taken for the move and resubmitted on spot.

On every world that can hold each case: the restart limit where the backend restarts jobs inside an attempt
(SageMaker managed spot), the move on every world the operator suite moves back to spot on
(``tests/operators/suite/test_spot_return.py``).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import SpotFallback, SpotReturn, names
from gpu_provider.backends.base import JobHandle, JobRequest, JobState
from gpu_provider.capacity import CapacityPolicy
from gpu_provider.engine.attempts import AttemptEngine, Fail, Submit, Wait
from gpu_provider.engine.runner import AttemptRunner, recover
from gpu_provider.engine.watch import ENDED, RESTART_LIMIT, SPOT_RETURNED
from gpu_provider.exceptions import GpuJobFailedError
from gpu_provider.operators._deferral import job_trigger
from gpu_provider.operators._plan import Plan
from gpu_provider.records import AttemptRecord
from tests.backends.contract.worlds import poll_one, read_until, wait_ended, wait_state, wait_status
from tests.operators.suite.worlds import (  # noqa: F401 (operator_world: fixture "world")
    OPERATOR_WORLDS,
    LocalOperatorWorld,
    OperatorWorld,
    operator_world,
    strip_cancel_prefix,
)

POLL_S = 0.2
LABEL = "Airflow task d.t of run r"
log = logging.getLogger("test-planned-stops")
DECISION = {"score": 9, "saving_usd": 3.5, "summary": "spot placement score 9 in us-east-1 (>= 7)"}
RESTART_POLICY = SpotFallback(after_preemptions=1, backoff=0)  # one restart inside the attempt is the limit
#: on-demand first (no interruption yet), and back to spot when spot returns
MOVE_POLICY = SpotFallback(
    after_preemptions=0, backoff=0, spot_return=SpotReturn(check_every=1, instance_types=["p4d.24xlarge"])
)
RESTARTING_WORLDS = [n for n, w in OPERATOR_WORLDS.items() if w.backend_class().capabilities.restarts_inside_job]

#: a job that says each start, stops at once when asked (as a program whose last checkpoint is quick), and fails on
#: its own (exit 3) once the file named by its argument exists
JOB = """
import os, signal, sys, time
fail = sys.argv[1]
def on_term(signum, frame):
    print('asked to stop', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('job-start', flush=True)
for i in range(3000):
    if os.path.exists(fail):
        print('failing on its own', flush=True)
        sys.exit(3)
    time.sleep(0.1)
"""


class Crash(BaseException):
    """The task process dies here: right after the records were saved, before anything else runs."""


def _job(tmp_path: Path) -> tuple[str, ...]:
    script = tmp_path / "planned_stop_job.py"  # a file: SageMaker takes 256 characters per argument
    script.write_text(JOB)
    return (sys.executable, str(script), str(tmp_path / "fail-now"))


def _crash_at_the_planned_stop(saved: list[list[dict[str, Any]]]) -> Callable[[list[AttemptRecord]], None]:
    """A save that keeps a copy, and dies once it has written a stop planned for a running attempt."""

    def persist(records: list[AttemptRecord]) -> None:
        saved.append([r.to_dict() for r in records])
        if any(r.interruption in (names.PREEMPTED, names.MOVED_TO_SPOT) and r.state.active for r in records):
            raise Crash

    return persist


def _runner(
    world: OperatorWorld,
    policy: CapacityPolicy,
    records: list[AttemptRecord],
    try_number: int,
    persist: Callable[[list[AttemptRecord]], None],
) -> AttemptRunner:
    engine = AttemptEngine(policy, records, try_number=try_number, backend_name=world.name)
    runner = AttemptRunner(
        world.backend(),
        engine,
        log=log,
        label=f"{LABEL} (try {try_number})",
        stop=threading.Event(),
        persist=persist,
        cancel_retry_s=0.0,
    )
    runner.spot_decision = dict(DECISION)
    return runner


def _new_try(
    world: OperatorWorld, policy: CapacityPolicy, request: JobRequest, saved: list[list[dict[str, Any]]]
) -> AttemptRunner:
    """Try 2, as ``execute()`` starts it: the saved records, refreshed from the service, the attempt taken over."""
    stored = [AttemptRecord.from_dict(data) for data in saved[-1]]
    records = recover(world.backend(), request.identity.task, stored, log)
    runner = _runner(world, policy, records, 2, lambda records: saved.append([r.to_dict() for r in records]))
    step = runner.engine.resume()
    if isinstance(step, Wait):
        runner.take_over(step.record)
    return runner


def _stops(world: OperatorWorld, handle: JobHandle) -> list[str]:
    return [strip_cancel_prefix(reason) for job_id, reason in world.stopped() if job_id == handle.job_id]


def _plan(world: OperatorWorld) -> Plan:
    return Plan(
        backend=world.backend(),
        command=[],
        env={},
        image=None,
        checkpoint_uri=None,
        max_runtime_s=None,
        poll_interval=POLL_S,
        try_number=2,
    )


# --- (a) the restart limit ---------------------------------------------------------------------------------------


def _restarted(world: OperatorWorld, tmp_path: Path) -> tuple[JobRequest, JobHandle]:
    """A spot job the service restarted once inside its attempt, in its second run now."""
    backend = world.backend()
    request = world.request("plstop_rl", _job(tmp_path), capacity=names.SPOT)
    handle = backend.submit(request)
    read_until(backend, handle, lambda lines: any("job-start" in line for line in lines), timeout=60)
    world.restart_inside(handle)
    wait_status(backend, handle, lambda s: s.restarts >= 1 and s.state is JobState.RUNNING, "to run again")
    read_until(backend, handle, lambda lines: sum("job-start" in line for line in lines) >= 2, timeout=60)
    return request, handle


def _crash_at_the_restart_limit(world: OperatorWorld, handle: JobHandle) -> list[list[dict[str, Any]]]:
    """Try 1's wait fires the restart limit, writes the stop, and dies before it is sent."""
    saved: list[list[dict[str, Any]]] = []
    record = AttemptRecord.new(handle, try_number=1)
    first = _runner(world, RESTART_POLICY, [record], 1, _crash_at_the_planned_stop(saved))
    try:
        status, outcome = first.wait(record, POLL_S)
        assert (outcome, status.restarts) == (RESTART_LIMIT, 1), (outcome, status)
        with pytest.raises(Crash):
            first.after_wait(record, status, outcome)
    finally:
        first.close()
    assert _stops(world, handle) == [], "the process died between writing the stop and sending it"
    (planned,) = saved[-1]
    assert (planned["interruption"], planned["state"]) == (names.PREEMPTED, JobState.RUNNING.value), planned
    return saved


def _next_try_after_the_crash(
    world: OperatorWorld, tmp_path: Path
) -> tuple[JobHandle, list[list[dict[str, Any]]], AttemptRunner, AttemptRecord]:
    """A job restarted once by its service, a try that died between writing its restart-limit stop and sending
    it, and the next try built from what the first saved (the job, the saves, its runner and the record)."""
    request, handle = _restarted(world, tmp_path)
    saved = _crash_at_the_restart_limit(world, handle)
    second = _new_try(world, RESTART_POLICY, request, saved)
    (record,) = second.engine.records
    assert second.restart_limit(record) == 1, "a stop never sent: the restart limit still holds for the new try"
    return handle, saved, second, record


@pytest.mark.parametrize("world", RESTARTING_WORLDS, indirect=True)
def test_a_restart_limit_stop_planned_before_a_crash_is_sent_again_and_the_next_attempt_follows(
    world: OperatorWorld, tmp_path: Path
) -> None:
    handle, saved, second, record = _next_try_after_the_crash(world, tmp_path)
    trigger, _ = job_trigger(_plan(world), second, record, None, task_label=LABEL, spend=None)
    assert trigger.restart_limit == 1, "a trigger built from the record before the resend still fires the limit"

    from gpu_provider.engine.planned_stops import resume_stop  # what the operator runs before each wait

    assert resume_stop(second, record) is None, "the job still runs: the new try waits for its end"
    (stop,) = _stops(world, handle)
    assert stop.startswith(names.RESTART_LIMIT_MARK + "the service restarted the job 1 time(s)"), stop
    assert (record.interruption, record.stop) == (names.PREEMPTED, names.STOP_CONFIRMED), record
    assert saved[-1][0]["stop"] == names.STOP_CONFIRMED, "the confirmation is saved: a later try sends nothing"
    assert second.restart_limit(record) is None, "the stop is taken: the wait only waits for the end"
    trigger, _ = job_trigger(_plan(world), second, record, None, task_label=LABEL, spend=None)
    assert trigger.restart_limit is None

    try:
        status, outcome = second.wait(record, POLL_S)
        assert outcome == ENDED and status.state is JobState.CANCELLED, (outcome, status)
        step = second.after_wait(record, status, outcome)
    finally:
        second.close()
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND), step
    assert (record.state, record.interruption, record.restarts) == (JobState.CANCELLED, names.PREEMPTED, 1), record
    assert record.reason.startswith(names.RESTART_LIMIT_MARK), record.reason
    assert len(second.engine.interruptions()) == 1, "the stop is the restart the policy counted, not a second one"
    assert len(_stops(world, handle)) == 1, "the job was stopped once"


_REFUSE_STOPS = {
    # the stop's reason tag comes first: every answer lost, so StopTrainingJob is never sent
    "sagemaker": lambda world: world.emulator.lose_response("AddTags", 20),
}


@pytest.mark.parametrize("world", RESTARTING_WORLDS, indirect=True)
def test_a_planned_stop_the_new_try_cannot_send_either_leaves_the_restart_limit_to_fire_again(
    world: OperatorWorld, tmp_path: Path
) -> None:
    handle, _saved, second, record = _next_try_after_the_crash(world, tmp_path)
    from gpu_provider.engine.planned_stops import resume_stop  # what the operator runs before each wait

    assert world.name in _REFUSE_STOPS, f"{world.name} world: add how its service refuses a stop"
    _REFUSE_STOPS[world.name](world)
    try:
        assert resume_stop(second, record) is None
    finally:
        world.emulator.reset_faults()
    assert _stops(world, handle) == []
    assert (record.interruption, record.stop) == (None, None), "a stop not sent is no longer planned"
    assert second.restart_limit(record) == 1

    try:
        status, outcome = second.wait(record, POLL_S)
        assert outcome == RESTART_LIMIT, (outcome, status)  # the limit is enforced: its own rule sends the stop
        assert second.after_wait(record, status, outcome) == Wait(record)
        assert record.stop == names.STOP_CONFIRMED, record
        status, outcome = second.wait(record, POLL_S)
        assert outcome == ENDED, (outcome, status)
        step = second.after_wait(record, status, outcome)
    finally:
        second.close()
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND), step
    assert (record.state, record.interruption) == (JobState.CANCELLED, names.PREEMPTED), record
    assert len(_stops(world, handle)) == 1


# --- (b) a move back to spot -------------------------------------------------------------------------------------


def _crash_at_the_move(world: OperatorWorld, tmp_path: Path) -> tuple[JobRequest, JobHandle, list[Any]]:
    """An on-demand attempt runs; spot returned, and try 1 dies after writing the move, before the stop."""
    backend = world.backend()
    request = world.request("plstop_mv", _job(tmp_path), capacity=names.ON_DEMAND)
    handle = backend.submit(request)
    running = wait_state(backend, handle, JobState.RUNNING)
    read_until(backend, handle, lambda lines: any("job-start" in line for line in lines), timeout=60)
    saved: list[list[dict[str, Any]]] = []
    record = AttemptRecord.new(handle, try_number=1)
    first = _runner(world, MOVE_POLICY, [record], 1, _crash_at_the_planned_stop(saved))
    with pytest.raises(Crash):
        first.after_wait(record, running, SPOT_RETURNED)
    first.close()
    assert _stops(world, handle) == [], "the process died between writing the move and sending its stop"
    (planned,) = saved[-1]
    assert planned["interruption"] == names.MOVED_TO_SPOT and JobState(planned["state"]).active, planned
    return request, handle, saved


def test_a_move_planned_before_a_crash_is_sent_again_and_the_next_attempt_runs_on_spot(
    world: OperatorWorld, tmp_path: Path
) -> None:
    from gpu_provider.engine.planned_stops import resume_stop

    request, handle, saved = _crash_at_the_move(world, tmp_path)
    second = _new_try(world, MOVE_POLICY, request, saved)
    (record,) = second.engine.records
    assert record.planned_stop == names.MOVED_TO_SPOT and not record.stop_confirmed, record
    try:
        step = resume_stop(second, record)
        (stop,) = _stops(world, handle)
        assert stop.startswith(names.SPOT_RETURN_MARK + "spot placement score 9"), stop
        if step is None:  # the job stops: the wait reads its end
            status, outcome = second.wait(record, POLL_S)
            assert outcome == ENDED and status.state.terminal, (outcome, status)
            step = second.after_wait(record, status, outcome)
    finally:
        second.close()
    assert step == Submit(attempt=2, capacity=names.SPOT), step
    assert (record.interruption, record.stop) == (names.MOVED_TO_SPOT, names.STOP_CONFIRMED), record
    assert record.spot_return == DECISION
    assert second.engine.interruptions() == [], "a move is not an interruption"
    assert len(_stops(world, handle)) == 1, "the job was stopped once"


def test_a_job_that_fails_on_its_own_after_a_move_was_planned_but_never_sent_has_failed(
    world: OperatorWorld, tmp_path: Path
) -> None:
    request, handle, saved = _crash_at_the_move(world, tmp_path)
    (tmp_path / "fail-now").touch()  # while no process watches it, the job fails: its own error, not the move
    failed = wait_ended(world.backend(), handle, timeout=60)
    assert failed.state is JobState.FAILED, failed

    # the trigger's way (execute_complete): the records the deferral kept, and the end the trigger read
    kept = [AttemptRecord.from_dict(data) for data in saved[-1]]
    resumed = _runner(world, MOVE_POLICY, kept, 1, lambda records: None)
    step = resumed.after_wait(kept[0], failed, ENDED)
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobFailedError), step
    assert "This is the job's own error, not an interruption" in str(step.error)
    assert (kept[0].state, kept[0].interruption) == (JobState.FAILED, None), kept[0]

    # a new try's way (execute): the saved records, refreshed from the service
    second = _new_try(world, MOVE_POLICY, request, saved)
    (record,) = second.engine.records
    assert (record.state, record.interruption) == (JobState.FAILED, None), record
    assert second.engine.moves() == []
    step = second.engine.resume()  # Airflow's retry of the job's own failure: on the policy's capacity, no move
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND), step
    assert "Moving back to spot" not in second.engine.note
    assert _stops(world, handle) == [], "nothing was stopped"
    assert poll_one(world.backend(), handle).state is JobState.FAILED


@pytest.fixture
def local_world(tmp_path: Path) -> Iterator[OperatorWorld]:
    """How a record of 0.4.0 is read is the engine's rule, the same on every backend: shown on the local one."""
    built = LocalOperatorWorld(tmp_path)
    try:
        yield built
    finally:
        built.cleanup()


def test_a_move_recorded_by_0_4_0_as_stop_sent_is_sent_again_and_confirmed(
    local_world: OperatorWorld, tmp_path: Path
) -> None:
    """0.4.0 saved a planned stop as ``interruption`` alone ("stop sent"), so a crash before the send left it never
    sent: read as planned, not confirmed, it is sent again (its reason rebuilt from the record) and confirmed."""
    from gpu_provider.engine.planned_stops import resume_stop

    world = local_world
    request, handle, saved = _crash_at_the_move(world, tmp_path)
    saved[-1] = [{k: v for k, v in data.items() if k not in ("stop", "stop_reason")} for data in saved[-1]]
    second = _new_try(world, MOVE_POLICY, request, saved)
    (record,) = second.engine.records
    assert (record.planned_stop, record.stop) == (names.MOVED_TO_SPOT, None), record
    try:
        step = resume_stop(second, record) or second.after_wait(record, *second.wait(record, POLL_S))
    finally:
        second.close()
    (stop,) = _stops(world, handle)
    assert stop.startswith(names.SPOT_RETURN_MARK + "spot placement score 9 in us-east-1 (>= 7); the job"), stop
    assert step == Submit(attempt=2, capacity=names.SPOT), step
    assert (record.interruption, record.stop) == (names.MOVED_TO_SPOT, names.STOP_CONFIRMED), record
