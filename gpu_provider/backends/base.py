"""The backend contract: what every place that runs GPU jobs (local processes, AWS Batch,
SageMaker, Kubernetes) must offer the operator and the trigger.

A backend translates a backend-neutral :class:`JobRequest` into its service's calls and maps its
service's states onto the closed :class:`JobState` set, in one table per backend. Backends are
found by name through the registry at the bottom of this module; the registry holds import paths,
so naming a backend never imports boto3 or kubernetes until the backend is actually used.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, ClassVar

from gpu_provider.job import CAPACITY_TYPES, GpuResources


class JobState(str, Enum):
    """The closed set of states a job attempt can be in, on every backend."""

    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        return not self.terminal


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.PREEMPTED, JobState.CANCELLED})


def map_state(table: Mapping[str, JobState], remote_state: str, *, backend: str) -> JobState:
    """Look a service's state up in a backend's table; an unknown state is an error, never a guess."""
    try:
        return table[remote_state]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ValueError(
            f"{backend} backend: unknown remote job state {remote_state!r}; known states: {known}. "
            "This provider version does not understand the service's answer; upgrade it or report this."
        ) from None


_NAME_UNSAFE = re.compile(r"[^a-z0-9-]+")


def _slug(text: str, limit: int) -> str:
    return _NAME_UNSAFE.sub("-", text.lower()).strip("-")[:limit].strip("-") or "x"


@dataclass(frozen=True)
class TaskKey:
    """The Airflow task instance a job belongs to, across all its tries and attempts."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    @property
    def run_hash(self) -> str:
        """A short, stable hash of the dag id, task id and run id.

        Run ids are long and hold characters no service allows, and names keep only the first
        characters of the dag and task ids. Hashing all three keeps two DAGs whose ids share a
        prefix apart even when their runs have the same id (e.g. ``scheduled__2026-01-05T00:00:00+00:00``).
        """
        key = "\x1f".join((self.dag_id, self.task_id, self.run_id))
        return hashlib.sha256(key.encode()).hexdigest()[:10]

    @property
    def prefix(self) -> str:
        """The name prefix every attempt of this task instance shares (DNS-1123 safe, <= 50 chars)."""
        mi = f"-m{self.map_index}" if self.map_index >= 0 else ""
        return f"gp-{_slug(self.dag_id, 14)}-{_slug(self.task_id, 14)}-{self.run_hash}{mi}"


@dataclass(frozen=True)
class JobIdentity:
    """Deterministic identity of one attempt, carried in job names and tags so a retry can find it."""

    task: TaskKey
    try_number: int
    attempt: int
    capacity: str
    team: str | None = None

    @property
    def name(self) -> str:
        """``gp-<dag>-<task>-<runhash>[-m<map>]-t<try>-a<attempt>``: valid as a Batch, SageMaker and k8s name."""
        return f"{self.task.prefix}-t{self.try_number}-a{self.attempt}"

    def tags(self) -> dict[str, str]:
        """Tags/labels for cost attribution, the reaper and lookup."""
        tags = {
            "gpu-provider/dag-id": self.task.dag_id,
            "gpu-provider/task-id": self.task.task_id,
            "gpu-provider/run-hash": self.task.run_hash,
            "gpu-provider/map-index": str(self.task.map_index),
            "gpu-provider/try-number": str(self.try_number),
            "gpu-provider/attempt": str(self.attempt),
            "gpu-provider/capacity": self.capacity,
        }
        if self.team:
            tags["gpu-provider/team"] = self.team
        return tags


