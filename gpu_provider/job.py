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

from gpu_provider import names

#: capacity types an attempt can run on
CAPACITY_TYPES = names.CAPACITY_TYPES

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

# Bounds of the spec's numbers. They refuse typos and absurd values (``gpus=1e-12``,
# ``memory=10**400``, ``max_runtime=timedelta.max``) when the DAG is parsed, instead of an overflow
# or a service error later; each is far beyond what any instance offers today.
#: smallest share of one GPU a job may ask for (``gpus`` below 1 shares one GPU)
MIN_GPU_FRACTION = 0.01
#: most GPUs per node (the largest instances have 8 GPUs or 16 accelerators)
MAX_GPUS_PER_NODE = 64
#: most nodes one job may span
MAX_NODES = 1000
#: fewest vCPUs per node
MIN_CPU = 0.1
#: most vCPUs per node
MAX_CPU = 1024
#: least memory per node, in MiB
MIN_MEMORY_MIB = 128
#: most memory per node, in MiB (64 TiB)
MAX_MEMORY_MIB = 64 * 1024 * 1024
#: longest duration any duration field accepts unless it sets its own cap (366 days)
MAX_DURATION_S = 366 * 24 * 3600.0
#: most complete checkpoints ``Checkpoint(keep=...)`` may keep
MAX_CHECKPOINT_KEEP = 1000

#: the strings :func:`to_bool` accepts (case-insensitive, surrounding blanks ignored)
TRUE_STRINGS = ("true", "1")
FALSE_STRINGS = ("false", "0")

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|M|G|T)?\s*$")
_MEMORY_FACTOR_MIB = {
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


_REPR_MAX = 60


def safe_repr(value: Any) -> str:
    """``repr`` of a value for an error message; a huge int or long string is summarised.

    (Python refuses to print an int of more than 4300 digits, so ``repr`` alone could raise.)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        digits = int(value.bit_length() * 0.30103) + 1
        return f"<{'-' if value < 0 else ''}integer of about {digits} digits>"
    if isinstance(value, str) and len(value) > _REPR_MAX:
        return repr(value[:_REPR_MAX]) + f"... ({len(value)} characters)"
    return repr(value)


def _finite(value: int | float) -> float | None:
    """``value`` as a finite float, or ``None`` when it is NaN, infinite or too large for a float."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} days" if seconds >= 86400 else f"{seconds:g} s"


def to_seconds(
    field_name: str, value: Any, *, allow_none: bool = True, maximum: float = MAX_DURATION_S
) -> float | None:
    """Turn a duration (``timedelta``, or seconds as a number or numeric string) into seconds.

    :param field_name: the field, as the user wrote it, for error messages.
    :param value: the duration.
    :param allow_none: whether ``None`` is allowed (and returned).
    :param maximum: the largest duration accepted, in seconds (default :data:`MAX_DURATION_S`).
    :return: seconds, ``0 <= seconds <= maximum``, or ``None``.
    :raises ValueError: negative, NaN, infinite or above ``maximum``, or a string that is not a number.
    :raises TypeError: not a duration at all.
    """
    allowed = f"a timedelta or seconds, 0 to {maximum:g} ({_days(maximum)})"
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{field_name}=None: a duration is required ({allowed})")
    if isinstance(value, timedelta):
        seconds: float | None = value.total_seconds()
    elif _is_number(value):
        seconds = _finite(value)
    elif isinstance(value, str):
        try:
            seconds = _finite(float(value.strip()))
        except ValueError:
            raise ValueError(f"{field_name}={value!r} is not a duration: use {allowed}") from None
    else:
        raise TypeError(f"{field_name}={value!r} ({type(value).__name__}) is not a duration: use {allowed}")
    if seconds is None or seconds < 0 or seconds > maximum:
        raise ValueError(f"{field_name}={safe_repr(value)} is out of range: use {allowed}")
    return seconds


def to_bool(field_name: str, value: Any) -> bool:
    """Read a yes/no field strictly: ``True``/``False``, ``1``/``0``, or ``"true"``/``"false"``/``"1"``/``"0"``.

    A rendered template gives a string, and ``bool("no")`` is ``True``: anything but these values
    is refused rather than guessed.

    :param field_name: the field, for error messages.
    :param value: the value to read.
    :raises ValueError: a string or number that is not one of the accepted values.
    :raises TypeError: any other type.
    """
    allowed = "True, False, or the strings 'true', 'false', '1', '0'"
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value)
        raise ValueError(f"{field_name}={safe_repr(value)} is not a yes/no value: use {allowed}")
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_STRINGS:
            return True
        if word in FALSE_STRINGS:
            return False
        raise ValueError(f"{field_name}={value!r} is not a yes/no value: use {allowed}")
    raise TypeError(f"{field_name}={value!r} ({type(value).__name__}) is not a yes/no value: use {allowed}")


_MEMORY_ALLOWED = (
    f"MiB as a number, or a string with a unit like '512Mi', '32Gi', '64G'; "
    f"between {MIN_MEMORY_MIB} MiB and {MAX_MEMORY_MIB // (1024 * 1024)} TiB ({MAX_MEMORY_MIB} MiB)"
)


