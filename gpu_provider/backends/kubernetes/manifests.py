"""What the Kubernetes backend creates: the Pod of a single-node attempt, the Indexed Job and headless
Service of a multi-node one, and the checks the API server makes that the OpenAPI schema does not
(DNS-1123 names, label syntax and lengths, quantities), so a bad manifest fails with our message
before it is sent.

Plain dictionaries in the API's JSON form, built without the ``kubernetes`` package (the client
sends them as they are). Placement is Karpenter's vocabulary: ``karpenter.sh/capacity-type``,
``karpenter.sh/nodepool``, ``karpenter.k8s.aws/instance-gpu-name``, ``node.kubernetes.io/instance-type``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobRequest

# --- label and annotation keys ---------------------------------------------------------------------

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "airflow-provider-gpu"
#: the attempt's name on its Pod, Job, Service and the Job's pods (what a poll matches pods by)
LABEL_ATTEMPT_NAME = names.TAG_PREFIX + "job"
#: the whole task identity (label values allow 63 characters of a narrow alphabet; run ids do not fit)
ANNOTATION_DAG_ID = names.TAG_DAG_ID
ANNOTATION_TASK_ID = names.TAG_TASK_ID
ANNOTATION_RUN_ID = names.TAG_RUN_ID
ANNOTATION_GPUS = names.TAG_GPUS
ANNOTATION_MAX_RUNTIME = names.TAG_PREFIX + "max-runtime-s"
#: keeps Karpenter's consolidation and drift from evicting a running job's node
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
NODEPOOL = "karpenter.sh/nodepool"
GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
#: the node label an attempt keeps away from after a node fault (node anti-affinity)
HOSTNAME = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTAINER = "main"
#: the kinds of an attempt's object: a Pod (one node) or an Indexed Job with its Service (several)
POD, JOB = "Pod", "Job"


def kind_of(handle: JobHandle) -> str:
    """The kind of the attempt's object, :data:`POD` or :data:`JOB`, as its handle says."""
    return str(handle.extra.get("kind") or POD)


#: ``gpu_type=`` -> the ``karpenter.k8s.aws/instance-gpu-name`` value (and GPU memory in MiB where the
#: name alone is ambiguous); Trainium and Inferentia are Neuron devices, not GPUs
GPU_NODE_LABELS: dict[str, dict[str, str]] = {
    "t4": {GPU_NAME: "t4"},
    "a10g": {GPU_NAME: "a10g"},
    "l4": {GPU_NAME: "l4"},
    "l40s": {GPU_NAME: "l40s"},
    "v100": {GPU_NAME: "v100"},
    "a100": {GPU_NAME: "a100"},
    "a100-80gb": {GPU_NAME: "a100", GPU_MEMORY: "81920"},
    "h100": {GPU_NAME: "h100"},
    "h200": {GPU_NAME: "h200"},
    "b200": {GPU_NAME: "b200"},
}

# --- what the API server checks ---------------------------------------------------------------------

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TAINT_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")


def is_dns1123_label(text: str) -> bool:
    return len(text) <= 63 and bool(_DNS1123_LABEL.fullmatch(text))


def is_dns1123_subdomain(text: str) -> bool:
    return len(text) <= 253 and bool(_DNS1123_SUBDOMAIN.fullmatch(text))


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label or annotation key (``None``: it is)."""
    prefix, slash, name = key.rpartition("/")
    if slash and not is_dns1123_subdomain(prefix):
        return f"its prefix {prefix!r} is not a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return "its name part must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        return "a label value must be at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    return None


def label_value(text: str) -> str:
    """``text`` made into a valid label value (cut to 63 characters, unsafe characters as '-')."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return value.strip("-_.")


def is_quantity(text: str) -> bool:
    return bool(_QUANTITY.fullmatch(text))


