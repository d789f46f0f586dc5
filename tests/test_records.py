"""Attempt records: a known end is never overwritten by a weaker read, and the list stays bounded."""

from __future__ import annotations

import time

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.engine.attempts import AttemptEngine, Submit
from gpu_provider.operators._fields import configured_max_attempt_records
from gpu_provider.records import (
    DEFAULT_MAX_ATTEMPT_RECORDS,
    AttemptRecord,
    AttemptSummary,
    compact,
    dump_records,
    load_records,
    load_summary,
)
from gpu_provider.recovery import SpotFallback

LOST = JobStatus(state=JobState.FAILED, reason="the service forgot it", interruption=names.LOST)


def _record(attempt: int, state: JobState, *, collected: bool = False, **fields: object) -> AttemptRecord:
    handle = JobHandle("local", f"j{attempt}", f"gp-j{attempt}", attempt, names.SPOT, time.time() - 1000 + attempt)
    record = AttemptRecord.new(handle, try_number=1)
    record.update(JobStatus(state=JobState.RUNNING, started_at=time.time() - 500, gpu_seconds=60.0))
    record.update(JobStatus(state=state, ended_at=time.time() - 400, gpu_seconds=100.0, **fields))  # type: ignore[arg-type]
    record.collected = collected
    record.cost_usd = 0.5
    return record


@pytest.mark.parametrize(
    ("state", "interruption"),
    [
        (JobState.SUCCEEDED, None),
        (JobState.FAILED, None),
        (JobState.PREEMPTED, names.PREEMPTED),
        (JobState.CANCELLED, names.CAPACITY_TIMEOUT),
    ],
)
def test_a_known_end_is_never_overwritten_by_a_lost_read(state: JobState, interruption: str | None) -> None:
    record = _record(1, state, interruption=interruption, exit_code=0 if state is JobState.SUCCEEDED else None)
    before = record.to_dict()
    record.update(LOST)
    record.update(JobStatus(state=JobState.RUNNING))  # a stale sample arriving late changes no end either
    assert record.to_dict() == before


def test_a_lost_record_takes_a_read_that_says_how_the_job_really_ended() -> None:
    record = _record(1, JobState.FAILED, interruption=names.LOST)
    assert record.lost
    record.update(JobStatus(state=JobState.SUCCEEDED, exit_code=0, gpu_seconds=120.0))
    assert (record.state, record.interruption, record.exit_code, record.gpu_seconds) == (
        JobState.SUCCEEDED,
        None,
        0,
        120.0,
    )


