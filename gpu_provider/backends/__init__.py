"""Backends: one module per place that runs jobs. Import a backend module only when it is used."""

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
