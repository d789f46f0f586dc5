"""Kubernetes backend: every manifest it generates passes kubernetes-validate (strict, the official
OpenAPI schemas) and our checks of what the schema misses; the shipped NodePools and EC2NodeClass
validate against Karpenter's CRD schemas, the PriorityClasses and RBAC against kubernetes-validate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.kubernetes.manifests import (
    CAPACITY_TYPE,
    COMPLETION_INDEX,
    DO_NOT_DISRUPT,
    GPU_NAME,
    INSTANCE_TYPE,
    NODEPOOL,
    server_side_problems,
)
from gpu_provider.job import GpuResources
from tests.harness import REPO

#: the oldest Kubernetes the backend supports: podFailurePolicy and Indexed Jobs are GA from 1.31
K8S_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
SCHEMAS = Path("/work/shared/schemas/karpenter")
KARPENTER = REPO / "docker" / "karpenter"


def request(
    *,
    nodes: int = 1,
    gpus: float = 1,
    capacity: str = names.SPOT,
    gpu_type: str | None = None,
    instance_types: tuple[str, ...] = (),
    priority: int | None = None,
    max_runtime_s: float | None = 3600,
    task: TaskKey | None = None,
) -> JobRequest:
    task = task or TaskKey("ml_pipeline_with_a_long_dag_id", "train_the_model", "scheduled__2026-12-01T00:00:00+00:00")
    return JobRequest(
        identity=JobIdentity(task, try_number=2, attempt=3, capacity=capacity, team="ml-infra"),
        command=("python", "-m", "gpu_provider.examples.train", "--epochs", "3"),
        env={
            names.ENV_ATTEMPT: "3",
            names.ENV_CAPACITY: capacity,
            names.ENV_RESUME_FROM: "s3://b/ckpt/ckpt-0000000010",
        },
        resources=GpuResources(
            gpus=gpus, nodes=nodes, gpu_type=gpu_type, cpu=7, memory="28Gi", instance_types=instance_types
        ),
        capacity=capacity,
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1.4",
        max_runtime_s=max_runtime_s,
        priority=priority,
    )


def full_backend() -> KubernetesBackend:
    """Every option set, so every optional part of the manifests is generated."""
    return KubernetesBackend(
        namespace="gpu-jobs",
        service_account="gpu-jobs",
        image_pull_secrets="ecr-pull, registry-2",
        node_selector={"team": "ml"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        secrets={"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "wandb/api-key"},
        fractional_gpu_resource="nvidia.com/mig-1g.10gb",
    )


CASES = {
    "one node, spot, GPU model": request(gpu_type="a100-80gb"),
    "one node, on-demand, instance types": request(
        capacity=names.ON_DEMAND, instance_types=("g5.2xlarge", "g6.2xlarge")
    ),
    "one node, fractional GPU (MIG)": request(gpus=0.5, priority=150, max_runtime_s=None),
    "two nodes, spot": request(nodes=2, gpu_type="h100", priority=-5),
    "eight nodes, on-demand, mapped task": request(
        nodes=8, capacity=names.ON_DEMAND, task=TaskKey("d" * 200, "t" * 200, "r" * 250, map_index=117)
    ),
}


def validate_strict(manifest: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", [KubernetesBackend(), full_backend()], ids=["defaults", "every-option"])
def test_every_generated_manifest_passes_strict_schema_validation_and_server_side_rules(
    case: str, backend: KubernetesBackend
) -> None:
    req = CASES[case]
    if req.resources.fractional and not backend.fractional_gpu_resource:
        with pytest.raises(ValueError, match="fractional_gpu_resource"):
            backend.manifests(req)
        return
    manifests = backend.manifests(req)
    assert [m["kind"] for m in manifests] == (["Pod"] if req.resources.nodes == 1 else ["Job", "Service"])
    for manifest in manifests:
        validate_strict(manifest)
        assert server_side_problems(manifest) == [], manifest


def test_single_node_pod_places_on_the_capacity_and_node_pool_and_marks_identity() -> None:
    backend = full_backend()
    pod = backend.manifests(request(gpu_type="a100-80gb", priority=150))[0]
    spec, meta = pod["spec"], pod["metadata"]
    assert spec["nodeSelector"] == {
        "team": "ml",
        CAPACITY_TYPE: "spot",
        NODEPOOL: "gpu-spot",
        GPU_NAME: "a100",
        "karpenter.k8s.aws/instance-gpu-memory": "81920",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["tolerations"][1]["key"] == "dedicated"
    container = spec["containers"][0]
    assert (
        container["resources"]["requests"]["nvidia.com/gpu"]
        == container["resources"]["limits"]["nvidia.com/gpu"]
        == "1"
    )
    assert (
        container["resources"]["requests"]["memory"] == "28672Mi"
        and container["resources"]["requests"]["cpu"] == "7000m"
    )
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 3600
    assert spec["priorityClassName"] == "gpu-high"
    assert spec["serviceAccountName"] == "gpu-jobs"
    assert spec["imagePullSecrets"] == [{"name": "ecr-pull"}, {"name": "registry-2"}]
    assert meta["annotations"][DO_NOT_DISRUPT] == "true"
    assert meta["annotations"][names.TAG_RUN_ID] == "scheduled__2026-12-01T00:00:00+00:00"
    labels = meta["labels"]
    assert labels[names.TAG_CAPACITY] == "spot" and labels[names.TAG_TEAM] == "ml-infra"
    assert labels[names.TAG_ATTEMPT] == "3" and labels[names.TAG_TRY_NUMBER] == "2"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_RANK"]["value"] == "0" and env["MASTER_ADDR"]["value"] == "127.0.0.1"
    assert env[names.ENV_RESUME_FROM]["value"] == "s3://b/ckpt/ckpt-0000000010"
    # secrets by reference only: the value never passes through Airflow or the manifest
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}


def test_instance_types_become_a_required_node_affinity_and_fractions_a_mig_resource() -> None:
    backend = full_backend()
    pod = backend.manifests(request(capacity=names.ON_DEMAND, instance_types=("g5.2xlarge", "g6.2xlarge")))[0]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": INSTANCE_TYPE, "operator": "In", "values": ["g5.2xlarge", "g6.2xlarge"]}]}
    ]
    assert pod["spec"]["nodeSelector"][NODEPOOL] == "gpu-on-demand"
    shared = backend.manifests(request(gpus=0.5))[0]["spec"]["containers"][0]["resources"]
    assert shared["limits"] == {"nvidia.com/mig-1g.10gb": "1", "memory": "28672Mi"}
    assert "nvidia.com/gpu" not in shared["requests"]


def test_multi_node_is_an_indexed_job_with_a_headless_service_and_torchrun_rendezvous() -> None:
    job, service = KubernetesBackend(namespace="gpu-jobs").manifests(request(nodes=2))
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        2,
        2,
        0,
    )
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1]["action"] == "Ignore" and rules[1]["onExitCodes"]["values"] == [143]
    assert rules[2] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0]},
    }
    assert spec["ttlSecondsAfterFinished"] == 3600 and spec["activeDeadlineSeconds"] == 3600
    pod = spec["template"]["spec"]
    name = job["metadata"]["name"]
    assert pod["subdomain"] == service["metadata"]["name"] == name
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == f"{name}-0.{name}.gpu-jobs.svc.cluster.local"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{COMPLETION_INDEX}']"
    assert env["NNODES"]["value"] == "2" and env["MASTER_PORT"]["value"] == "29500"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"gpu-provider/job": name}
    assert spec["template"]["metadata"]["annotations"][DO_NOT_DISRUPT] == "true"


def test_server_side_rules_the_schema_misses_are_caught() -> None:
    pod = KubernetesBackend().manifests(request())[0]
    job, service = KubernetesBackend().manifests(request(nodes=2))

    def broken(manifest: dict[str, Any], change: Any) -> list[str]:
        import copy

        copy_ = copy.deepcopy(manifest)
        change(copy_)
        validate_strict(copy_)  # the schema lets each of these pass...
        return server_side_problems(copy_)  # ...the API server would not

    container = lambda m: m["spec"]["containers"][0]  # noqa: E731
    cases = [
        (pod, lambda m: m["metadata"]["labels"].update({"gpu-provider/dag-id": "x" * 64}), "at most 63"),
        (pod, lambda m: m["metadata"].update({"name": "Bad_Name"}), "DNS-1123"),
        (pod, lambda m: container(m)["resources"]["limits"].update({"memory": "28 GiB"}), "not a quantity"),
        (pod, lambda m: m["spec"]["tolerations"].append({"key": "a", "operator": "Equals"}), "operator"),
        (pod, lambda m: container(m)["resources"]["limits"].update({"nvidia.com/gpu": "2"}), "must equal limits"),
        (job, lambda m: m["spec"]["template"]["spec"].update({"restartPolicy": "Always"}), "restartPolicy"),
        (job, lambda m: m["metadata"].update({"name": "j" * 64}), "DNS-1123 label"),
        (service, lambda m: m["metadata"].update({"name": "1-starts-with-a-digit"}), "DNS-1035"),
    ]
    for manifest, change, expected in cases:
        problems = broken(manifest, change)
        assert any(expected in p for p in problems), (expected, problems)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _crd_schema(file: str, version: str = "v1") -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / file).read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(found["schema"]["openAPIV3Schema"])


def test_shipped_node_pools_and_node_class_validate_against_the_karpenter_crds() -> None:
    pools = _documents(KARPENTER / "nodepool.yaml")
    (node_class,) = _documents(KARPENTER / "ec2nodeclass.yaml")
    pool_schema = _crd_schema("karpenter.sh_nodepools.yaml")
    class_schema = _crd_schema("karpenter.k8s.aws_ec2nodeclasses.yaml")
    for pool in pools:
        jsonschema.validate(pool, pool_schema)
    jsonschema.validate(node_class, class_schema)

    by_name = {p["metadata"]["name"]: p for p in pools}
    backend = KubernetesBackend()
    assert set(by_name) == {backend.spot_node_pool, backend.on_demand_node_pool}
    for name, capacity in ((backend.spot_node_pool, "spot"), (backend.on_demand_node_pool, "on-demand")):
        spec = by_name[name]["spec"]
        requirements = {r["key"]: r["values"] for r in spec["template"]["spec"]["requirements"]}
        assert requirements[CAPACITY_TYPE] == [capacity]
        assert set(requirements["karpenter.k8s.aws/instance-family"]) == {"g5", "g6", "p4d", "p5"}
        assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in spec["template"]["spec"]["taints"]
        assert "nvidia.com/gpu" in spec["limits"]
        # busy GPU nodes are never consolidated: only empty ones
        assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
        assert spec["template"]["spec"]["nodeClassRef"]["name"] == node_class["metadata"]["name"]

    # the schema check can fail: a policy Karpenter does not have is refused
    bad = {
        **pools[0],
        "spec": {**pools[0]["spec"], "disruption": {"consolidationPolicy": "Sometimes", "consolidateAfter": "5m"}},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, pool_schema)


def test_shipped_priority_classes_and_rbac_validate_and_cover_what_the_backend_uses() -> None:
    classes = _documents(KARPENTER / "priorityclasses.yaml")
    rbac = _documents(KARPENTER / "rbac.yaml")
    for manifest in classes + rbac:
        validate_strict(manifest)
    assert {c["metadata"]["name"] for c in classes} == set(KubernetesBackend().priority_classes)
    (role,) = [d for d in rbac if d["kind"] == "Role"]
    granted = {
        (group, resource, verb)
        for r in role["rules"]
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }
    needed = {
        ("", "pods", "create"), ("", "pods", "list"), ("", "pods", "patch"), ("", "pods", "delete"),
        ("", "pods", "get"),
        ("", "pods/log", "get"), ("", "services", "create"), ("", "services", "delete"),
        ("", "events", "create"), ("", "events", "list"),
        ("batch", "jobs", "create"), ("batch", "jobs", "list"), ("batch", "jobs", "patch"), ("batch", "jobs", "delete"),
        ("batch", "jobs", "get"),
    }  # fmt: skip
    assert needed <= granted, needed - granted
