"""The backend contract: what every place that runs GPU jobs (local processes, AWS Batch,
SageMaker, Kubernetes) must offer the operator and the trigger.

A backend translates a backend-neutral :class:`JobRequest` into its service's calls and maps its
service's states onto the closed :class:`JobState` set, in one table per backend. Backends are
found by name through the registry; the registry holds import paths, so naming a backend never
imports boto3 or kubernetes until the backend is actually used.

This module is the contract's one import path: every name is defined in a short module of
:mod:`gpu_provider.backends.contract`, by concern, and re-exported here.

- ``contract.states``: :class:`JobState`, :func:`map_state`
- ``contract.identity``: :class:`TaskKey`, :class:`JobIdentity`, :func:`task_from_tags`, :func:`lookup_key`
- ``contract.jobs``: :class:`JobRequest`, :class:`JobHandle`, :class:`JobStatus`, ``PollResult``,
  :class:`OwnedJob`, :class:`OwnerRead`
- ``contract.logs``: :class:`LogChunk`, :data:`LOG_READ_BYTES`, :data:`MAX_LOG_LINE_CHARS`, :func:`clip_line`
- ``contract.events``: :class:`EventSink`, :class:`EventSource`
- ``contract.backend``: :class:`Backend`, :class:`Capabilities`
- ``contract.config``: :func:`provider_config`
- ``contract.registry``: :func:`register_backend`, :func:`registered_backends`, :func:`backend_class`,
  :func:`backend_options`, :func:`check_backend_name`, :func:`resolve_backend`, ``DEFAULT_BACKEND``
"""

from __future__ import annotations

from gpu_provider.backends.contract.backend import Backend, Capabilities
from gpu_provider.backends.contract.config import provider_config
from gpu_provider.backends.contract.events import EventSink, EventSource
from gpu_provider.backends.contract.identity import _NAME_UNSAFE as _NAME_UNSAFE
from gpu_provider.backends.contract.identity import JobIdentity, TaskKey, lookup_key, task_from_tags
from gpu_provider.backends.contract.identity import _slug as _slug
from gpu_provider.backends.contract.jobs import (
    JobHandle,
    JobRequest,
    JobStatus,
    OwnedJob,
    OwnerRead,
    PollResult,
)
from gpu_provider.backends.contract.jobs import _known_fields as _known_fields
from gpu_provider.backends.contract.logs import LOG_READ_BYTES, MAX_LOG_LINE_CHARS, LogChunk, clip_line
from gpu_provider.backends.contract.registry import _REGISTRY as _REGISTRY
from gpu_provider.backends.contract.registry import (
    DEFAULT_BACKEND,
    backend_class,
    backend_options,
    check_backend_name,
    register_backend,
    registered_backends,
    resolve_backend,
)
from gpu_provider.backends.contract.states import _TERMINAL as _TERMINAL
from gpu_provider.backends.contract.states import JobState, map_state

__all__ = [
    "DEFAULT_BACKEND",
    "LOG_READ_BYTES",
    "MAX_LOG_LINE_CHARS",
    "Backend",
    "Capabilities",
    "EventSink",
    "EventSource",
    "JobHandle",
    "JobIdentity",
    "JobRequest",
    "JobState",
    "JobStatus",
    "LogChunk",
    "OwnedJob",
    "OwnerRead",
    "PollResult",
    "TaskKey",
    "backend_class",
    "backend_options",
    "check_backend_name",
    "clip_line",
    "lookup_key",
    "map_state",
    "provider_config",
    "register_backend",
    "registered_backends",
    "resolve_backend",
    "task_from_tags",
]