@dataclass(frozen=True)
class JobRequest:
    """Everything a backend needs to start one attempt. Built by the operator, backend-neutral."""

    identity: JobIdentity
    command: tuple[str, ...]
    env: Mapping[str, str]
    """The job's own ``env=`` plus the ``GPU_PROVIDER_*`` contract (no worker environment)."""
    resources: GpuResources
    capacity: str
    image: str | None = None
    max_runtime_s: float | None = None
    """The backend stops the job when it has run this long (enforced by the service, not Airflow)."""
    checkpoint_uri: str | None = None
    resume_from: str | None = None
    priority: int | None = None
    """The task's ``priority=`` (backends with service-side priorities use it, e.g. Batch fair share)."""

    def __post_init__(self) -> None:
        if self.capacity not in CAPACITY_TYPES:
            raise ValueError(f"capacity={self.capacity!r} is not one of {CAPACITY_TYPES}")


@dataclass(frozen=True)
class JobHandle:
    """A reference to one submitted attempt: small and JSON-serialisable (it travels to the trigger)."""

    backend: str
    job_id: str
    name: str
    attempt: int
    capacity: str
    submitted_at: float
    """Unix time of submission; the spot wait deadline counts from here."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific lookup data (region, queue, state directory...). JSON values only."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobHandle:
        return cls(
            backend=str(data["backend"]),
            job_id=str(data["job_id"]),
            name=str(data["name"]),
            attempt=int(data["attempt"]),
            capacity=str(data["capacity"]),
            submitted_at=float(data["submitted_at"]),
            extra=dict(data.get("extra") or {}),
        )


@dataclass(frozen=True)
class JobStatus:
    """What a backend reports about one attempt at one moment."""

    state: JobState
    reason: str = ""
    """Why it is in this state, in the service's words where it gave some (spot reclaim, exit code...)."""
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    gpu_seconds: float = 0.0
    """GPU-seconds consumed so far (GPUs held x wall time running)."""
    output_uri: str | None = None
    """Set when the job declared an output (see ``gpu_provider.runtime.declare_output``)."""
    log_url: str | None = None
    """Where a person can read this attempt's log, once the backend knows (e.g. its CloudWatch stream)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStatus:
        kwargs = dict(data)
        kwargs["state"] = JobState(kwargs["state"])
        return cls(**kwargs)


class Backend(ABC):
    """A place that runs GPU jobs. Subclasses live one per module under ``gpu_provider/backends/``.

    Backends must be cheap to construct (no client, no network in ``__init__``): the operator
    builds them at DAG parse time. Every method may be called from a thread.
    """

    #: the registered name, e.g. ``"local"``
    name: ClassVar[str]
    #: seconds between status checks unless the task or ``[gpu_provider] poll_interval`` says otherwise
    default_poll_interval: ClassVar[float] = 30.0
    #: whether a deferred task's trigger copies the job's log into the task log on every tick; a
    #: backend whose log reads cost one service call per job turns this off, and the worker then
    #: copies each attempt's whole log when it ends
    stream_logs_when_deferred: ClassVar[bool] = True
    #: seconds a job's last log lines may arrive after its end is reported (a log service's delay);
    #: the worker keeps reading the log that long, until a read brings nothing new
    log_settle_s: ClassVar[float] = 0.0

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """JSON-serialisable options that rebuild an equal backend with ``from_options`` (for triggers)."""

    @classmethod
    def from_options(cls, **options: Any) -> Backend:
        """Build a backend from options (strings from templates are accepted and converted)."""
        return cls(**options)

    def validate(  # noqa: B027
        self,
        resources: GpuResources,
        capacity: str,
        *,
        multi_capacity: bool,
        priority: int | None = None,
        max_runtime_s: float | None = None,
    ) -> None:
        """Refuse at parse time what this backend can never run (raise ``ValueError``).

        :param capacity: the first attempt's capacity
        :param multi_capacity: whether later attempts may use the other capacity type
        :param priority: the task's ``priority=``, if given
        :param max_runtime_s: the longest an attempt may run, if limited
        """

    def validate_image(self, image: str | None) -> None:  # noqa: B027
        """Refuse an image (or its absence) this backend cannot run; called once the image is known."""

    @abstractmethod
    def submit(self, request: JobRequest) -> JobHandle:
        """Start one attempt and return its handle. Must not block until the job runs."""

    @abstractmethod
    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Report the status of many attempts in as few service calls as the service allows.

        :return: status by ``job_id``, one entry for every handle given
        """

    @abstractmethod
    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Stop an attempt (no error if it already ended). ``reason`` is recorded where the service allows."""

    @abstractmethod
    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt this backend knows for a task instance, oldest first (used to reattach)."""

    @abstractmethod
    def logs(self, handle: JobHandle, since: int = 0) -> tuple[list[str], int]:
        """Log lines of an attempt from position ``since``; returns the lines and the next position."""

    def console_url(self, handle: JobHandle) -> str | None:
        """Where a person can look at the job (a console link), if anywhere."""
        return None

    def logs_url(self, handle: JobHandle) -> str | None:
        """Where a person can read the job's log before its status says more (``JobStatus.log_url``)."""
        return None

    def spec(self) -> dict[str, Any]:
        """The mapping form ``{"name": ..., **options}`` that :func:`resolve_backend` accepts."""
        return {"name": self.name, **self.options()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backend) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.spec().items())))

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