def server_side_problems(manifest: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in a Pod, Job or Service that its OpenAPI schema lets pass.

    :return: one message per problem, naming the field and the value
    """
    problems: list[str] = []
    kind = str(manifest.get("kind"))
    meta = manifest.get("metadata") or {}
    name = str(meta.get("name") or "")
    if kind == "Service":
        if not (len(name) <= 63 and _DNS1035_LABEL.fullmatch(name)):
            problems.append(f"metadata.name={name!r}: a Service name must be a DNS-1035 label (<= 63 chars)")
    elif kind == "Job":
        # the pods' hostname is <job name>-<index>: a DNS-1123 label too
        if not is_dns1123_label(name):
            problems.append(f"metadata.name={name!r}: an Indexed Job's name must be a DNS-1123 label (<= 63 chars)")
    elif not is_dns1123_subdomain(name):
        problems.append(f"metadata.name={name!r}: must be a DNS-1123 subdomain (<= 253 chars)")
    problems += _meta_problems("metadata", meta)
    if kind == "Pod":
        problems += _pod_spec_problems("spec", manifest.get("spec") or {})
    elif kind == "Job":
        spec = manifest.get("spec") or {}
        template = spec.get("template") or {}
        problems += _meta_problems("spec.template.metadata", template.get("metadata") or {})
        problems += _pod_spec_problems("spec.template.spec", template.get("spec") or {})
        policy = (template.get("spec") or {}).get("restartPolicy")
        if spec.get("podFailurePolicy") and policy != "Never":
            problems.append(f"spec.template.spec.restartPolicy={policy!r}: a podFailurePolicy needs 'Never'")
        if policy not in ("Never", "OnFailure"):
            problems.append(f"spec.template.spec.restartPolicy={policy!r}: a Job's pods allow Never or OnFailure")
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
            problems.append("spec.completions: an Indexed Job needs completions")
        selector = (template.get("spec") or {}).get("subdomain")
        if selector is not None and not is_dns1123_label(str(selector)):
            problems.append(f"spec.template.spec.subdomain={selector!r}: must be a DNS-1123 label")
    elif kind == "Service":
        for key, value in ((manifest.get("spec") or {}).get("selector") or {}).items():
            problems += _label_problems("spec.selector", key, value)
    return problems


def _meta_problems(where: str, meta: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for key, value in (meta.get("labels") or {}).items():
        problems += _label_problems(f"{where}.labels", key, value)
    for key in meta.get("annotations") or {}:
        why = label_key_problem(key)
        if why:
            problems.append(f"{where}.annotations key {key!r}: {why}")
    return problems


def _label_problems(where: str, key: str, value: Any) -> list[str]:
    problems = []
    why = label_key_problem(key)
    if why:
        problems.append(f"{where} key {key!r}: {why}")
    why = label_value_problem(str(value))
    if why:
        problems.append(f"{where}[{key!r}]={value!r}: {why}")
    return problems


def _pod_spec_problems(where: str, spec: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for key, value in (spec.get("nodeSelector") or {}).items():
        problems += _label_problems(f"{where}.nodeSelector", key, value)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        operator = toleration.get("operator", "Equal")
        if operator not in _TOLERATION_OPERATORS:
            problems.append(f"{where}.tolerations[{i}].operator={operator!r}: allowed: {_TOLERATION_OPERATORS}")
        if operator == "Exists" and toleration.get("value"):
            problems.append(f"{where}.tolerations[{i}]: operator 'Exists' takes no value")
        if toleration.get("effect", "") not in _TAINT_EFFECTS:
            problems.append(f"{where}.tolerations[{i}].effect={toleration.get('effect')!r}: allowed: {_TAINT_EFFECTS}")
    for name in [s.get("name") for s in spec.get("imagePullSecrets") or []] + [spec.get("serviceAccountName")]:
        if name is not None and not is_dns1123_subdomain(str(name)):
            problems.append(f"{where}: {name!r} is not a valid object name (DNS-1123 subdomain)")
    if spec.get("priorityClassName") is not None and not is_dns1123_subdomain(str(spec["priorityClassName"])):
        problems.append(f"{where}.priorityClassName={spec['priorityClassName']!r}: not a DNS-1123 subdomain")
    for c, container in enumerate(spec.get("containers") or []):
        cw = f"{where}.containers[{c}]"
        if not is_dns1123_label(str(container.get("name"))):
            problems.append(f"{cw}.name={container.get('name')!r}: must be a DNS-1123 label")
        for e, env in enumerate(container.get("env") or []):
            if not _ENV_NAME.fullmatch(str(env.get("name"))):
                problems.append(f"{cw}.env[{e}].name={env.get('name')!r}: not a valid environment variable name")
        resources = container.get("resources") or {}
        for part in ("requests", "limits"):
            for key, value in (resources.get(part) or {}).items():
                if not is_quantity(str(value)):
                    problems.append(
                        f"{cw}.resources.{part}[{key!r}]={value!r}: not a quantity (e.g. '1', '500m', '4Gi')"
                    )
        # extended resources (nvidia.com/gpu...) cannot be overcommitted: requests must equal limits
        limits = resources.get("limits") or {}
        for key, value in (resources.get("requests") or {}).items():
            if "/" in key and not key.startswith("kubernetes.io/") and limits.get(key) != value:
                problems.append(f"{cw}.resources: {key} requests ({value!r}) must equal limits ({limits.get(key)!r})")
    return problems


def check_manifest(manifest: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming every server-side problem of ``manifest`` (see :func:`server_side_problems`)."""
    problems = server_side_problems(manifest)
    if problems:
        kind, name = manifest.get("kind"), (manifest.get("metadata") or {}).get("name")
        raise ValueError(f"Kubernetes {kind} {name!r} would be refused by the API server: " + "; ".join(problems))


# --- the manifests ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where and how an attempt's pods run: the backend's options, resolved for one attempt."""

    namespace: str
    node_pool: str | None
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    priority_class: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    secrets: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Environment variables from Kubernetes Secrets: ``{"HF_TOKEN": ("secret-name", "key")}``."""
    fractional_resource: str | None = None
    """The extended resource a fractional ``gpus=`` asks one of (MIG profile or shared GPU)."""
    master_port: int = 29500
    ttl_after_finished_s: int = 3600
    cluster_domain: str = "cluster.local"


def map_index_label(map_index: int) -> str:
    """The map index as a label value (``-1``, not a valid label value, is ``none``)."""
    return str(map_index) if map_index >= 0 else "none"


def identity_labels(request: JobRequest) -> dict[str, str]:
    """The labels every object of an attempt carries (values valid as labels; whole ids in annotations)."""
    identity = request.identity
    labels = {
        MANAGED_BY: MANAGER,
        LABEL_ATTEMPT_NAME: identity.name,
        names.TAG_RUN_HASH: identity.task.run_hash,
        names.TAG_MAP_INDEX: map_index_label(identity.task.map_index),
        names.TAG_TRY_NUMBER: str(identity.try_number),
        names.TAG_OWNER_TRY: str(identity.try_number),
        names.TAG_ATTEMPT: str(identity.attempt),
        names.TAG_CAPACITY: request.capacity,
        names.TAG_DAG_ID: label_value(identity.task.dag_id) or "x",
        names.TAG_TASK_ID: label_value(identity.task.task_id) or "x",
    }
    if identity.team:
        labels[names.TAG_TEAM] = label_value(identity.team)
    return labels


def identity_annotations(request: JobRequest) -> dict[str, str]:
    task = request.identity.task
    notes = {
        ANNOTATION_DAG_ID: task.dag_id,
        ANNOTATION_TASK_ID: task.task_id,
        ANNOTATION_RUN_ID: task.run_id,
        ANNOTATION_GPUS: f"{request.resources.gpus:g}",
    }
    if request.max_runtime_s:
        notes[ANNOTATION_MAX_RUNTIME] = f"{math.ceil(request.max_runtime_s)}"
    return notes


def _resources(request: JobRequest, placement: Placement) -> dict[str, Any]:
    res = request.resources
    if res.fractional:
        if not placement.fractional_resource:
            raise ValueError(
                f"resources.gpus={res.gpus!r}: the kubernetes backend needs fractional_gpu_resource (a MIG "
                "resource such as nvidia.com/mig-1g.10gb, or the device plugin's shared resource) for a GPU share"
            )
        gpu_key, gpu_count = placement.fractional_resource, "1"
    else:
        gpu_key, gpu_count = GPU_RESOURCE, str(math.ceil(res.gpus))
    requests: dict[str, str] = {gpu_key: gpu_count}
    limits: dict[str, str] = {gpu_key: gpu_count}
    if res.cpu is not None:
        requests["cpu"] = f"{math.ceil(res.cpu * 1000)}m"
    if res.memory_mib is not None:
        requests["memory"] = limits["memory"] = f"{res.memory_mib}Mi"
    return {"requests": requests, "limits": limits}


def node_selector(request: JobRequest, placement: Placement) -> dict[str, str]:
    selector = dict(placement.node_selector)
    selector[CAPACITY_TYPE] = request.capacity
    if placement.node_pool:
        selector[NODEPOOL] = placement.node_pool
    gpu_type = request.resources.gpu_type
    if gpu_type:
        try:
            selector.update(GPU_NODE_LABELS[gpu_type])
        except KeyError:
            raise ValueError(
                f"resources.gpu_type={gpu_type!r}: the kubernetes backend places NVIDIA GPUs only; allowed: "
                f"{', '.join(GPU_NODE_LABELS)}"
            ) from None
    return selector


def _affinity(request: JobRequest) -> dict[str, Any] | None:
    # instance fallback: the one type chosen for this attempt; else any of the task's types
    types = [request.instance_type] if request.instance_type else list(request.resources.instance_types)
    expressions: list[dict[str, Any]] = []
    if types:
        expressions.append({"key": INSTANCE_TYPE, "operator": "In", "values": types})
    if request.avoid_nodes:  # after a node fault: away from the nodes where the GPU failed
        expressions.append({"key": HOSTNAME, "operator": "NotIn", "values": sorted(set(request.avoid_nodes))})
    if not expressions:
        return None
    term = {"matchExpressions": expressions}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _env(request: JobRequest, placement: Placement, *, service: str | None) -> list[dict[str, Any]]:
    env = dict(request.env)
    nodes = request.resources.nodes
    env["NNODES"] = str(nodes)
    env["MASTER_PORT"] = str(placement.master_port)
    if nodes == 1:
        env.update({"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    else:
        env.pop("NODE_RANK", None)
        # the DNS name of index 0: <job>-0.<service>.<namespace>.svc.<cluster domain>
        name = request.identity.name
        env["MASTER_ADDR"] = f"{name}-0.{service}.{placement.namespace}.svc.{placement.cluster_domain}"
    entries: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    if nodes > 1:
        entries.append(
            {
                "name": "NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
            }
        )
    for var, (secret, key) in sorted(placement.secrets.items()):
        entries.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return entries


def pod_spec(request: JobRequest, placement: Placement, *, service: str | None = None) -> dict[str, Any]:
    """The pod spec of an attempt (its Pod's, or its Job's template)."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": request.image,
        "command": list(request.command),
        "env": _env(request, placement, service=service),
        "resources": _resources(request, placement),
        # a failed container's message is the end of its log: the GPU messages of a node fault are read there
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if request.resources.nodes > 1:
        container["ports"] = [{"name": "rendezvous", "containerPort": placement.master_port}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "nodeSelector": node_selector(request, placement),
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        + [dict(t) for t in placement.tolerations],
        # the runtime helper checkpoints on SIGTERM: give it the time a spot notice gives (2 minutes)
        "terminationGracePeriodSeconds": 120,
    }
    affinity = _affinity(request)
    if affinity:
        spec["affinity"] = affinity
    if placement.service_account:
        spec["serviceAccountName"] = placement.service_account
    if placement.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in placement.image_pull_secrets]
    if placement.priority_class:
        spec["priorityClassName"] = placement.priority_class
    if service:
        spec["subdomain"] = service
    return spec


