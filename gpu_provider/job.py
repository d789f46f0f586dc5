"""The backend-neutral job spec: what a GPU job needs, validated once for every backend.

Every check raises ``ValueError`` or ``TypeError`` with the field, the value and what is allowed.
The operator runs these checks when the DAG is parsed (for literal values) and again after
templates are rendered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

#: capacity types an attempt can run on
CAPACITY_TYPES = ("spot", "on-demand")

#: GPU models the backends know how to place (lower case, as written in ``gpu_type=``)
GPU_TYPES = (
    "t4",
    "a10g",
    "l4",
    "l40s",
    "v100",
    "a100",
    "a100-80gb",
    "h100",
    "h200",
    "b200",
    "trn1",
    "inf2",
)

#: checkpoint URI schemes the runtime helper can read and write
CHECKPOINT_SCHEMES = ("file", "s3")

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T)?\s*$")
_MEMORY_FACTOR_MIB = {
    None: 1 / (1024 * 1024),  # plain bytes when given as a string without unit
    "Ki": 1 / 1024,
    "Mi": 1.0,
    "Gi": 1024.0,
    "Ti": 1024.0 * 1024,
    "K": 1000 / 1024 / 1024,
    "M": 1000**2 / 1024**2,
    "G": 1000**3 / 1024**2,
    "T": 1000**4 / 1024**2,
}
_INSTANCE_TYPE = re.compile(r"^(ml\.)?[a-z][a-z0-9-]*\.[a-z0-9-]+$")


def is_templated(value: Any) -> bool:
    """True for a string that still holds a Jinja expression (checked again after rendering)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def to_seconds(field_name: str, value: Any, *, allow_none: bool = True) -> float | None:
    """Turn a duration (``timedelta`` or seconds) into seconds, refusing negative or odd values."""
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{field_name}=None: a duration is required (a timedelta or seconds >= 0)")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif _is_number(value):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            raise ValueError(
                f"{field_name}={value!r} is not a duration: use a timedelta or a number of seconds >= 0"
            ) from None
    else:
        raise TypeError(
            f"{field_name}={value!r} ({type(value).__name__}) is not a duration: "
            "use a timedelta or a number of seconds >= 0"
        )
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"{field_name}={value!r} must be a duration >= 0 (a timedelta or seconds)")
    return seconds


def memory_to_mib(field_name: str, value: Any) -> int | None:
    """``16384`` (MiB), ``"16Gi"``, ``"512Mi"``, ``"16G"`` -> MiB (rounded up)."""
    if value is None:
        return None
    if _is_number(value):
        mib = float(value)
    elif isinstance(value, str):
        match = _MEMORY.match(value)
        if not match:
            raise ValueError(
                f"{field_name}={value!r} is not a memory size: use MiB as a number, or a string like "
                "'16Gi', '512Mi', '64G'"
            )
        mib = float(match.group(1)) * _MEMORY_FACTOR_MIB[match.group(2)]
    else:
        raise TypeError(
            f"{field_name}={value!r} ({type(value).__name__}) must be MiB as a number or a string like '16Gi'"
        )
    if math.isnan(mib) or mib <= 0:
        raise ValueError(f"{field_name}={value!r} must be a positive memory size")
    return math.ceil(mib)


@dataclass(frozen=True)
class GpuResources:
    """What one job needs, per node.

    :param gpus: GPUs per node: a whole number, or a fraction between 0 and 1 for a shared
        single-node job (inference sharing one GPU). Default 1.
    :param nodes: number of nodes (processes/hosts) for distributed training. Default 1.
    :param gpu_type: GPU model, one of :data:`GPU_TYPES` (``None``: whatever the backend offers).
    :param cpu: vCPUs per node (``None``: the backend's default for the GPU count).
    :param memory: memory per node, MiB as a number or a string like ``"32Gi"``.
    :param instance_types: instance types the job may run on (e.g. ``("g5.2xlarge", "g6.2xlarge")``).
    """

    gpus: float = 1
    nodes: int = 1
    gpu_type: str | None = None
    cpu: float | None = None
    memory: int | str | None = None
    instance_types: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        validate_resources(self)
        if not isinstance(self.instance_types, tuple):
            object.__setattr__(self, "instance_types", tuple(self.instance_types))
        if isinstance(self.gpu_type, str):
            object.__setattr__(self, "gpu_type", self.gpu_type.lower())

    @property
    def total_gpus(self) -> float:
        return self.gpus * self.nodes

    @property
    def pool_slots(self) -> int:
        """Airflow pool slots this job takes: total GPUs rounded up (a shared 0.5 GPU takes 1)."""
        return max(1, math.ceil(self.total_gpus))

    @property
    def memory_mib(self) -> int | None:
        return memory_to_mib("resources.memory", self.memory)

    @property
    def fractional(self) -> bool:
        return self.gpus < 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpu_type": self.gpu_type,
            "cpu": self.cpu,
            "memory": self.memory,
            "instance_types": list(self.instance_types),
        }


