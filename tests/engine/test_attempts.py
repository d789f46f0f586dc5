"""The attempt engine's decisions and the attempt record, without Airflow or a backend."""

from __future__ import annotations

import time

import pytest
from airflow.sdk.exceptions import AirflowFailException

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.engine.attempts import AttemptEngine, Fail, Submit, Succeed, Wait
from gpu_provider.exceptions import (
    GpuJobCancelledError,
    GpuJobDeadlineError,
    GpuJobFailedError,
    GpuJobInterruptionBudgetError,
)
from gpu_provider.records import SCHEMA_VERSION, AttemptRecord, dump_records, load_records
from gpu_provider.recovery import OnDemand, Spot, SpotFallback


def _record(attempt: int, capacity: str = "spot", state: JobState = JobState.QUEUED, **kw: object) -> AttemptRecord:
    handle = JobHandle("local", f"job-{attempt}", f"gp-x-a{attempt}", attempt, capacity, time.time() + attempt)
    record = AttemptRecord.new(handle, try_number=int(kw.pop("try_number", 1)))  # type: ignore[call-overload]
    record.state = state
    for key, value in kw.items():
        setattr(record, key, value)
    return record


def _engine(
    records: list[AttemptRecord], policy: object = None, try_number: int = 1, retries: int = 0
) -> AttemptEngine:
    return AttemptEngine(
        policy or SpotFallback(backoff=0),  # type: ignore[arg-type]
        records,
        try_number=try_number,
        backend_name="local",
        retries=retries,
        resumes=True,
    )


def test_a_fresh_task_submits_its_first_attempt_on_the_policy_capacity() -> None:
    assert _engine([]).resume() == Submit(attempt=1, capacity="spot")
    assert _engine([], OnDemand()).resume() == Submit(attempt=1, capacity="on-demand")


def test_a_running_attempt_is_reattached_and_an_uncollected_success_is_returned() -> None:
    running = _record(1, state=JobState.RUNNING)
    assert _engine([running]).resume() == Wait(running)
    done = _record(1, state=JobState.SUCCEEDED)
    assert _engine([done]).resume() == Succeed(done)


def test_clearing_a_collected_success_runs_the_job_again() -> None:
    """Defect 1: a new try (a cleared task) must not return the earlier try's result."""
    done = _record(1, state=JobState.SUCCEEDED, collected=True)
    step = _engine([done], try_number=2).resume()
    assert step == Submit(attempt=2, capacity="spot")


def test_interruptions_before_a_collected_run_do_not_spend_the_new_runs_budget() -> None:
    old = [
        _record(1, state=JobState.PREEMPTED, interruption=names.PREEMPTED),
        _record(2, "on-demand", JobState.SUCCEEDED, collected=True),
    ]
    engine = _engine(old, Spot(max_interruptions=1, backoff=0), try_number=2)
    assert engine.interruptions() == []
    assert engine.resume() == Submit(attempt=3, capacity="spot")


def test_an_interruption_seen_by_nobody_goes_to_the_policy() -> None:
    preempted = _record(1, state=JobState.PREEMPTED, interruption=names.PREEMPTED)
    assert _engine([preempted]).resume() == Submit(attempt=2, capacity="on-demand")


def test_a_lost_job_is_an_interruption_that_keeps_the_capacity_and_spends_the_budget() -> None:
    """Issue 18.3: a job the service forgot ends the attempt with a reason; the policy decides."""
    lost = _record(1, state=JobState.FAILED, interruption=names.LOST, reason="AWS Batch no longer knows job x")
    engine = _engine([lost], Spot(max_interruptions=1, backoff=0))
    step = engine.ended(lost)
    assert step == Submit(attempt=2, capacity="spot")
    assert "The service lost the job" in engine.note
    second = _record(2, state=JobState.FAILED, interruption=names.LOST)
    engine.records.append(second)
    spent = engine.ended(second)
    assert isinstance(spent, Fail) and isinstance(spent.error, GpuJobInterruptionBudgetError)