def test_compact_folds_only_finished_runs_into_a_summary_that_keeps_their_figures() -> None:
    # 12 earlier runs of 2 attempts each (a preemption, then success; each collected), then the current run
    records = []
    for run in range(12):
        records.append(_record(2 * run + 1, JobState.PREEMPTED))
        records.append(_record(2 * run + 2, JobState.SUCCEEDED, collected=True))
    current = [_record(25, JobState.PREEMPTED), _record(26, JobState.RUNNING)]
    records += current
    total_gpu = sum(r.gpu_seconds for r in records[:-2])

    summary = compact(records, None, cap=5)

    assert summary is not None
    assert len(records) <= 5 and records[-2:] == current  # the current run is never folded
    assert records[-3].collected and records[-3].state is JobState.SUCCEEDED  # nor the latest collected run
    kept = sum(r.gpu_seconds for r in records[:-2])
    assert summary.gpu_seconds + kept == pytest.approx(total_gpu)
    assert summary.attempts + len(records) == 26
    assert summary.states == {"PREEMPTED": summary.attempts // 2, "SUCCEEDED": summary.attempts // 2}
    assert summary.interruptions == summary.attempts // 2
    assert summary.cost_usd == pytest.approx(0.5 * summary.attempts)
    assert (summary.first_attempt, summary.last_attempt) == (1, summary.attempts)

    # stored and read back (task state store, trigger kwargs): the summary travels first, then the records
    data = dump_records(records, summary)
    assert "summary" in data[0] and len(data) == len(records) + 1
    assert load_summary(data) == summary
    assert [r.job_id for r in load_records(data)] == [r.job_id for r in records]

    # compacting again folds into the same summary, and the next attempt number is past every folded one
    summary = compact(records, summary, cap=3)
    assert summary is not None and summary.attempts + len(records) == 26
    engine = AttemptEngine(SpotFallback(backoff=0), records, try_number=1, backend_name="local", summary=summary)
    assert engine.next_submit() == Submit(attempt=27, capacity=names.ON_DEMAND)


def test_a_current_run_longer_than_the_cap_is_kept_whole() -> None:
    records = [_record(i, JobState.PREEMPTED) for i in range(1, 8)]
    assert compact(records, None, cap=3) is None and len(records) == 7


def test_max_attempt_records_is_read_from_the_config_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert configured_max_attempt_records() == DEFAULT_MAX_ATTEMPT_RECORDS
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__MAX_ATTEMPT_RECORDS", "7")
    assert configured_max_attempt_records() == 7
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__MAX_ATTEMPT_RECORDS", "1")
    with pytest.raises(ValueError, match=r"max_attempt_records='1' must be a whole number, 2 or more"):
        configured_max_attempt_records()


def test_the_summary_round_trips_alone() -> None:
    summary = AttemptSummary()
    summary.add(_record(1, JobState.SUCCEEDED, collected=True))
    assert AttemptSummary.from_dict(summary.to_dict()["summary"]) == summary
    assert dump_records([], AttemptSummary()) == []  # an empty summary is not stored


def test_an_attempt_keeps_its_own_backend_and_a_record_of_0x_means_the_tasks() -> None:
    """A capacity ladder's attempt records its rung, backend and service; a record written before ladders (no such
    fields, as 0.x stored them) still loads and means the task's backend."""
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.engine.runner import backend_of

    task_backend, rung_backend = LocalBackend(state_dir="/tmp/a"), LocalBackend(state_dir="/tmp/b")
    stored_by_0x = {
        "schema": 2,
        "attempt": 1,
        "state": "RUNNING",
        "handle": {
            "backend": "local",
            "job_id": "j1",
            "name": "n1",
            "attempt": 1,
            "capacity": "spot",
            "submitted_at": 1.0,
        },
    }
    old = AttemptRecord.from_dict(stored_by_0x)
    assert (old.rung, old.backend_spec, old.service) == (None, None, None)
    assert backend_of(task_backend, old, [task_backend, rung_backend]) is task_backend
    assert old.public()["backend"] == "local" and old.public()["region"] is None

    mine = AttemptRecord.from_dict({**old.to_dict(), "rung": 1, "backend_spec": rung_backend.spec(), "service": "x"})
    loaded = AttemptRecord.from_dict(mine.to_dict())
    assert (loaded.rung, loaded.backend_spec, loaded.service) == (1, rung_backend.spec(), "x")
    assert backend_of(task_backend, loaded, [task_backend, rung_backend]) is rung_backend
    assert "backend_spec" not in loaded.public()  # XCom names the backend, service and region, not the options
    # a rung no longer in the DAG (changed since the attempt ran): the record's own backend is built again
    gone = LocalBackend(state_dir="/tmp/c")
    loaded.backend_spec = gone.spec()
    assert backend_of(task_backend, loaded, [task_backend, rung_backend]) == gone


def _running_with(interruption: str, **fields: object) -> AttemptRecord:
    handle = JobHandle("local", "j1", "gp-j1", 1, names.ON_DEMAND, time.time() - 100)
    data = {**AttemptRecord.new(handle, try_number=1).to_dict(), "state": "RUNNING", "interruption": interruption}
    data.update(fields)
    return AttemptRecord.from_dict(data)


@pytest.mark.parametrize("kind", [names.PREEMPTED, names.MOVED_TO_SPOT])
def test_a_planned_stop_of_0_4_0_reads_as_planned_and_only_a_confirmed_one_makes_the_end_the_plans(kind: str) -> None:
    """0.4.0 wrote a planned stop as ``interruption`` alone on a running attempt ("stop sent"): it reads as planned,
    not confirmed. The end is the plan's only once the stop was seen taken, or the end carries its reason."""
    mark = names.STOP_MARKS[kind]
    old = _running_with(kind)  # no stop, no stop_reason: as 0.4.0 stored it
    assert (old.planned_stop, old.stop, old.stop_confirmed) == (kind, None, False)
    own = JobStatus(state=JobState.FAILED, reason="exit code 3", exit_code=3)
    old.update(own)
    assert (old.state, old.interruption, old.planned_stop) == (JobState.FAILED, None, None), "the job's own failure"

    planned = _running_with(kind, stop=names.STOP_PLANNED, stop_reason=f"{mark}x")
    planned.update(JobStatus(state=JobState.RUNNING, reason="still running"))
    assert not planned.stop_confirmed, "a read that shows no stop confirms nothing"
    planned.update(JobStatus(state=JobState.RUNNING, stopping=f"{mark}x"))
    assert planned.stop_confirmed, "the service shows the stop being taken"
    planned.update(own)  # confirmed, then it failed as it stopped: the plan's end all the same
    assert (planned.state, planned.interruption, planned.stop) == (JobState.FAILED, kind, names.STOP_CONFIRMED)

    # unconfirmed, but the end carries the stop's reason (Kubernetes keeps the prefix): the plan's end
    ended = _running_with(kind, stop=names.STOP_PLANNED)
    ended.update(JobStatus(state=JobState.CANCELLED, reason=f"{names.CANCEL_PREFIX}{mark}x"))
    assert (ended.interruption, ended.stop) == (kind, names.STOP_CONFIRMED)
    # a job that succeeded before its stop took hold succeeded
    done = _running_with(kind, stop=names.STOP_CONFIRMED)
    done.update(JobStatus(state=JobState.SUCCEEDED, exit_code=0))
    assert (done.state, done.interruption) == (JobState.SUCCEEDED, None)
    # the new fields survive the task state store
    (loaded,) = load_records(dump_records([planned]))
    assert (loaded.stop, loaded.stop_reason) == (names.STOP_CONFIRMED, f"{mark}x")