def validate_resources(res: GpuResources) -> None:
    gpus, nodes = res.gpus, res.nodes
    if not _is_number(gpus):
        raise TypeError(
            f"resources.gpus={gpus!r} ({type(gpus).__name__}) must be a number: a whole number of GPUs "
            "per node, or a fraction between 0 and 1 for a shared single-node job"
        )
    if math.isnan(gpus) or math.isinf(gpus) or gpus <= 0:
        raise ValueError(
            f"resources.gpus={gpus!r} must be > 0: a whole number of GPUs per node, or a fraction "
            "between 0 and 1 for a shared single-node job"
        )
    if gpus > 1 and not float(gpus).is_integer():
        raise ValueError(
            f"resources.gpus={gpus!r}: more than one GPU must be a whole number; fractions are allowed "
            "only below 1 (a share of one GPU)"
        )
    if not isinstance(nodes, int) or isinstance(nodes, bool):
        raise TypeError(f"resources.nodes={nodes!r} ({type(nodes).__name__}) must be an integer >= 1")
    if nodes < 1:
        raise ValueError(f"resources.nodes={nodes!r} must be >= 1")
    if gpus < 1 and nodes > 1:
        raise ValueError(
            f"resources.gpus={gpus!r} with resources.nodes={nodes}: fractional GPUs are for a shared "
            "single-node job only; use whole GPUs for multi-node jobs"
        )
    if res.gpu_type is not None and (not isinstance(res.gpu_type, str) or res.gpu_type.lower() not in GPU_TYPES):
        raise ValueError(
            f"resources.gpu_type={res.gpu_type!r} is not a known GPU type; allowed: {', '.join(GPU_TYPES)}"
        )
    if res.cpu is not None:
        if not _is_number(res.cpu):
            raise TypeError(f"resources.cpu={res.cpu!r} ({type(res.cpu).__name__}) must be a number of vCPUs > 0")
        if math.isnan(res.cpu) or res.cpu <= 0:
            raise ValueError(f"resources.cpu={res.cpu!r} must be a number of vCPUs > 0")
    memory_to_mib("resources.memory", res.memory)
    types = res.instance_types
    if isinstance(types, str) or not isinstance(types, Iterable):
        raise TypeError(
            f"resources.instance_types={types!r} must be a list of instance type names, e.g. ['g5.2xlarge']"
        )
    for it in types:
        if not isinstance(it, str) or not _INSTANCE_TYPE.match(it):
            raise ValueError(
                f"resources.instance_types: {it!r} is not an instance type name (expected e.g. 'g5.2xlarge' "
                "or 'ml.g5.2xlarge')"
            )


@dataclass(frozen=True)
class Checkpoint:
    """Where a job's checkpoints live and how many to keep.

    :param uri: ``file:///abs/path/...`` or ``s3://bucket/prefix``; templated (e.g.
        ``"s3://ckpt/{{ dag.dag_id }}/{{ run_id }}"``), rendered before each try.
    :param keep: how many complete checkpoints the runtime helper keeps (older ones are deleted). Default 3.
    """

    uri: str
    keep: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.keep, int) or isinstance(self.keep, bool) or self.keep < 1:
            raise ValueError(f"checkpoint.keep={self.keep!r} must be an integer >= 1")
        if not is_templated(self.uri):
            validate_checkpoint_uri(self.uri)


def validate_checkpoint_uri(uri: Any, field_name: str = "checkpoint.uri") -> str:
    if not isinstance(uri, str) or not uri.strip():
        raise TypeError(f"{field_name}={uri!r} must be a non-empty URI string (file:///... or s3://...)")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in CHECKPOINT_SCHEMES:
        raise ValueError(
            f"{field_name}={uri!r} has an unsupported scheme; allowed: "
            + ", ".join(f"{s}://" for s in CHECKPOINT_SCHEMES)
        )
    if scheme == "file" and not rest.startswith("/"):
        raise ValueError(f"{field_name}={uri!r}: a file:// URI needs an absolute path (file:///abs/path)")
    if scheme == "s3" and (not rest or rest.startswith("/")):
        raise ValueError(f"{field_name}={uri!r}: an s3:// URI needs a bucket (s3://bucket/prefix)")
    return uri.rstrip("/")