def test_a_jobs_own_failure_goes_to_airflow_retries_but_deliberate_stops_are_final() -> None:
    """Defect 6: cancelled and budget-spent errors are AirflowFailException (never retried)."""
    failed = _record(1, state=JobState.FAILED, exit_code=3, reason="node 0 exited with code 3")
    step = _engine([failed], retries=2).ended(failed)
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobFailedError)
    assert not isinstance(step.error, AirflowFailException)
    assert "(exit code 3)" in str(step.error) and "retry 1 of 2" in str(step.error)
    assert step.record is failed

    cancelled = _record(1, state=JobState.CANCELLED, reason="stopped by a person")
    step = _engine([cancelled]).ended(cancelled)
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobCancelledError)
    assert isinstance(step.error, AirflowFailException)
    assert "does not retry" in str(step.error)

    budget = _record(1, state=JobState.PREEMPTED, interruption=names.PREEMPTED)
    step = _engine([budget], Spot(max_interruptions=0, backoff=0)).ended(budget)
    assert isinstance(step, Fail) and isinstance(step.error, AirflowFailException)
    # a deadline behaves like Airflow's own execution_timeout: retried
    assert not issubclass(GpuJobDeadlineError, AirflowFailException)


def test_a_try_that_lost_its_attempt_to_a_later_try_stops_without_resubmitting() -> None:
    """Issue 18.1: a job interrupted while a zombie try and its successor both watch it: only the owner resubmits."""
    preempted = _record(1, state=JobState.PREEMPTED, interruption=names.PREEMPTED, owner_try=2)
    zombie = _engine([preempted], try_number=1).ended(preempted)
    assert isinstance(zombie, Fail) and isinstance(zombie.error, GpuJobCancelledError)
    assert "owned by Airflow try 2" in str(zombie.error) and zombie.record is None
    owner = _engine([preempted], try_number=2).ended(preempted)
    assert owner == Submit(attempt=2, capacity="on-demand")


def test_duplicate_live_attempts_keep_the_stored_one() -> None:
    """Defect 8: two live attempts of one task instance: the one the store knows is kept."""
    first, second = _record(1, state=JobState.RUNNING), _record(1, state=JobState.QUEUED)
    second.handle = JobHandle("local", "job-1b", first.name, 1, "spot", first.handle.submitted_at + 1)
    engine = _engine([first, second])
    assert engine.duplicates({"job-1"}) == [second]
    assert engine.duplicates(set()) == [first]  # none stored: the newest stays
    assert engine.duplicates({"job-1", "job-1b"}) == [first]
    # a live attempt that a later, ended attempt superseded is cancelled too
    superseded = _engine([_record(1, state=JobState.RUNNING), _record(2, state=JobState.SUCCEEDED)])
    assert [r.attempt for r in superseded.duplicates(set())] == [1]


def test_record_update_keeps_gpu_time_and_output_a_bare_status_does_not_know() -> None:
    """Defect 3: an interruption seen only by a later lookup must not zero the GPU-seconds."""
    record = _record(1, state=JobState.RUNNING)
    record.update(JobStatus(state=JobState.RUNNING, gpu_seconds=42.0, output_uri="file:///out"))
    record.update(JobStatus(state=JobState.PREEMPTED, reason="reclaimed"))
    assert record.gpu_seconds == 42.0 and record.output_uri == "file:///out"
    assert record.interruption == names.PREEMPTED


def test_records_round_trip_and_load_tolerantly_across_versions() -> None:
    record = _record(2, "on-demand", JobState.SUCCEEDED, output_uri="s3://b/o", restarts=1, owner_try=3)
    data = dump_records([record])
    assert data[0]["schema"] == SCHEMA_VERSION and data[0]["job_id"] == "job-2"
    (back,) = load_records(data)
    assert back == record
    # a newer version's record (unknown keys) and a 0.2 record (no owner, no schema) both load
    newer = dict(data[0], some_future_field={"x": 1})
    old = {k: v for k, v in data[0].items() if k not in ("schema", "owner_try", "collected", "restarts")}
    old["try_number"] = 1
    loaded = load_records([newer, old, "garbage", {"handle": "not a dict"}])
    assert [r.owner_try for r in loaded] == [3, 1]


def test_status_and_handle_load_tolerantly() -> None:
    status = JobStatus(state=JobState.QUEUED, reason="CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY", queued_since=1.0)
    data = dict(status.to_dict(), added_in_a_later_version=True)
    assert JobStatus.from_dict(data) == status
    minimal = JobStatus.from_dict({"state": "RUNNING"})
    assert minimal.owner_try is None and minimal.restarts == 0


