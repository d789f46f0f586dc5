"""Where the reaper looks: the backends its passes sweep, and whether a backend's jobs are among them.

``GpuReaperOperator`` sweeps the backends of ``[gpu_provider] reaper_backends`` (names or mappings with their
options), else every registered backend whose extra is installed, with its configured options. Each backend
lists its jobs in one place only: Batch in its job queues of its connection's region, SageMaker in its region,
Kubernetes in its namespace of its cluster, local in its state folder. A capacity ladder's rung in another
region or account (its own ``aws_conn_id``, ``region_name``, queue or namespace) is swept only when a reaper
backend names that place: :func:`unswept` says which rungs none does (the operator warns when the DAG is
parsed, ``gpu-provider check --dag`` reports them, and the GPU page shows them).

The places are compared as written (options, config defaults filled in), without reading a connection: a
region left to the connection counts as another place than a region named, so name it on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_provider.backends.base import Backend, provider_config, registered_backends, resolve_backend
from gpu_provider.extras import BACKEND_EXTRAS, MissingExtraError, missing_modules

#: the options that say where each backend lists its jobs (two backends that agree on them sweep the same jobs)
WHERE: dict[str, tuple[str, ...]] = {
    "batch": ("aws_conn_id", "region_name"),
    "sagemaker": ("aws_conn_id", "region_name"),
    "kubernetes": ("kubernetes_conn_id", "namespace"),
    "local": ("state_dir",),
}


def installed_backends() -> tuple[list[Backend], dict[str, str]]:
    """Every registered backend that can be built here, and why each of the others was skipped.

    The default when no backends are named: a base install (no service extras) sweeps the local
    backend and says which backends it skipped, instead of failing the DAG's parse.
    """
    found: list[Backend] = []
    skipped: dict[str, str] = {}
    for name in registered_backends():
        extra = BACKEND_EXTRAS.get(name)
        missing = missing_modules(extra) if extra else []
        if missing:
            skipped[name] = f"its extra [{extra}] is not installed (missing: {', '.join(missing)})"
            continue
        try:
            found.append(resolve_backend(name))
        except MissingExtraError as err:
            skipped[name] = str(err)
    return found, skipped


def backend_list(value: Any) -> list[Any] | None:
    """The backends named by ``value`` or ``[gpu_provider] reaper_backends``; ``None``: none named."""
    if value is None or value == "":
        text = provider_config("reaper_backends")
        if not text:
            return None
        value = text
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (Backend, Mapping)) or not isinstance(value, Sequence):
        value = [value]
    return list(value)


def configured_reapers() -> list[Backend]:
    """The backends a ``GpuReaperOperator`` with no ``backends=`` sweeps, from this process's configuration."""
    named = backend_list(None)
    if named is None:
        return installed_backends()[0]
    return [resolve_backend(b) for b in named]


def _queues(options: Mapping[str, Any]) -> set[str]:
    found = {options.get("spot_queue"), options.get("on_demand_queue")}
    for per_capacity in (options.get("queues_by_instance_type") or {}).values():
        found |= set(per_capacity.values())
    return {str(q) for q in found if q}


def sweeps(reaper: Backend, backend: Backend) -> bool:
    """Whether a reaper pass over ``reaper`` lists ``backend``'s jobs: the same backend, the same place (and on
    Batch every job queue of ``backend`` among ``reaper``'s)."""
    if reaper.name != backend.name:
        return False
    mine, theirs = reaper.options(), backend.options()
    if any(mine.get(key) != theirs.get(key) for key in WHERE.get(backend.name, ())):
        return False
    return backend.name != "batch" or _queues(theirs) <= _queues(mine)


def describe(backend: Backend) -> str:
    """``batch (aws_conn_id='aws_west', region_name='us-west-2', queues gpu-spot)``: the place, for messages."""
    options = backend.options()
    where = [f"{key}={options.get(key)!r}" for key in WHERE.get(backend.name, ())]
    if backend.name == "batch":
        where.append(f"queues {', '.join(sorted(_queues(options))) or '(none)'}")
    return f"{backend.name} ({', '.join(where)})" if where else backend.name


def unswept(backends: Sequence[Backend], reapers: Sequence[Backend] | None = None) -> list[int]:
    """The indexes of ``backends`` (a ladder's rungs, in order) that no backend of ``reapers`` (default: the
    configured reaper's, :func:`configured_reapers`) sweeps."""
    scope = configured_reapers() if reapers is None else reapers
    return [i for i, backend in enumerate(backends) if not any(sweeps(r, backend) for r in scope)]


def scope_text(reapers: Sequence[Backend]) -> str:
    """What the reaper sweeps, in words (``[gpu_provider] reaper_backends`` set or not)."""
    source = "[gpu_provider] reaper_backends" if provider_config("reaper_backends") else "the default reaper"
    return f"{source} sweeps {'; '.join(describe(r) for r in reapers) or 'nothing'}"
