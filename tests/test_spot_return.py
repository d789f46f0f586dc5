"""Back to spot when spot returns (``SpotFallback(spot_return=SpotReturn(...))``): the policy object's
parse-time checks, the engine's rules for a planned move, and the decision from a reading of the EC2 spot
emulator (placement scores and prices)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpu_provider import InstanceFallback, SpotFallback, SpotReturn, names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.capacity.spot_return import SpotReturnWatch
from gpu_provider.engine.attempts import AttemptEngine, Submit
from gpu_provider.exceptions import GpuJobInterruptionBudgetError
from gpu_provider.records import AttemptRecord, dump_records, load_records
from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator

# --- the policy object: parse-time checks that name the field, the value and what is allowed ------------


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"min_saving": 1.0}, ValueError, "capacity.spot_return.min_saving=1.0 must be a number from 0 to less than 1"),
        ({"min_saving": "0.3"}, TypeError, "capacity.spot_return.min_saving='0.3' (str)"),
        ({"min_score": 11}, ValueError, "capacity.spot_return.min_score=11 must be an integer from 1 to 10"),
        ({"min_score": True}, TypeError, "capacity.spot_return.min_score=True (bool)"),
        ({"max_moves": -1}, ValueError, "capacity.spot_return.max_moves=-1 must be an integer from 0 to 20"),
        ({"check_every": 0}, ValueError, "capacity.spot_return.check_every=0 is too short: use 0.1 s to a day"),
        ({"check_every": 90000}, ValueError, "capacity.spot_return.check_every=90000 is out of range"),
        ({"cooldown": -5}, ValueError, "capacity.spot_return.cooldown=-5 is out of range"),
        ({"min_remaining": "soon"}, ValueError, "capacity.spot_return.min_remaining='soon' is not a duration"),
        ({"expected_runtime": 0}, ValueError, "capacity.spot_return.expected_runtime=0"),
        ({"instance_types": ["ml.p4d.24xlarge"]}, ValueError, "is a SageMaker instance type"),
        ({"regions": ["mars-1"]}, ValueError, "capacity.spot_return.regions[0]='mars-1' is not an AWS region"),
        ({"aws_conn_id": 3}, TypeError, "capacity.spot_return.aws_conn_id=3"),
    ],
)
def test_every_parameter_is_checked_with_the_field_the_value_and_what_is_allowed(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=None) as raised:
        SpotReturn(**kwargs)
    assert words in str(raised.value)


def test_it_composes_into_spot_fallback_only_as_a_spot_return_object() -> None:
    policy = SpotFallback(after_preemptions=0, spot_return=SpotReturn(check_every=1))
    assert policy.spot_return == SpotReturn(check_every=timedelta(seconds=1))
    # on-demand from the start, but the move makes spot a capacity the task may use (the backend must allow it)
    assert policy.may_use == frozenset({names.SPOT, names.ON_DEMAND})
    assert SpotFallback(after_preemptions=0).may_use == frozenset({names.ON_DEMAND})
    with pytest.raises(TypeError, match=r"capacity.spot_return=True \(bool\) must be SpotReturn\(...\) or None"):
        SpotFallback(spot_return=True)  # type: ignore[arg-type]
    assert hash(policy) == hash(SpotFallback(after_preemptions=0, spot_return=SpotReturn(check_every=1)))
    assert SpotReturn.from_dict(SpotReturn(min_saving=0.5, regions=["us-west-2"]).to_dict()) == SpotReturn(
        min_saving=0.5, regions=["us-west-2"]
    )


def test_the_operator_refuses_a_spot_return_with_no_instance_type_to_read(tmp_path: Any) -> None:
    from gpu_provider import GpuResources
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.operators import GpuJobOperator

    backend = LocalBackend(state_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"capacity.spot_return needs instance types to read spot capacity for"):
        GpuJobOperator(task_id="t", command=["true"], backend=backend, capacity=SpotFallback(spot_return=SpotReturn()))
    op = GpuJobOperator(
        task_id="t2",
        command=["true"],
        backend=backend,
        resources=GpuResources(gpus=1),
        capacity=SpotFallback(spot_return=SpotReturn(instance_types=["p4d.24xlarge"])),
        checkpoint=f"file://{tmp_path}/ckpt",
    )
    assert op.capacity.spot_return is not None


# --- the engine: a planned move is not an interruption -------------------------------------------------


def _record(attempt: int, capacity: str, state: JobState, **kw: Any) -> AttemptRecord:
    handle = JobHandle("local", f"job-{attempt}", f"gp-x-a{attempt}", attempt, capacity, time.time() + attempt)
    record = AttemptRecord.new(handle, try_number=1)
    record.state = state
    for key, value in kw.items():
        setattr(record, key, value)
    return record


def _engine(records: list[AttemptRecord], policy: Any) -> AttemptEngine:
    return AttemptEngine(policy, records, try_number=1, backend_name="local", resumes=True)


def test_a_move_back_to_spot_submits_on_spot_and_is_not_counted_as_an_interruption() -> None:
    policy = SpotFallback(backoff=0, max_interruptions=1, spot_return=SpotReturn(check_every=1))
    timed_out = _record(1, names.SPOT, JobState.CANCELLED, interruption=names.CAPACITY_TIMEOUT)
    moved = _record(
        2,
        names.ON_DEMAND,
        JobState.CANCELLED,
        interruption=names.MOVED_TO_SPOT,
        spot_return={"saving_usd": 1.25, "summary": "spot placement score 9 in us-east-1"},
    )
    engine = _engine([timed_out, moved], policy)
    step = engine.ended(moved)
    # without the move the policy says on-demand (spot capacity timed out before): the move says spot
    assert step == Submit(attempt=3, capacity=names.SPOT)
    assert "planned move 1 of at most 2; not an interruption" in engine.note
    assert "estimated saving $1.2500" in engine.note
    assert len(engine.interruptions()) == 1, "the move does not use max_interruptions (1 here: one timeout)"
    # the spot attempt after the move reclaimed: the policy decides again, from its interruptions alone
    reclaimed = _record(3, names.SPOT, JobState.PREEMPTED, interruption=names.PREEMPTED)
    engine.records.append(reclaimed)
    with pytest.raises(GpuJobInterruptionBudgetError):  # 2 interruptions > max_interruptions=1: the move is not one
        raise engine.ended(reclaimed).error  # type: ignore[union-attr]
    # a record of the move survives the task state store round trip (a worker crash)
    (loaded,) = load_records(dump_records([moved]))
    assert (loaded.interruption, loaded.spot_return) == (names.MOVED_TO_SPOT, moved.spot_return)


def test_after_a_move_a_reclaim_goes_back_to_on_demand_and_the_result_sums_the_savings() -> None:
    policy = SpotFallback(backoff=0, spot_return=SpotReturn(check_every=1))
    records = [
        _record(1, names.SPOT, JobState.CANCELLED, interruption=names.CAPACITY_TIMEOUT),
        _record(
            2, names.ON_DEMAND, JobState.CANCELLED, interruption=names.MOVED_TO_SPOT, spot_return={"saving_usd": 2}
        ),
        _record(3, names.SPOT, JobState.PREEMPTED, interruption=names.PREEMPTED),
    ]
    engine = _engine(records, policy)
    assert engine.ended(records[2]) == Submit(attempt=4, capacity=names.ON_DEMAND, delay=0.0)
    done = _record(4, names.ON_DEMAND, JobState.SUCCEEDED)
    records.append(done)
    result = engine.result(done, None)
    assert (result["interruptions"], result["moves_to_spot"], result["spot_return_saving_usd"]) == (2, 1, 2.0)
    assert result["attempts"][1]["spot_return"] == {"saving_usd": 2}


def test_a_move_under_instance_fallback_starts_the_spot_rung_at_the_preferred_type() -> None:
    types = ("p5.48xlarge", "p4d.24xlarge")
    policy = SpotFallback(backoff=0, instances=InstanceFallback(capacity_wait=1), spot_return=SpotReturn())
    moved = _record(1, names.ON_DEMAND, JobState.CANCELLED, interruption=names.MOVED_TO_SPOT, instance_choice=types[1])
    engine = AttemptEngine(policy, [moved], try_number=1, backend_name="local", instance_types=types)
    assert engine.ended(moved) == Submit(attempt=2, capacity=names.SPOT, instance_type=types[0])


def _iso(seconds_ago: float) -> str:
    return datetime.fromtimestamp(time.time() - seconds_ago, tz=timezone.utc).isoformat()


def test_what_an_on_demand_attempt_watches_and_when_it_watches_nothing() -> None:
    spot_return = SpotReturn(check_every=1, max_moves=1, cooldown=600)
    policy = SpotFallback(backoff=0, spot_return=spot_return)
    reclaimed = _record(1, names.SPOT, JobState.PREEMPTED, interruption=names.PREEMPTED)
    reclaimed.started_at, reclaimed.ended_at = _iso(100), _iso(40)
    running = _record(2, names.ON_DEMAND, JobState.RUNNING)
    engine = _engine([reclaimed, running], policy)
    watch = engine.spot_return_watch(running, ("p4d.24xlarge",))
    assert watch is not None
    assert watch["instance_types"] == ["p4d.24xlarge"] and watch["moves"] == 0
    assert 59 < watch["ran_before_s"] < 61
    assert time.time() - watch["last_reclaim_at"] == pytest.approx(40, abs=2)
    # the cooldown after the reclaim holds the move back, whatever spot looks like
    held = SpotReturnWatch(watch, clock=lambda: 1e12)
    assert held.check(JobStatus(state=JobState.RUNNING, started_at=time.time())) is None
    assert "spot was reclaimed" in held.why_not and "cooldown 600s" in held.why_not and held.readings == 0
    # a spot attempt, or an on-demand one already asked to move, watches nothing; nor does one past max_moves
    assert engine.spot_return_watch(reclaimed, ("p4d.24xlarge",)) is None
    moved = _record(3, names.ON_DEMAND, JobState.CANCELLED, interruption=names.MOVED_TO_SPOT)
    later = _record(4, names.ON_DEMAND, JobState.RUNNING)
    engine.records += [moved, later]
    assert engine.spot_return_watch(moved, ("p4d.24xlarge",)) is None
    assert engine.spot_return_watch(later, ("p4d.24xlarge",)) is None, "max_moves=1 is spent"
    assert _engine([running], SpotFallback()).spot_return_watch(running, ("p4d.24xlarge",)) is None


# --- the decision, from the EC2 emulator's scores and prices ---------------------------------------------


def _watch(emulator: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch, **policy: Any) -> SpotReturnWatch:
    from gpu_provider.testing.worlds import aws_connection_env

    for key, value in aws_connection_env(emulator.endpoint_url, emulator.region, "aws_spot").items():
        monkeypatch.setenv(key, value)
    spot_return = SpotReturn(check_every=1, aws_conn_id="aws_spot", **policy)
    running = _record(1, names.ON_DEMAND, JobState.RUNNING, nodes=2)
    watch = spot_return.watch_for(running, [running], ("p4d.24xlarge",))
    assert watch is not None
    return SpotReturnWatch(watch, on_demand_price=lambda t, r: {"p4d.24xlarge": 32.0}[t], clock=lambda: 1e12)


def test_spot_that_returns_and_saves_enough_moves_with_its_saving(
    ec2_spot: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    ec2_spot.set_scores({"us-east-1": 9})
    ec2_spot.set_price("us-east-1", "us-east-1a", "p4d.24xlarge", 12.0)
    watch = _watch(ec2_spot, monkeypatch, expected_runtime=7200, min_remaining=600)
    started = time.time() - 3600
    decision = watch.check(JobStatus(state=JobState.RUNNING, started_at=started))
    assert decision is not None, watch.why_not
    assert (decision["score"], decision["spot_usd_per_hour"], decision["on_demand_usd_per_hour"]) == (9, 12.0, 32.0)
    assert decision["saving_pct"] == 62.5 and decision["saving_usd_per_hour"] == 40.0  # (32 - 12) x 2 nodes
    # about an hour left of the two expected (the reading itself may take seconds on a loaded machine)
    assert 3600 - 120 < decision["remaining_s"] <= 3600
    assert decision["saving_usd"] == pytest.approx(40.0 * decision["remaining_s"] / 3600, abs=0.01)  # $40/h
    # the same reads SpotCapacitySensor makes: scores for the types and nodes, then the price in effect now
    (scores,) = ec2_spot.requests("GetSpotPlacementScores")
    assert (scores["body"]["InstanceType.1"], scores["body"]["TargetCapacity"]) == ("p4d.24xlarge", "2")
    assert scores["body"]["RegionName.1"] == "us-east-1"
    assert len(ec2_spot.requests("DescribeSpotPriceHistory")) == 1


@pytest.mark.parametrize(
    ("score", "price", "policy", "why"),
    [
        (6, 12.0, {}, "spot placement scores us-east-1 6 are under min_score=7"),
        (9, 25.0, {}, "saves 22%, under min_saving=30%"),
        (9, 12.0, {"expected_runtime": 4000, "min_remaining": 1800}, "under min_remaining=1800s"),
    ],
    ids=["score-low", "saving-low", "little-left"],
)
def test_no_move_when_spot_is_scarce_the_saving_small_or_little_work_is_left(
    ec2_spot: Ec2SpotEmulator,
    monkeypatch: pytest.MonkeyPatch,
    score: int,
    price: float,
    policy: dict[str, Any],
    why: str,
) -> None:
    ec2_spot.set_scores({"us-east-1": score})
    ec2_spot.set_price("us-east-1", "us-east-1a", "p4d.24xlarge", price)
    watch = _watch(ec2_spot, monkeypatch, **policy)
    assert watch.check(JobStatus(state=JobState.RUNNING, started_at=time.time() - 3600)) is None
    assert why in watch.why_not


def test_a_reading_that_fails_never_moves(ec2_spot: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    ec2_spot.set_scores({"us-east-1": 10})
    ec2_spot.set_price("us-east-1", "us-east-1a", "p4d.24xlarge", 1.0)
    ec2_spot.throttle("*", 1)  # every request throttled
    watch = _watch(ec2_spot, monkeypatch)
    assert watch.check(JobStatus(state=JobState.RUNNING, started_at=time.time())) is None
    assert "could not read spot capacity" in watch.why_not and "no move on a guess" in watch.why_not
    ec2_spot.throttle("*", 0)
    assert watch.check(JobStatus(state=JobState.RUNNING, started_at=time.time())) is not None
    # a queued or ended attempt is not read for at all
    assert watch.check(JobStatus(state=JobState.QUEUED)) is None and watch.why_not == "the attempt is not running"


def test_the_trigger_carries_what_the_wait_watches_through_a_round_trip() -> None:
    from gpu_provider.triggers.gpu_job import GpuJobTrigger

    running = _record(2, names.ON_DEMAND, JobState.RUNNING)
    watch = SpotReturn(check_every=30).watch_for(running, [running], ("p4d.24xlarge",))
    trigger = GpuJobTrigger(backend={"name": "local"}, handle=running.handle.to_dict(), spot_return=watch)
    path, kwargs = trigger.serialize()
    assert path == "gpu_provider.triggers.gpu_job.GpuJobTrigger"
    again = GpuJobTrigger(**kwargs)
    assert again.serialize() == (path, kwargs) and again.spot_return == watch
    assert SpotReturnWatch(again.spot_return).policy == SpotReturn(check_every=30)  # type: ignore[arg-type]
    # a trigger of an older version, without it, reads no spot capacity
    kwargs.pop("spot_return")
    assert GpuJobTrigger(**kwargs).spot_return is None


def test_the_gpu_page_shows_a_move_with_its_saving_and_does_not_count_it_as_an_interruption() -> None:
    import json

    from gpu_provider.plugins.ui import data

    now = time.time()
    moved = _record(1, names.ON_DEMAND, JobState.CANCELLED, interruption=names.MOVED_TO_SPOT)
    moved.spot_return = {"saving_usd": 12.5, "saving_pct": 64.9}
    moved.started_at, moved.ended_at = _iso(600), _iso(300)
    done = _record(2, names.SPOT, JobState.SUCCEEDED)
    done.started_at, done.ended_at = _iso(290), _iso(10)
    row = data.TaskRow(
        dag_id="d", run_id="r", task_id="t", map_index=-1, value=json.dumps(dump_records([moved, done])), pool="gpu_ml"
    )
    attempts = data.attempts_of([row], {}, now)
    shown = {a["attempt"]: a for a in data.recent(attempts, now, offset=0, limit=10)["attempts"]}
    assert (shown[1]["end"], shown[1]["spot_return_saving_usd"]) == (names.MOVED_TO_SPOT, 12.5)
    assert shown[2]["spot_return_saving_usd"] is None
    (team,) = data.team_figures(attempts, [], now)
    assert team["interruption_rate"]["day"]["on-demand"]["interrupted"] == 0, "a planned move is no interruption"
