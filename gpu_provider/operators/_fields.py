"""Checks of ``GpuJobOperator``'s fields, run at parse time for literal values and after rendering."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_provider.backends.base import Backend, backend_class
from gpu_provider.job import MAX_DURATION_S, Checkpoint, GpuResources, is_templated, to_seconds
from gpu_provider.names import ENV_PREFIX, RENDEZVOUS_ENV, SPOT
from gpu_provider.recovery import CapacityPolicy

#: spot without a checkpoint is fine for short jobs; above this max runtime it earns a warning
SPOT_WITHOUT_CHECKPOINT_WARN_S = 3600.0

#: variables the provider sets on every job; ``env=`` may not override them
RESERVED_ENV = frozenset({*RENDEZVOUS_ENV, "CUDA_VISIBLE_DEVICES"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TEAM = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_command(command: Any) -> list[str]:
    if isinstance(command, str):
        raise TypeError(
            "command must be a list of arguments, e.g. ['python', 'train.py', '--epochs', '3'], not a string "
            "(a string would need a shell; pass ['bash', '-c', '...'] if you want one)"
        )
    if not isinstance(command, Sequence) or not command:
        raise TypeError(f"command ({type(command).__name__}) must be a non-empty list of strings")
    out = []
    for i, arg in enumerate(command):
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            arg = str(arg)
        if not isinstance(arg, str):
            raise TypeError(f"command[{i}] is a {type(arg).__name__}; every argument must be a string")
        out.append(arg)
    return out


def validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env={type(env).__name__} must be a mapping of variable names to strings")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ValueError(f"env key {key!r} is not a valid environment variable name (letters, digits, _)")
        if key in RESERVED_ENV or key.startswith(ENV_PREFIX):
            raise ValueError(
                f"env key {key!r} is set by the provider on every job ({ENV_PREFIX}*, "
                f"{', '.join(sorted(RESERVED_ENV))}) and cannot be overridden"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            # never echo the value: it may be a secret
            raise TypeError(f"env[{key!r}] is a {type(value).__name__}; environment values must be strings")
        out[key] = str(value)
    return out


def to_resources(resources: Any) -> GpuResources:
    if resources is None:
        return GpuResources()
    if isinstance(resources, GpuResources):
        return resources
    if isinstance(resources, Mapping):
        try:
            return GpuResources(**resources)
        except TypeError as err:
            raise TypeError(f"resources with keys {sorted(resources)}: {err}") from err
    raise TypeError(f"resources ({type(resources).__name__}) must be GpuResources(...) or a dict")


def to_checkpoint(checkpoint: Any) -> Checkpoint | None:
    if checkpoint is None or isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, str):
        return Checkpoint(uri=checkpoint)
    raise TypeError(f"checkpoint ({type(checkpoint).__name__}) must be Checkpoint(uri=...) or a URI string")


def any_templated(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(is_templated(v) for v in value.values())
    return is_templated(value)


def check_fixed_options(backend: Any) -> None:
    """Refuse a template for an option that picks an executable or a place on disk.

    A template can read the trigger form's params, which anyone allowed to trigger the DAG fills in:
    such options must be literals or come from the ``[gpu_provider]`` config.
    """
    if not isinstance(backend, Mapping) or is_templated(backend.get("name")) or not backend.get("name"):
        return
    fixed = backend_class(str(backend["name"]).strip()).fixed_options
    for key, value in backend.items():
        if key in fixed and is_templated(value):
            raise ValueError(
                f"backend option {key!r} of the {backend['name']!r} backend cannot be a template: it chooses an "
                "executable or a place on disk, and templates can take trigger-form params (untrusted input). "
                "Give a literal value, or set it in the [gpu_provider] config."
            )


def team_pool(team: Any, pool: Any, resources: GpuResources) -> dict[str, Any]:
    """``team=`` -> the ``pool`` (``gpu_<team>``) and ``pool_slots`` (total GPUs rounded up) it sets."""
    if team is None:
        return {}
    if not isinstance(team, str) or not TEAM.match(team):
        raise ValueError(
            f"team={team!r} must be lower-case letters, digits, '-' or '_' (1-63 chars, e.g. 'vision'); "
            "it names the pool gpu_<team> (map it to a differently spelt service-side name in the "
            "backend's options, e.g. Batch share_identifiers)"
        )
    wanted = f"gpu_{team}"
    if pool not in (None, wanted):
        raise ValueError(f"team={team!r} sets pool={wanted!r}; do not also pass pool={pool!r}")
    return {"pool": wanted, "pool_slots": resources.pool_slots}


#: the gpu_provider_priority plugin's weight rules, by name (gpu_provider.plugins.priority: importing it
#: at DAG parse time would import Airflow's plugin manager)
ABSOLUTE_RULE = "gpu_provider.plugins.priority.GpuAbsolutePriority"
DOWNSTREAM_RULE = "gpu_provider.plugins.priority.GpuDownstreamPriority"


def check_team_quota(team: str | None, priority: int | None) -> None:
    """With a quota file configured: the team must be in it, and ``priority=`` within its ceiling."""
    if team is None:
        return
    from gpu_provider.quotas.file import configured_quotas

    quotas = configured_quotas()
    if quotas is not None:
        quotas.check_task(team, priority)


def priority_weight(priority: Any, weight_rule: Any = None) -> dict[str, Any]:
    """``priority=`` -> Airflow's ``priority_weight`` with the plugin's weight rule that puts backfill
    runs last: absolute with ``priority=``, downstream (Airflow's default) without; a ``weight_rule``
    the task sets itself is kept when no ``priority=`` is given."""
    if priority is None:
        return {} if weight_rule is not None else {"weight_rule": DOWNSTREAM_RULE}
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority={priority!r} ({type(priority).__name__}) must be an integer")
    if abs(priority) > 2**31 - 1:
        raise ValueError(f"priority={priority!r} must be between -2147483647 and 2147483647")
    return {"priority_weight": priority, "weight_rule": ABSOLUTE_RULE}


def positive_seconds(field: str, value: Any, maximum: float = MAX_DURATION_S) -> float | None:
    """A duration that, when given, is more than 0 seconds (``None``: not given)."""
    seconds = to_seconds(field, value, maximum=maximum)
    if seconds == 0:
        raise ValueError(f"{field}={value!r} must be > 0 seconds (None for the default)")
    return seconds


def configured_poll_interval(backend: Backend, maximum: float) -> float:
    """``[gpu_provider] poll_interval``, else the backend's own default."""
    from airflow.configuration import conf

    raw = conf.get("gpu_provider", "poll_interval", fallback="") or ""
    if raw.strip():
        value = to_seconds("[gpu_provider] poll_interval", raw, allow_none=False, maximum=maximum)
        if value:
            return value
    return backend.default_poll_interval


def configured_max_attempt_records() -> int:
    """``[gpu_provider] max_attempt_records`` (default :data:`gpu_provider.records.DEFAULT_MAX_ATTEMPT_RECORDS`)."""
    from airflow.configuration import conf

    from gpu_provider.records import DEFAULT_MAX_ATTEMPT_RECORDS

    raw = str(conf.get("gpu_provider", "max_attempt_records", fallback="") or "").strip()
    if not raw:
        return DEFAULT_MAX_ATTEMPT_RECORDS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 2:
        raise ValueError(
            f"[gpu_provider] max_attempt_records={raw!r} must be a whole number, 2 or more "
            f"(default {DEFAULT_MAX_ATTEMPT_RECORDS})"
        )
    return value


def warn_spot_without_checkpoint(
    task_id: str, capacity: CapacityPolicy, checkpoint_uri: str | None, max_runtime_s: float | None
) -> None:
    if SPOT not in capacity.may_use or checkpoint_uri:
        return
    if max_runtime_s is None or max_runtime_s > SPOT_WITHOUT_CHECKPOINT_WARN_S:
        limit = "no max_runtime" if max_runtime_s is None else f"max_runtime={max_runtime_s:.0f}s"
        warnings.warn(
            f"task {task_id!r}: capacity={capacity!r} may run on spot, but the job has no "
            f"checkpoint= and {limit} (> {SPOT_WITHOUT_CHECKPOINT_WARN_S:.0f}s): every interruption restarts "
            "it from the beginning. Add checkpoint=Checkpoint(uri=...) or use capacity='on_demand'.",
            UserWarning,
            stacklevel=4,
        )
