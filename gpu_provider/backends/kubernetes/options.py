"""The Kubernetes backend's options, each read from its argument or its ``[gpu_provider] kubernetes_*``
key and checked against what Kubernetes accepts; errors name the field and never echo a secret."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpu_provider.backends.base import provider_config
from gpu_provider.backends.common import json_option, text_option
from gpu_provider.backends.kubernetes.manifests import (
    GPU_NODE_LABELS,
    is_dns1123_label,
    is_dns1123_subdomain,
    label_key_problem,
    label_value_problem,
)
from gpu_provider.job import GpuResources

DEFAULT_NAMESPACE = "default"
DEFAULT_SPOT_NODE_POOL = "gpu-spot"
DEFAULT_ON_DEMAND_NODE_POOL = "gpu-on-demand"
#: class -> the lowest ``priority=`` that gets it (the PriorityClasses in docker/karpenter/)
DEFAULT_PRIORITY_CLASSES = {"gpu-low": -(2**31) + 1, "gpu-normal": 0, "gpu-high": 100}
#: seconds an attempt may take from creation to running: a GPU node takes minutes to launch and
#: pull a multi-gigabyte image (``KubernetesPodOperator`` waits 120 s)
DEFAULT_STARTUP_TIMEOUT_S = 900.0
DEFAULT_MASTER_PORT = 29500
DEFAULT_TTL_AFTER_FINISHED_S = 3600

SECRET_REF = re.compile(r"([a-z0-9][-a-z0-9.]*)/([-._a-zA-Z0-9]+)")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def namespace(value: Any) -> str:
    text = text_option("namespace", value, config_key="kubernetes_namespace", default=DEFAULT_NAMESPACE) or ""
    if not is_dns1123_label(text):
        raise ValueError(f"namespace={text!r} must be a DNS-1123 label (a Kubernetes namespace name)")
    return text


def resource_name(value: Any) -> str | None:
    """``fractional_gpu_resource``: an extended resource name (a MIG profile or a shared GPU), or unset."""
    text = text_option("fractional_gpu_resource", value, config_key="kubernetes_fractional_gpu_resource")
    if text and label_key_problem(text):
        raise ValueError(
            f"fractional_gpu_resource={text!r} is not a resource name "
            "(e.g. nvidia.com/mig-1g.10gb or nvidia.com/gpu.shared)"
        )
    return text


def seconds(option: str, value: Any, config_key: str, default: float) -> float:
    if value is None or value == "":
        value = provider_config(config_key) or default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not 0 < number < 10**9:
        raise ValueError(f"{option}={value!r} must be a positive number of seconds")
    return number


def node_pool(option: str, value: Any, config_key: str, default: str) -> str:
    text = text_option(option, value, config_key=config_key, default=default) or default
    if text == "-":
        return ""
    if label_value_problem(text):
        raise ValueError(f"{option}={text!r} is not a NodePool name (a label value: <= 63 letters, digits, '-')")
    return text


def secret_names(option: str, value: Any, config_key: str) -> tuple[str, ...]:
    if value is None or value == "":
        value = provider_config(config_key)
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    out = tuple(v for v in items if v)
    for item in out:
        if not isinstance(item, str) or not is_dns1123_subdomain(item):
            raise ValueError(f"{option}: {item!r} is not a Secret name (a DNS-1123 subdomain)")
    return out


def priority_classes(value: Any, default: Mapping[str, int]) -> dict[str, int]:
    allowed = 'a mapping of PriorityClass names to the lowest priority= each gets, e.g. {"gpu-high": 100}'
    found = json_option(
        "priority_classes", value, config_key="kubernetes_priority_classes", kind=Mapping, allowed=allowed
    )[0]
    if found is None:
        return dict(default)
    out: dict[str, int] = {}
    for name, bound in found.items():
        if not isinstance(name, str) or not is_dns1123_subdomain(name):
            raise ValueError(f"priority_classes key {name!r} is not a PriorityClass name (DNS-1123 subdomain)")
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise ValueError(f"priority_classes[{name!r}]={bound!r} must be an integer priority bound")
        out[name] = bound
    return out


def node_selector(value: Any) -> dict[str, str]:
    allowed = 'a mapping of node labels to values, e.g. {"team": "ml"} (or that as JSON)'
    found = (
        json_option("node_selector", value, config_key="kubernetes_node_selector", kind=Mapping, allowed=allowed)[0]
        or {}
    )
    for key, label in found.items():
        why = label_key_problem(str(key)) or label_value_problem(str(label))
        if why or not isinstance(label, str):
            raise ValueError(f"node_selector[{key!r}]={label!r}: {why or 'values are strings'}")
    return dict(found)


def tolerations(value: Any) -> list[dict[str, Any]]:
    allowed = (
        'a list of tolerations, e.g. [{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]'
    )
    found = json_option("tolerations", value, config_key="kubernetes_tolerations", kind=list, allowed=allowed)[0] or []
    known = {"key", "operator", "value", "effect", "tolerationSeconds"}
    for i, toleration in enumerate(found):
        if not isinstance(toleration, Mapping) or set(toleration) - known:
            raise ValueError(f"tolerations[{i}]={toleration!r}: each is a mapping with keys from {sorted(known)}")
        if toleration.get("operator", "Equal") not in ("Equal", "Exists"):
            raise ValueError(f"tolerations[{i}].operator={toleration.get('operator')!r}: allowed: Equal, Exists")
    return [dict(t) for t in found]


def secret_refs(value: Any) -> dict[str, tuple[str, str]]:
    allowed = 'a mapping of variable names to "secret-name/key" of Kubernetes Secrets (or that as JSON)'
    found = json_option("secrets", value, config_key="kubernetes_secrets", kind=Mapping, allowed=allowed)[0] or {}
    out = {}
    for var, ref in found.items():
        if not isinstance(var, str) or not ENV_NAME.fullmatch(var):
            raise ValueError(f"secrets key {var!r} is not a valid environment variable name")
        match = SECRET_REF.fullmatch(ref) if isinstance(ref, str) else None
        if match is None:
            # a value passed here by mistake might be the secret itself: do not echo it
            raise ValueError(
                f"secrets[{var!r}] must name a Kubernetes Secret and its key as 'secret-name/key', "
                "not hold the secret itself"
            )
        out[var] = (match.group(1), match.group(2))
    return out


def priority_class(classes: Mapping[str, int], priority: int | None) -> str | None:
    """The PriorityClass of a ``priority=`` (the class with the highest bound not above it; 0 without one)."""
    if not classes:
        return None
    value = 0 if priority is None else priority
    ranked = sorted(classes.items(), key=lambda kv: kv[1])
    chosen = ranked[0][0]
    for name, bound in ranked:
        if bound <= value:
            chosen = name
    return chosen


def check_resources(resources: GpuResources, fractional_gpu_resource: str | None) -> None:
    """Refuse what the backend cannot place: a GPU share without a shared resource, an unknown GPU type."""
    if resources.fractional and not fractional_gpu_resource:
        raise ValueError(
            f"resources.gpus={resources.gpus!r}: the kubernetes backend shares a GPU through a MIG profile or "
            "the device plugin's shared resource; set fractional_gpu_resource (e.g. 'nvidia.com/mig-1g.10gb') "
            "or [gpu_provider] kubernetes_fractional_gpu_resource, or use gpus=1"
        )
    if resources.gpu_type and resources.gpu_type not in GPU_NODE_LABELS:
        raise ValueError(
            f"resources.gpu_type={resources.gpu_type!r}: the kubernetes backend places NVIDIA GPUs by "
            f"karpenter.k8s.aws/instance-gpu-name; allowed: {', '.join(GPU_NODE_LABELS)}"
        )