@pytest.mark.parametrize("kind", [names.PREEMPTED, names.CAPACITY_TIMEOUT])
def test_spot_fallback_moves_to_on_demand_after_the_interruption(kind: str) -> None:
    record = _record(1, state=JobState.CANCELLED, interruption=kind)
    assert _engine([record]).ended(record) == Submit(attempt=2, capacity="on-demand")


def test_a_reason_that_ends_a_sentence_gets_no_second_full_stop() -> None:
    """Batch's own words end with a full stop: "Host EC2 (instance i-0abc) terminated." """
    reclaimed = _record(
        1, state=JobState.PREEMPTED, interruption=names.PREEMPTED, reason="Host EC2 (instance i-0abc) terminated."
    )
    engine = _engine([reclaimed])
    engine.after_interruption(reclaimed)
    assert "ended PREEMPTED: Host EC2 (instance i-0abc) terminated. Treated as a spot interruption" in engine.note
    assert ".." not in engine.note
    failed = _record(1, "on-demand", JobState.FAILED, reason="Essential container in task exited.", exit_code=1)
    step = _engine([failed]).ended(failed)
    assert isinstance(step, Fail)
    assert "ended FAILED: Essential container in task exited (exit code 1). This is" in str(step.error)
    cut = _record(1, "on-demand", JobState.FAILED, reason="waiting for GPUs ...")
    assert "ended FAILED: waiting for GPUs ... This is" in str(_engine([cut]).ended(cut).error)  # three dots


def test_an_attempt_shows_the_training_and_billable_time_and_the_spot_saving_they_imply() -> None:
    record = _record(1, state=JobState.RUNNING)
    assert record.public()["spot_saving_pct"] is None  # nothing reported yet
    record.update(JobStatus(state=JobState.SUCCEEDED, training_seconds=400.0, billable_seconds=120.0))
    public = load_records(dump_records([record]))[0].public()
    assert (public["training_seconds"], public["billable_seconds"], public["spot_saving_pct"]) == (400.0, 120.0, 70.0)
    record.update(JobStatus(state=JobState.SUCCEEDED))  # a later sample without the figures keeps them
    assert record.spot_saving_pct == 70.0
    assert _record(2, billable_seconds=10.0).spot_saving_pct is None  # no training time: no saving claimed


def test_a_capacity_timeout_on_a_preferred_instance_type_moves_to_the_next_type_on_the_same_capacity() -> None:
    from gpu_provider.capacity import InstanceFallback

    types = ("p5.48xlarge", "p4d.24xlarge")
    policy = SpotFallback(backoff=0, spot_wait_timeout=60, instances=InstanceFallback(capacity_wait=30))
    engine = AttemptEngine(policy, [], try_number=1, backend_name="local", instance_types=types)
    assert engine.resume() == Submit(attempt=1, capacity="spot", instance_type="p5.48xlarge")
    gave_up = _record(
        1,
        state=JobState.CANCELLED,
        interruption=names.CAPACITY_TIMEOUT,
        instance_choice="p5.48xlarge",
        reason="capacity timeout: no spot p5.48xlarge capacity after 60s waiting (spot_wait_timeout)",
    )
    engine.records.append(gave_up)
    assert engine.capacity_wait(gave_up) == 60
    step = engine.ended(gave_up)
    assert step == Submit(attempt=2, capacity="spot", instance_type="p4d.24xlarge")
    assert "Spot capacity for p5.48xlarge did not come; resubmitting on spot, p4d.24xlarge (attempt 2" in engine.note
    # the last type given up too: the policy's fallback, from the first type again
    engine.records.append(
        _record(2, state=JobState.CANCELLED, interruption=names.CAPACITY_TIMEOUT, instance_choice="p4d.24xlarge")
    )
    step = engine.ended(engine.records[-1])
    assert step == Submit(attempt=3, capacity="on-demand", instance_type="p5.48xlarge")
    on_demand = _record(3, "on-demand", instance_choice="p5.48xlarge")
    assert engine.capacity_wait(on_demand) == 30  # not the last type: on-demand waits capacity_wait
    assert engine.capacity_wait(_record(4, "on-demand", instance_choice="p4d.24xlarge")) is None
