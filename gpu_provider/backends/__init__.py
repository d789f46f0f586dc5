"""Backends: one package per place that runs jobs. Import a backend package only when it is used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_provider.backends.base import (
        Backend,
        JobHandle,
        JobIdentity,
        JobRequest,
        JobState,
        JobStatus,
        TaskKey,
        register_backend,
        registered_backends,
        resolve_backend,
    )

__all__ = [
    "Backend",
    "JobHandle",
    "JobIdentity",
    "JobRequest",
    "JobState",
    "JobStatus",
    "TaskKey",
    "register_backend",
    "registered_backends",
    "resolve_backend",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use, not with the package: the local backend's per-job supervisor imports
    # modules of this package, and base.py pulls in Airflow (through gpu_provider.exceptions),
    # which would cost every job seconds and ~100 MB before it starts.
    if name in __all__:
        from gpu_provider.backends import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
