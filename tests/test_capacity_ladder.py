"""The capacity ladder: rungs on several backends (or regions) on one checkpoint, and their parse-time checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_provider import GpuResources, Ladder, LadderRung, SpotReturn
from gpu_provider.capacity import Interruption, Rung
from gpu_provider.names import CAPACITY_TIMEOUT, ON_DEMAND, PREEMPTED, SPOT

SAGEMAKER = {"name": "sagemaker", "role_arn": "arn:aws:iam::123456789012:role/train", "output_path": "s3://out/models"}
BATCH = {"name": "batch", "spot_queue": "gpu-spot", "on_demand_queue": "gpu-od"}


def _ladder(**kwargs: Any) -> Ladder:
    return Ladder(
        LadderRung(BATCH, "spot"),
        LadderRung(SAGEMAKER, "spot", instance_types=["ml.p4d.24xlarge"]),
        LadderRung(SAGEMAKER, "on_demand", instance_types=["ml.p4d.24xlarge"]),
        **kwargs,
    )


def _walk(policy: Ladder, kinds: list[str]) -> list[Rung]:
    seen: list[Interruption] = []
    rungs = [policy.rung_after(seen)]
    for attempt, kind in enumerate(kinds, start=1):
        seen.append(Interruption(attempt, rungs[-1].capacity, kind))
        rungs.append(policy.rung_after(seen))
    return rungs


def test_each_interruption_moves_one_rung_down_and_the_last_rung_takes_the_rest() -> None:
    ladder = _ladder()
    rungs = _walk(ladder, [PREEMPTED, CAPACITY_TIMEOUT, PREEMPTED])
    assert [(r.capacity, r.rung) for r in rungs] == [(SPOT, 0), (SPOT, 1), (ON_DEMAND, 2), (ON_DEMAND, 2)]
    assert [ladder.rung(r.rung).backend_name for r in rungs] == ["batch", "sagemaker", "sagemaker", "sagemaker"]  # type: ignore[union-attr]
    # the budget: every rung is reached and the last may be interrupted once more, unless told otherwise
    assert ladder.max_interruptions == 3 and _ladder(max_interruptions=7).max_interruptions == 7
    assert ladder.may_use == {SPOT, ON_DEMAND} and ladder.first_capacity() == SPOT
    assert ladder.rung(None) is None and ladder.rung(3) is None


def test_a_rung_in_another_region_carries_its_own_connection_and_region() -> None:
    west = LadderRung(
        "sagemaker",
        "spot",
        aws_conn_id="aws_west",
        region_name="us-west-2",
        **{k: v for k, v in SAGEMAKER.items() if k != "name"},
    )
    backend = west.build()
    assert (backend.name, backend.aws_conn_id, backend.region_name) == ("sagemaker", "aws_west", "us-west-2")  # type: ignore[attr-defined]
    assert "region_name='us-west-2'" in west.describe() and "role_arn" not in west.describe()
    assert Ladder([west, {"backend": "sagemaker", "capacity": "on_demand"}]).rungs[1].capacity == ON_DEMAND


@pytest.mark.parametrize(
    ("rungs", "error", "words"),
    [
        ([], ValueError, "at least one rung"),
        ([LadderRung("batch", "spot")] * 11, ValueError, "at most 10"),
        (["batch"], TypeError, "capacity.rungs[0]='batch'"),
        ([{"backend": "batch", "capacity": "cheap"}], ValueError, "capacity.rungs[0]: capacity='cheap'"),
        ([{"backend": "slurm", "capacity": "spot"}], ValueError, "valid names: batch, kubernetes, local, sagemaker"),
    ],
)
def test_bad_rungs_are_refused_naming_the_rung_field_and_allowed_values(
    rungs: list[Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        Ladder(*rungs)
    assert words in str(raised.value)


# ------------------------------------------------------------------ composed: instances= and spot_return=

TYPES = ("ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.g6e.48xlarge")


def _composed(**kwargs: Any) -> Ladder:
    """Batch spot (the task's types), SageMaker spot on three types, SageMaker on-demand on one."""
    from gpu_provider import InstanceFallback

    return Ladder(
        LadderRung(BATCH, "spot"),
        LadderRung(SAGEMAKER, "spot", instance_types=TYPES),
        LadderRung(SAGEMAKER, "on_demand", instance_types=TYPES[2:]),
        instances=InstanceFallback(capacity_wait=60),
        **kwargs,
    )


def _after(ladder: Ladder, events: list[tuple[int, str, str | None, int]], task: tuple[str, ...] = ()) -> Rung:
    """``rung_after`` of interruptions given as ``(attempt, kind, instance type, rung)``."""
    seen = [
        Interruption(a, ladder.rungs[rung].capacity, kind, instance_type=t, rung=rung) for a, kind, t, rung in events
    ]
    return ladder.rung_after(seen, task)


def test_instance_fallback_on_a_ladder_tries_each_rungs_types_in_order_then_the_next_rung() -> None:
    ladder = _composed()
    task = ("p4d.24xlarge", "g6e.48xlarge")  # rung 0 gives none: the task's, in order
    assert _after(ladder, [], task) == Rung(SPOT, "p4d.24xlarge", rung=0)
    # a capacity gap on a type with a next one stays on the rung (absorbed); on the last type, the next rung
    gap0 = (1, CAPACITY_TIMEOUT, "p4d.24xlarge", 0)
    assert _after(ladder, [gap0], task) == Rung(SPOT, "g6e.48xlarge", rung=0)
    gap1 = (2, CAPACITY_TIMEOUT, "g6e.48xlarge", 0)
    assert _after(ladder, [gap0, gap1], task) == Rung(SPOT, TYPES[0], rung=1)
    # on rung 1: its own three types, each with its own wait; the first two have no capacity: the third runs
    gaps = [gap0, gap1, (3, CAPACITY_TIMEOUT, TYPES[0], 1), (4, CAPACITY_TIMEOUT, TYPES[1], 1)]
    assert _after(ladder, gaps, task) == Rung(SPOT, TYPES[2], rung=1)
    # a reclaim is no capacity gap: the next rung, at its first type, wherever the rung's list stood
    assert _after(ladder, [*gaps, (5, PREEMPTED, TYPES[2], 1)], task) == Rung(ON_DEMAND, TYPES[2], rung=2)
    assert _after(ladder, [(1, PREEMPTED, "p4d.24xlarge", 0)], task) == Rung(SPOT, TYPES[0], rung=1)
    # the last rung takes the rest, at its first type again
    assert _after(ladder, [*gaps, (5, PREEMPTED, TYPES[2], 1), (6, PREEMPTED, TYPES[2], 2)], task).rung == 2
    # each type's wait: spot waits spot_wait_timeout per type; on-demand capacity_wait on all types but the last
    assert ladder.capacity_wait_for(SPOT, TYPES[0], ladder.types_for(1)) == ladder.spot_wait_timeout_s
    assert ladder.capacity_wait_for(ON_DEMAND, TYPES[2], ladder.types_for(2)) is None
    # the budget: every type a rung names may take its own gap (1 + 3 + 1), unless told otherwise
    assert ladder.max_interruptions == 5 and _composed(max_interruptions=9).max_interruptions == 9
    assert "instances=InstanceFallback(capacity_wait=60.0)" in repr(ladder)


def test_a_restart_inside_an_attempt_and_an_old_record_without_a_rung_still_move_one_rung_each() -> None:
    ladder = _ladder()
    twice = [Interruption(1, SPOT, PREEMPTED, rung=1), Interruption(1, SPOT, PREEMPTED, rung=1)]
    assert (
        ladder.rung_after(twice[:1]).rung == 2
        and ladder.rung_after([Interruption(1, SPOT, PREEMPTED, rung=0), *twice]).rung == 2
    )
    assert ladder.rung_after([Interruption(1, SPOT, PREEMPTED), Interruption(2, SPOT, PREEMPTED)]).rung == 2


def _spot_return(**kwargs: Any) -> SpotReturn:
    return SpotReturn(instance_types=["p4d.24xlarge"], cooldown=0, **kwargs)


def test_back_to_spot_on_a_ladder_goes_to_the_spot_rung_last_left_and_a_reclaim_there_to_the_rung_after_it() -> None:
    ladder = _ladder(spot_return=_spot_return())  # batch spot, sagemaker spot, sagemaker on-demand
    assert ladder.spot_return is not None and "spot_return=SpotReturn(" in repr(ladder)
    # reclaimed on rung 0 and 1, on-demand on rung 2: back to rung 1, the spot rung the job was last on
    assert ladder.move_target([0, 1, 2]) == 1 and ladder.rung_after_move([0, 1, 2]) == Rung(SPOT, None, rung=1)
    assert ladder.move_target([2]) == 0  # never on a spot rung in this run: the first one
    # moved back to rung 1 (attempt 4) and reclaimed there: rung 2, not the rung three interruptions would name
    seen = [(1, PREEMPTED, None, 0), (2, PREEMPTED, None, 1), (4, PREEMPTED, None, 1)]
    assert _after(ladder, seen) == Rung(ON_DEMAND, None, rung=2)
    # composed with instance fallback too: the move runs the target's first type, a gap there its next type
    both = _composed(spot_return=_spot_return())
    assert both.rung_after_move([0, 1, 1, 2], ()) == Rung(SPOT, TYPES[0], rung=1)
    seen = [(1, PREEMPTED, "p4d.24xlarge", 0), (2, PREEMPTED, TYPES[0], 1), (4, CAPACITY_TIMEOUT, TYPES[0], 1)]
    assert _after(both, seen, ("p4d.24xlarge",)) == Rung(SPOT, TYPES[1], rung=1)
    assert _after(both, [*seen, (5, PREEMPTED, TYPES[1], 1)], ("p4d.24xlarge",)) == Rung(ON_DEMAND, TYPES[2], rung=2)


def test_the_engine_submits_a_move_back_to_spot_on_its_rung_and_reads_spot_capacity_there() -> None:
    import time

    from gpu_provider.backends.base import JobHandle, JobState
    from gpu_provider.engine.attempts import AttemptEngine, Submit
    from gpu_provider.names import MOVED_TO_SPOT
    from gpu_provider.records import AttemptRecord

    west = LadderRung(SAGEMAKER, "spot", instance_types=TYPES[1:2], aws_conn_id="aws_west", region_name="us-west-2")
    # no instance_types on SpotReturn: the readings are of the rungs' own
    ladder = Ladder(
        LadderRung(BATCH, "spot"), west, LadderRung(SAGEMAKER, "on_demand"), spot_return=SpotReturn(cooldown=0)
    )

    def record(attempt: int, rung: int, state: JobState, interruption: str | None) -> AttemptRecord:
        capacity = ladder.rungs[rung].capacity
        handle = JobHandle("sagemaker", f"job-{attempt}", f"gp-a{attempt}", attempt, capacity, time.time())
        r = AttemptRecord.new(handle, try_number=1)
        r.state, r.interruption, r.rung = state, interruption, rung
        return r

    records = [record(1, 0, JobState.PREEMPTED, PREEMPTED), record(2, 1, JobState.PREEMPTED, PREEMPTED)]
    on_demand = record(3, 2, JobState.RUNNING, None)
    engine = AttemptEngine(ladder, [*records, on_demand], try_number=1, backend_name="batch", resumes=True)
    watch = engine.spot_return_watch(on_demand, ("p5.48xlarge",))
    # the readings are of the rung a move goes to (rung 1): its type (ml. removed), its connection and region
    assert watch is not None and watch["rung"] == 1 and watch["instance_types"] == ["p4d.24xlarge"]
    assert (watch["policy"]["aws_conn_id"], watch["policy"]["regions"]) == ("aws_west", ["us-west-2"])
    on_demand.state, on_demand.interruption = JobState.CANCELLED, MOVED_TO_SPOT
    step = engine.ended(on_demand)
    assert step == Submit(attempt=4, capacity=SPOT, rung=1)  # before: Submit(4, spot) with no rung
    assert "Moving back to spot: resubmitting on sagemaker spot (aws_conn_id='aws_west'" in engine.note
    assert "(ladder rung 1) (attempt 4, planned move 1 of at most 2; not an interruption)" in engine.note
    # reclaimed on rung 1 after the move: rung 2 next (interruption 3 of 3), not what the count would name
    engine.records.append(record(4, 1, JobState.PREEMPTED, PREEMPTED))
    assert engine.ended(engine.records[-1]) == Submit(attempt=5, capacity=ON_DEMAND, rung=2)


@pytest.mark.parametrize(
    ("rungs", "missing"),
    [
        ([LadderRung("batch", "spot")], "no on_demand rung"),
        ([LadderRung(SAGEMAKER, "on_demand"), LadderRung(SAGEMAKER, "on_demand")], "no spot rung"),
    ],
)
def test_back_to_spot_on_a_ladder_without_both_a_spot_and_an_on_demand_rung_is_refused(
    rungs: list[LadderRung], missing: str
) -> None:
    with pytest.raises(ValueError) as raised:
        Ladder(*rungs, spot_return=_spot_return())
    text = str(raised.value)
    assert text.startswith("capacity.spot_return=SpotReturn(...) on a Ladder whose rungs are [") and missing in text
    assert "allowed: a ladder with at least one 'spot' and one 'on_demand' rung, or spot_return=None" in text


def test_a_composed_ladder_checks_each_rungs_types_for_its_backend_when_the_dag_is_parsed() -> None:
    from gpu_provider import InstanceFallback

    resources = GpuResources(gpus=8, instance_types=("p4d.24xlarge", "g6e.48xlarge"))
    ladder = Ladder(
        LadderRung(SAGEMAKER, "spot", instance_types=TYPES),
        LadderRung(SAGEMAKER, "on_demand"),
        instances=InstanceFallback(),
        spot_return=_spot_return(),
    )
    assert [b.name for b in ladder.validate_rungs(resources, image="trainer:1")] == ["sagemaker", "sagemaker"]
    # a type the price table does not know, on the rung that names it
    unknown = Ladder(LadderRung(SAGEMAKER, "spot", instance_types=["ml.p9.96xlarge"]), instances=InstanceFallback())
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(sagemaker, spot\): resources.instance_types: 'ml.p9"):
        unknown.validate_rungs(resources, image="trainer:1")
    # Batch runs an ordered preference through a job queue per type: none declared for the task's types here
    batch = Ladder(LadderRung(BATCH, "spot"), instances=InstanceFallback())
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(batch, spot\): .*p4d.24xlarge"):
        batch.validate_rungs(resources, image="trainer:1")
    # back to spot reads spot capacity of each spot rung's types: a spot rung with none to read is named
    bare = Ladder(LadderRung(SAGEMAKER, "spot"), LadderRung(SAGEMAKER, "on_demand"), spot_return=SpotReturn())
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(sagemaker, spot\): capacity.spot_return needs"):
        bare.validate_rungs(GpuResources(gpus=8), image="trainer:1")


def test_every_rung_is_validated_by_its_own_backend() -> None:
    ladder = _ladder()
    backends = ladder.validate_rungs(GpuResources(gpus=8), image="trainer:1")
    assert [b.name for b in backends] == ["batch", "sagemaker", "sagemaker"]
    # Batch cannot run multi-node jobs on spot: the error names the rung
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(batch, spot\): resources.nodes=2 with spot"):
        ladder.validate_rungs(GpuResources(gpus=8, nodes=2), image="trainer:1")
    # Batch's compute environment picks the instance type: a rung's instance_types is refused there
    typed = Ladder(LadderRung(BATCH, "spot", instance_types=["p4d.24xlarge"]))
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(batch, spot\): resources.instance_types="):
        typed.validate_rungs(GpuResources(gpus=8), image="trainer:1")
    # an option the rung's backend does not take: its key, and what the backend takes
    bad = Ladder(LadderRung(BATCH, "spot"), LadderRung(SAGEMAKER, "spot", spot_queue="q"))
    with pytest.raises(
        ValueError, match=r"capacity.rungs\[1\] \(sagemaker, spot\): .*unknown option\(s\) 'spot_queue'"
    ):
        bad.validate_rungs(GpuResources(gpus=8), image="trainer:1")
    # a rung with no image, on a backend that runs containers
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(batch, spot\): image=None"):
        ladder.validate_rungs(GpuResources(gpus=8), image=None)
    ladder.validate_rungs(GpuResources(gpus=8), image=None, image_known=False)  # a templated image: checked later


def test_one_checkpoint_for_every_rung_a_local_path_with_a_remote_rung_is_refused() -> None:
    ladder = _ladder()
    ladder.check_checkpoint("s3://ckpt/run")
    ladder.check_checkpoint(None)
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(batch, spot\).*give an s3:// URI"):
        ladder.check_checkpoint("file:///tmp/ckpt")
    Ladder(LadderRung("local", "spot"), LadderRung("local", "on_demand")).check_checkpoint("file:///tmp/ckpt")


def _operator(**kwargs: Any) -> Any:
    from gpu_provider.operators import GpuJobOperator

    args: dict[str, Any] = {
        "task_id": "train",
        "command": ["python", "train.py"],
        "image": "trainer:1",
        "capacity": _ladder(),
        "checkpoint": "s3://ckpt/train",
    }
    return GpuJobOperator(**{**args, **kwargs})


def test_the_operator_checks_a_ladder_when_the_dag_is_parsed() -> None:
    op = _operator()
    assert op.backend == {**BATCH} and isinstance(op.capacity, Ladder)  # the task's backend: the first rung's
    with pytest.raises(ValueError, match=r"backend='sagemaker' with capacity=Ladder\(...\).*leave backend= out"):
        _operator(backend="sagemaker")
    with pytest.raises(ValueError, match=r"checkpoint='file:///tmp/ckpt' with capacity.rungs\[0\] \(batch, spot\)"):
        _operator(checkpoint="file:///tmp/ckpt")
    with pytest.raises(ValueError, match=r"capacity.rungs\[0\] \(batch, spot\): resources.nodes=2 with spot"):
        _operator(resources=GpuResources(gpus=8, nodes=2))
    with pytest.raises(ValueError, match=r"capacity.rungs\[1\] \(sagemaker, spot\): max_runtime="):
        _operator(max_runtime=29 * 24 * 3600)
    # templated values are checked after rendering, not now
    _operator(image="{{ params.image }}", checkpoint="{{ params.ckpt }}")


def test_a_ladders_worst_case_is_its_dearest_rung_at_that_services_price() -> None:
    """``max_cost_usd``: before a submit, the worst case of a ladder is priced rung by rung on each rung's own
    service (SageMaker's ``ml.`` instances), not at the first rung's (Batch's EC2) prices."""
    import logging

    from gpu_provider.engine.attempts import Submit
    from gpu_provider.operators._ladder import rung_places, validate_rungs
    from gpu_provider.spend.budget import SpendControl

    op = _operator(max_runtime=3600, max_cost_usd=1.0)
    backends = validate_rungs(op, "trainer:1", None)
    control = SpendControl(
        backends[0],
        op.gpu_resources,
        op.capacity,
        log=logging.getLogger("test.ladder"),
        max_cost_usd=1.0,
        max_runtime_s=3600,
        emit_metrics=False,
    )
    first_rung_only, text = control.worst_case(Submit(1, "spot", rung=0), [])
    assert "ml." not in text
    control.rung_places = rung_places(op, tuple(backends))
    total, text = control.worst_case(Submit(1, "spot", rung=0), [])
    assert "(ml.p4d.24xlarge on-demand" in text and total > first_rung_only, text


def test_a_rung_no_configured_reaper_sweeps_is_warned_about_when_the_dag_is_parsed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rung in another region or account is swept only when the reaper names its place (issue 36, item 6)."""
    import logging

    west = {**SAGEMAKER, "aws_conn_id": "aws_west", "region_name": "us-west-2"}
    ladder = Ladder(LadderRung(BATCH, "spot"), LadderRung(west, "on_demand"))
    reapers = [BATCH, SAGEMAKER]
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS", json.dumps(reapers))
    with caplog.at_level(logging.WARNING):
        _operator(capacity=ladder)
    (warned,) = [r.getMessage() for r in caplog.records if "outside the reaper's scope" in r.getMessage()]
    assert "capacity.rungs[1] (sagemaker, on-demand) runs on sagemaker (aws_conn_id='aws_west', " in warned
    assert "region_name='us-west-2')" in warned and "[gpu_provider] reaper_backends sweeps batch" in warned
    assert "add the rung's backend" in warned
    # the reaper names the rung's place: no warning; nor for a Batch rung whose queues it sweeps
    caplog.clear()
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS", json.dumps([*reapers, west]))
    with caplog.at_level(logging.WARNING):
        _operator(capacity=ladder)
    assert not [r for r in caplog.records if "outside the reaper's scope" in r.getMessage()]
    # a Batch rung on a queue the reaper's Batch backend does not list is outside too
    other_queue = Ladder(LadderRung({**BATCH, "spot_queue": "team-b-spot"}, "spot"), LadderRung(BATCH, "on_demand"))
    with caplog.at_level(logging.WARNING):
        _operator(capacity=other_queue)
    (warned,) = [r.getMessage() for r in caplog.records if "outside the reaper's scope" in r.getMessage()]
    assert "capacity.rungs[0] (batch, spot) runs on batch (" in warned and "queues " in warned
    assert "team-b-spot" in warned