def provider_config(key: str) -> str:
    """``[gpu_provider] <key>`` from the Airflow config, stripped; ``""`` when unset or Airflow is absent."""
    try:
        from airflow.configuration import conf  # imported here: job-side code never needs Airflow
    except ImportError:
        return ""
    return str(conf.get("gpu_provider", key, fallback="") or "").strip()


# --- registry --------------------------------------------------------------------------------

DEFAULT_BACKEND = "local"

_REGISTRY: dict[str, str] = {
    "local": "gpu_provider.backends.local.LocalBackend",
    "batch": "gpu_provider.backends.batch.BatchBackend",
}


def register_backend(name: str, import_path: str, *, replace: bool = False) -> None:
    """Register a backend class by import path (imported only when used).

    :param replace: allow overriding an existing name; without it a collision is an error
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"backend name {name!r} must be lower-case letters, digits and underscores")
    if name in _REGISTRY and _REGISTRY[name] != import_path and not replace:
        raise ValueError(
            f"backend name {name!r} is already registered to {_REGISTRY[name]}; pass replace=True to override"
        )
    _REGISTRY[name] = import_path


def registered_backends() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    try:
        path = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"backend={name!r} is not a known backend; valid names: {', '.join(registered_backends())}"
        ) from None
    module_name, _, attr = path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backend {name!r} is registered to {path}, which is not a Backend subclass")
    return cls


def check_backend_name(name: str) -> None:
    """Fail with the list of valid names, without importing the backend (parse-time check)."""
    if name not in _REGISTRY:
        backend_class(name)


def resolve_backend(value: Backend | str | Mapping[str, Any] | None) -> Backend:
    """Turn what a DAG author passed as ``backend=`` into a backend object.

    Accepts a backend object, a registered name, ``None`` (the default, ``local``), or a mapping
    ``{"name": "local", "simulate_preemptions": [8]}`` whose other keys are the backend's options.
    An option whose value is ``None`` or an empty string (a template that rendered to nothing) is
    treated as not given, so one templated mapping can serve several backends.
    """
    if value is None or value == "":
        value = DEFAULT_BACKEND
    if isinstance(value, Backend):
        return value
    if isinstance(value, str):
        return backend_class(value.strip()).from_options()
    if isinstance(value, Mapping):
        options = {k: v for k, v in value.items() if v is not None and not (isinstance(v, str) and not v.strip())}
        name = options.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"backend={dict(value)!r}: a backend mapping needs a 'name' key naming the backend")
        cls = backend_class(name.strip())
        try:
            return cls.from_options(**options)
        except TypeError as err:
            raise ValueError(f"backend={dict(value)!r}: bad options for the {name!r} backend: {err}") from err
    raise TypeError(
        f"backend={value!r} ({type(value).__name__}) must be a Backend object, a backend name "
        f"({', '.join(registered_backends())}) or a mapping with a 'name' key"
    )