def memory_to_mib(field_name: str, value: Any) -> int | None:
    """``16384`` (MiB), ``"16Gi"``, ``"512Mi"``, ``"16G"`` -> MiB (rounded up).

    A string needs a unit: ``"32768"`` is refused, because a number means MiB while Kubernetes
    reads a bare string as bytes.

    :raises ValueError: no unit in a string, not a memory size, or outside
        :data:`MIN_MEMORY_MIB` .. :data:`MAX_MEMORY_MIB`.
    :raises TypeError: neither a number nor a string.
    """
    if value is None:
        return None
    mib: float | None
    if _is_number(value):
        mib = _finite(value)
    elif isinstance(value, str):
        match = _MEMORY.match(value)
        if not match:
            raise ValueError(f"{field_name}={value!r} is not a memory size: use {_MEMORY_ALLOWED}")
        if match.group(2) is None:
            number = match.group(1)
            raise ValueError(
                f"{field_name}={value!r} has no unit: write '{number}Mi' (or e.g. '32Gi'), "
                f"or pass {number} as a number, which means MiB"
            )
        mib = _finite(float(match.group(1)) * _MEMORY_FACTOR_MIB[match.group(2)])
    else:
        raise TypeError(f"{field_name}={value!r} ({type(value).__name__}) must be {_MEMORY_ALLOWED}")
    if mib is None or not MIN_MEMORY_MIB <= mib <= MAX_MEMORY_MIB:
        raise ValueError(f"{field_name}={safe_repr(value)} is out of range: use {_MEMORY_ALLOWED}")
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
    """Check every field of ``res``; see the bounds (:data:`MIN_GPU_FRACTION`, :data:`MAX_GPUS_PER_NODE`, ...)."""
    gpus, nodes = res.gpus, res.nodes
    gpus_allowed = (
        f"a whole number of GPUs per node from 1 to {MAX_GPUS_PER_NODE}, or a fraction from "
        f"{MIN_GPU_FRACTION} to 1 for a shared single-node job"
    )
    if not _is_number(gpus):
        raise TypeError(f"resources.gpus={gpus!r} ({type(gpus).__name__}) must be a number: {gpus_allowed}")
    gpus_f = _finite(gpus)
    if gpus_f is None or gpus_f <= 0:
        raise ValueError(f"resources.gpus={safe_repr(gpus)} must be > 0: {gpus_allowed}")
    if not MIN_GPU_FRACTION <= gpus_f <= MAX_GPUS_PER_NODE:
        raise ValueError(f"resources.gpus={safe_repr(gpus)} is out of range: {gpus_allowed}")
    if gpus_f > 1 and not gpus_f.is_integer():
        raise ValueError(
            f"resources.gpus={gpus!r}: more than one GPU must be a whole number; fractions are allowed "
            "only below 1 (a share of one GPU)"
        )
    if not isinstance(nodes, int) or isinstance(nodes, bool):
        raise TypeError(f"resources.nodes={nodes!r} ({type(nodes).__name__}) must be an integer from 1 to {MAX_NODES}")
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"resources.nodes={safe_repr(nodes)} must be an integer from 1 to {MAX_NODES}")
    if gpus_f < 1 and nodes > 1:
        raise ValueError(
            f"resources.gpus={gpus!r} with resources.nodes={nodes}: fractional GPUs are for a shared "
            "single-node job only; use whole GPUs for multi-node jobs"
        )
    if res.gpu_type is not None and (not isinstance(res.gpu_type, str) or res.gpu_type.lower() not in GPU_TYPES):
        raise ValueError(
            f"resources.gpu_type={res.gpu_type!r} is not a known GPU type; allowed: {', '.join(GPU_TYPES)}"
        )
    if res.cpu is not None:
        cpu_allowed = f"a number of vCPUs per node from {MIN_CPU} to {MAX_CPU}"
        if not _is_number(res.cpu):
            raise TypeError(f"resources.cpu={res.cpu!r} ({type(res.cpu).__name__}) must be {cpu_allowed}")
        cpu = _finite(res.cpu)
        if cpu is None or not MIN_CPU <= cpu <= MAX_CPU:
            raise ValueError(f"resources.cpu={safe_repr(res.cpu)} is out of range: use {cpu_allowed}")
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
        keep = self.keep
        if not isinstance(keep, int) or isinstance(keep, bool) or not 1 <= keep <= MAX_CHECKPOINT_KEEP:
            raise ValueError(f"checkpoint.keep={safe_repr(keep)} must be an integer from 1 to {MAX_CHECKPOINT_KEEP}")
        if not is_templated(self.uri):
            validate_checkpoint_uri(self.uri)
        elif _has_query_or_fragment(_JINJA.sub("", self.uri)):
            # the literal parts of a templated URI are known now: refuse what rendering cannot fix
            raise ValueError(_query_message("checkpoint.uri", self.uri))


_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.DOTALL)


def _has_query_or_fragment(uri: str) -> bool:
    return "?" in uri or "#" in uri


def _query_message(field_name: str, uri: str) -> str:
    # the query may hold a token (a presigned URL): show only what comes before it
    base = re.split(r"[?#]", uri, maxsplit=1)[0]
    return (
        f"{field_name}={base + '?...'!r} has a query or fragment ('?...' or '#...'): a checkpoint URI is "
        "a plain location, file:///abs/path or s3://bucket/prefix"
    )


def validate_checkpoint_uri(uri: Any, field_name: str = "checkpoint.uri") -> str:
    """Check a (rendered) checkpoint URI: ``file:///absolute/path`` or ``s3://bucket/prefix``.

    :param uri: the URI.
    :param field_name: the field, for error messages.
    :return: the URI without a trailing ``/``.
    :raises ValueError: another scheme, a relative ``file://`` path, no bucket, a query or a fragment.
    :raises TypeError: not a non-empty string.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise TypeError(f"{field_name}={uri!r} must be a non-empty URI string (file:///... or s3://...)")
    if _has_query_or_fragment(uri):
        raise ValueError(_query_message(field_name, uri))
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
