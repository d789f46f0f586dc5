"""The capacity ladder: rungs on several backends (or regions) on one checkpoint, and their parse-time checks."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_provider import GpuResources, Ladder, LadderRung
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


def test_instance_fallback_is_refused_on_a_ladder_with_what_to_do_instead() -> None:
    from gpu_provider import InstanceFallback

    with pytest.raises(ValueError, match="give each rung its own instance_types"):
        Ladder(LadderRung("batch", "spot"), instances=InstanceFallback())


def test_back_to_spot_is_refused_on_a_ladder_with_what_to_do_instead() -> None:
    from gpu_provider import SpotReturn

    with pytest.raises(ValueError, match=r"Ladder\(spot_return=SpotReturn\(\.\.\.\)\) is not supported"):
        Ladder(LadderRung("batch", "spot"), spot_return=SpotReturn(instance_types=["p4d.24xlarge"]))


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
