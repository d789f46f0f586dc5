"""The capacity package: instance fallback composed with the capacity policies, and its parse-time checks."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_provider import recovery
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.capacity import (
    InstanceFallback,
    Interruption,
    OnDemand,
    Rung,
    Spot,
    SpotFallback,
    validate_instance_fallback,
)
from gpu_provider.names import CAPACITY_TIMEOUT, ON_DEMAND, PREEMPTED, SPOT
from gpu_provider.operators import GpuJobOperator

TYPES = ("p5.48xlarge", "p4d.24xlarge", "g6e.48xlarge")


def _walk(policy: Any, kinds: list[str]) -> list[Rung]:
    """The rungs of successive attempts when each one ends with the next of ``kinds``."""
    seen: list[Interruption] = []
    rungs = [policy.rung_after(seen, TYPES)]
    for attempt, kind in enumerate(kinds, start=1):
        rung = rungs[-1]
        seen.append(Interruption(attempt, rung.capacity, kind, rung.instance_type))
        rungs.append(policy.rung_after(seen, TYPES))
    return rungs


def test_old_imports_still_name_the_same_policy_classes() -> None:
    assert (recovery.SpotFallback, recovery.Interruption, recovery.resolve_capacity("spot")) == (
        SpotFallback,
        Interruption,
        Spot(),
    )


def test_spot_fallback_tries_every_type_on_spot_then_starts_again_at_the_first_on_demand() -> None:
    policy = SpotFallback(instances=InstanceFallback(capacity_wait=60), max_interruptions=10)
    rungs = _walk(policy, [CAPACITY_TIMEOUT] * 5)
    assert [(r.capacity, r.instance_type) for r in rungs] == [
        (SPOT, "p5.48xlarge"),
        (SPOT, "p4d.24xlarge"),
        (SPOT, "g6e.48xlarge"),
        (ON_DEMAND, "p5.48xlarge"),
        (ON_DEMAND, "p4d.24xlarge"),
        (ON_DEMAND, "g6e.48xlarge"),
    ]
    # each type waits on its own: spot its spot_wait_timeout, on-demand capacity_wait except the last type
    waits = [policy.capacity_wait_for(r.capacity, r.instance_type, TYPES) for r in rungs]
    assert waits == [1800.0, 1800.0, 1800.0, 60.0, 60.0, None]


def test_a_spot_reclaim_goes_to_the_policy_and_the_next_rung_starts_at_the_preferred_type() -> None:
    policy = SpotFallback(instances=InstanceFallback(), after_preemptions=2, max_interruptions=10)
    rungs = _walk(policy, [CAPACITY_TIMEOUT, PREEMPTED, PREEMPTED])
    assert [(r.capacity, r.instance_type) for r in rungs] == [
        (SPOT, "p5.48xlarge"),
        (SPOT, "p4d.24xlarge"),  # p5 never came
        (SPOT, "p5.48xlarge"),  # reclaimed on p4d: spot again (1 of 2 reclaims), from the first type
        (ON_DEMAND, "p5.48xlarge"),  # second reclaim: the policy moves on
    ]


def test_spot_only_wraps_around_to_the_first_type_after_the_last() -> None:
    rungs = _walk(Spot(spot_wait_timeout=5, instances=InstanceFallback()), [CAPACITY_TIMEOUT] * 3)
    assert [r.instance_type for r in rungs] == [*TYPES, "p5.48xlarge"]
    assert {r.capacity for r in rungs} == {SPOT}


def test_without_instance_fallback_a_policy_chooses_no_instance_type() -> None:
    assert SpotFallback().rung_after([], TYPES) == Rung(SPOT)
    assert OnDemand().capacity_wait_for(ON_DEMAND, None, TYPES) is None


def test_policies_with_instance_fallback_compare_and_hash_by_value() -> None:
    a = SpotFallback(instances=InstanceFallback(capacity_wait=30))
    assert a == SpotFallback(instances=InstanceFallback(capacity_wait=30)) and hash(a) == hash(
        SpotFallback(instances=InstanceFallback(capacity_wait=30))
    )
    assert a != SpotFallback(instances=InstanceFallback(capacity_wait=31))


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("fallback", TypeError, ["capacity.instances='fallback'", "InstanceFallback(...)"]),
        (InstanceFallback, TypeError, ["capacity.instances=", "InstanceFallback(...)"]),
    ],
)
def test_instances_must_be_an_instance_fallback(value: Any, error: type[Exception], words: list[str]) -> None:
    with pytest.raises(error) as err:
        SpotFallback(instances=value)
    assert all(w in str(err.value) for w in words), err.value


def test_capacity_wait_is_bounded_and_named() -> None:
    with pytest.raises(ValueError, match=r"capacity.instances.capacity_wait=-1 is out of range: .*0 to 86400"):
        InstanceFallback(capacity_wait=-1)


@pytest.mark.parametrize(
    ("types", "words"),
    [
        ((), ["resources.instance_types=[]", "name them"]),
        (("p5.48xlarge", "p5.48xlarge"), ["names p5.48xlarge more than once"]),
        (("p5.48xlarge", "x9.huge"), ["'x9.huge' is not in the price table", "allowed: ", "g6e.48xlarge"]),
    ],
)
def test_an_ordered_preference_is_checked_against_the_price_table(types: tuple[str, ...], words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        validate_instance_fallback(types)
    assert all(w in str(err.value) for w in words), err.value


def test_each_backend_says_whether_it_can_run_each_type() -> None:
    validate_instance_fallback(TYPES, backend=KubernetesBackend())
    validate_instance_fallback(
        TYPES, backend=SageMakerBackend(role_arn="arn:aws:iam::123456789012:role/r", output_path="s3://bucket/out")
    )
    sagemaker = SageMakerBackend(role_arn="arn:aws:iam::123456789012:role/r", output_path="s3://bucket/out")
    with pytest.raises(ValueError, match=r"'x9.huge' is not a SageMaker training instance of the price table"):
        sagemaker.validate_instance_fallback(["p5.48xlarge", "x9.huge"])
    batch = BatchBackend(
        spot_queue="s", on_demand_queue="o", queues_by_instance_type={"p5.48xlarge": "p5", "p4d.24xlarge": "p4d"}
    )
    with pytest.raises(ValueError) as err:
        validate_instance_fallback(TYPES, backend=batch)
    assert "'g6e.48xlarge' has no Batch job queue" in str(err.value)
    assert "batch_queues_by_instance_type" in str(err.value) and "allowed now: p4d.24xlarge, p5.48xlarge" in str(
        err.value
    )


def test_a_task_naming_types_a_backend_cannot_place_is_refused_when_the_dag_is_parsed() -> None:
    def op(backend: Any, types: tuple[str, ...]) -> GpuJobOperator:
        return GpuJobOperator(
            task_id="t",
            command=["python", "train.py"],
            image="trainer:1",
            backend=backend,
            resources={"gpus": 1, "instance_types": types},
            capacity=OnDemand(instances=InstanceFallback()),
        )

    with pytest.raises(ValueError, match=r"'g5\.huge' is not in the price table .*allowed: "):
        op({"name": "kubernetes"}, ("p5.48xlarge", "g5.huge"))
    with pytest.raises(ValueError, match=r"'p5\.48xlarge' has no Batch job queue"):
        op({"name": "batch", "spot_queue": "s", "on_demand_queue": "o"}, ("p5.48xlarge",))
    assert op({"name": "kubernetes"}, TYPES).gpu_resources.instance_types == TYPES
    # the same types are fine as a set on Kubernetes (no fallback: any of them, one attempt)
    GpuJobOperator(
        task_id="t2", command=["x"], image="i:1", backend={"name": "kubernetes"}, resources={"instance_types": TYPES}
    )


def test_the_local_backend_places_a_type_by_its_nvidia_gpu_model() -> None:
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.backends.local.gpus import gpu_model

    LocalBackend().validate_instance_fallback(TYPES)  # h100, a100, l40s
    with pytest.raises(ValueError, match=r"'trn1.2xlarge' has no NVIDIA GPU model .*accelerator: trn1.*allowed: "):
        LocalBackend().validate_instance_fallback(["p5.48xlarge", "trn1.2xlarge"])
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA L4", "NVIDIA A100-SXM4-80GB", "Tesla T4", "Quadro X"]
    assert [gpu_model(n) for n in names] == ["h100", "l40s", "l4", "a100-80gb", "t4", None]


def test_a_request_runs_only_a_type_the_task_named() -> None:
    from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
    from gpu_provider.job import GpuResources

    identity = JobIdentity(TaskKey("d", "t", "r"), 1, 1, ON_DEMAND)
    resources = GpuResources(instance_types=TYPES)
    assert JobRequest(identity, ("x",), {}, resources, ON_DEMAND, instance_type="g6e.48xlarge").instance_type
    with pytest.raises(ValueError, match=r"instance_type='g5.xlarge' is not one of resources.instance_types"):
        JobRequest(identity, ("x",), {}, resources, ON_DEMAND, instance_type="g5.xlarge")