def pod_manifest(request: JobRequest, placement: Placement) -> dict[str, Any]:
    """The Pod of a single-node attempt."""
    spec = pod_spec(request, placement)
    if request.max_runtime_s:
        spec["activeDeadlineSeconds"] = math.ceil(request.max_runtime_s)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": request.identity.name,
            "namespace": placement.namespace,
            "labels": identity_labels(request),
            "annotations": {**identity_annotations(request), DO_NOT_DISRUPT: "true"},
        },
        "spec": spec,
    }


#: exit code of a rank stopped by SIGTERM (the runtime helper checkpoints and exits with it): when a
#: peer is disrupted, the other ranks are told to stop and may fail before the disrupted pod does
STOPPED_EXIT_CODE = 143
#: the podFailurePolicy of multi-node jobs: rule 0 marks a disruption (an interruption); rule 1 does not
#: count a rank that was stopped by SIGTERM (its pod is replaced while the Job lives; the disrupted peer
#: then fails the Job by rule 0, a deletion or the deadline ends it); rule 2 is the program's own failure
POD_FAILURE_POLICY = {
    "rules": [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "Ignore",
            "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [STOPPED_EXIT_CODE]},
        },
        {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]}},
    ]
}
DISRUPTION_RULE_INDEX = 0


def service_name(request: JobRequest) -> str:
    return request.identity.name


def job_manifests(request: JobRequest, placement: Placement) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Indexed Job and the headless Service of a multi-node attempt."""
    nodes = request.resources.nodes
    name = request.identity.name
    service = service_name(request)
    labels = identity_labels(request)
    annotations = identity_annotations(request)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": 0,
        "podFailurePolicy": POD_FAILURE_POLICY,
        "ttlSecondsAfterFinished": placement.ttl_after_finished_s,
        "template": {
            "metadata": {"labels": labels, "annotations": {**annotations, DO_NOT_DISRUPT: "true"}},
            "spec": pod_spec(request, placement, service=service),
        },
    }
    if request.max_runtime_s:
        job_spec["activeDeadlineSeconds"] = math.ceil(request.max_runtime_s)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": placement.namespace, "labels": labels, "annotations": annotations},
        "spec": job_spec,
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service, "namespace": placement.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            # ranks reach each other before they are ready (the rendezvous is how they get ready)
            "publishNotReadyAddresses": True,
            "selector": {LABEL_ATTEMPT_NAME: name},
            "ports": [{"name": "rendezvous", "port": placement.master_port, "targetPort": placement.master_port}],
        },
    }
    return job, svc
