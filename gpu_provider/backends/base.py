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
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar

from gpu_provider import names
from gpu_provider.exceptions import GpuJobStatusError
from gpu_provider.extras import require_backend_extra
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
            names.TAG_DAG_ID: self.task.dag_id,
            names.TAG_TASK_ID: self.task.task_id,
            names.TAG_RUN_ID: self.task.run_id,
            names.TAG_RUN_HASH: self.task.run_hash,
            names.TAG_MAP_INDEX: str(self.task.map_index),
            names.TAG_TRY_NUMBER: str(self.try_number),
            names.TAG_OWNER_TRY: str(self.try_number),
            names.TAG_ATTEMPT: str(self.attempt),
            names.TAG_CAPACITY: self.capacity,
        }
        if self.team:
            tags[names.TAG_TEAM] = self.team
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
    capacity_wait_s: float | None = None
    """How long this attempt may wait for capacity (the policy's spot wait), for services that enforce
    it themselves (SageMaker ``MaxWaitTimeInSeconds``); the watch enforces it on every backend too."""
    instance_type: str | None = None
    """The one instance type this attempt runs on, chosen by the policy's instance fallback from
    ``resources.instance_types`` (each backend places it its own way: Batch a queue per type, SageMaker the
    ``InstanceType``, Kubernetes a node affinity); ``None``: the backend chooses from ``resources``."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes this attempt must not run on: those where earlier attempts of the run hit a GPU hardware fault
    (``node_fault``). Kubernetes keeps away from them by node anti-affinity; on AWS Batch and SageMaker
    (which do not let a job name a host to avoid) and locally it is ignored."""

    def __post_init__(self) -> None:
        if self.capacity not in CAPACITY_TYPES:
            raise ValueError(f"capacity={self.capacity!r} is not one of {CAPACITY_TYPES}")
        types = self.resources.instance_types
        if self.instance_type is not None and types and self.instance_type not in types:
            raise ValueError(
                f"instance_type={self.instance_type!r} is not one of resources.instance_types {list(types)!r}"
            )


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


def _known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``cls`` has: a record written by a newer version still loads."""
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in known}


@dataclass(frozen=True)
class JobStatus:
    """What a backend reports about one attempt at one moment."""

    state: JobState
    reason: str = ""
    """Why it is in this state, in the service's words where it gave some (spot reclaim, exit code,
    a queue's status reason such as ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``...)."""
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    gpu_seconds: float = 0.0
    """GPU-seconds consumed so far (GPUs held x wall time running), over every run inside the attempt."""
    output_uri: str | None = None
    """Set when the job declared an output (see ``gpu_provider.runtime.declare_output``)."""
    log_url: str | None = None
    """Where a person can read this attempt's log, once the backend knows (e.g. its CloudWatch stream)."""
    interruption: str | None = None
    """For an attempt that ended without the job's own fault: one of :data:`gpu_provider.names.INTERRUPTION_KINDS`.
    ``PREEMPTED`` states imply ``preempted``; a backend sets ``capacity_timeout`` when the service (or
    an earlier cancel by this provider, marked on the job) gave up waiting for capacity, and ``lost``
    when the service no longer knows the job."""
    restarts: int = 0
    """Interruptions the service absorbed inside this attempt by restarting the job itself (SageMaker
    managed spot, Kubernetes Job retries); each restart resumes from the newest checkpoint."""
    queued_since: float | None = None
    """Unix time the attempt last began waiting for capacity (after a restart inside the job too);
    the spot wait counts from here. ``None``: from submission."""
    billable_seconds: float | None = None
    """What the service bills for, where it reports it (SageMaker ``BillableTimeInSeconds``)."""
    training_seconds: float | None = None
    """The time the job ran, as the service counts it where it reports it (SageMaker
    ``TrainingTimeInSeconds``); with ``billable_seconds`` it gives the spot saving of the attempt."""
    instance_type: str | None = None
    """The instance type the attempt actually ran on, where known."""
    capacity: str | None = None
    """The capacity type the attempt actually ran on, where the service reports it."""
    owner_try: int | None = None
    """The Airflow try that owns this attempt, as marked on the job (:meth:`Backend.mark`)."""
    collected: bool = False
    """Whether a try already collected this attempt's outcome, as marked on the job."""
    fault: str | None = None
    """For ``interruption="node_fault"``: what failed under the job (:data:`gpu_provider.names.FAULT_KINDS`);
    the engine fails an attempt as the job's own error when the one before it ended with the same fault."""
    node: str | None = None
    """The node, host or instance the attempt ran on, where the service says (Kubernetes: the pod's
    ``spec.nodeName``): a resubmission after a node fault keeps away from it where the backend can."""
    never_starts: str | None = None
    """For a ``QUEUED`` attempt: the service's reason why it can never start as submitted (AWS Batch
    ``MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT``), else ``None``. A read only reports it: the task that
    owns the attempt stops it and fails; a sensor or another reader never acts on it."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStatus:
        """Tolerant: fields a newer version added are ignored, missing ones take their defaults."""
        kwargs = _known_fields(cls, data)
        kwargs["state"] = JobState(kwargs["state"])
        return cls(**kwargs)


PollResult = dict[str, "JobStatus | GpuJobStatusError"]
"""What :meth:`Backend.poll` returns: for every handle's ``job_id``, its status or why that one job's
status could not be read."""


@dataclass(frozen=True)
class LogChunk:
    """Log lines of an attempt read from a cursor, and the cursor to read on from."""

    lines: list[str]
    cursor: str | None
    """Opaque to everyone but the backend (several streams: Batch nodes, SageMaker hosts, indexed
    pods); pass it back unchanged. ``None`` reads from the start."""
    more: bool = False
    """The read stopped at its size limit and more lines are there now: read again to drain."""


#: the most bytes of log lines one :meth:`Backend.logs` call returns (about; one long line may pass it)
LOG_READ_BYTES = 1 << 20
#: lines longer than this are cut, with a note of how much was cut (bounded memory in every reader)
MAX_LOG_LINE_CHARS = 16 * 1024


def clip_line(line: str, limit: int = MAX_LOG_LINE_CHARS) -> str:
    """A log line cut to ``limit`` characters, saying how much was cut."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... [line cut: {len(line) - limit} more characters]"


def lookup_key(job_id: str | None, name: str | None) -> tuple[str, str]:
    """``("job_id", value)`` or ``("name", value)`` for :meth:`Backend.lookup`: exactly one, a non-empty string."""
    given = [(field, value) for field, value in (("job_id", job_id), ("name", name)) if value is not None]
    if len(given) != 1:
        raise ValueError(f"lookup takes exactly one of job_id= and name=; got {[f for f, _ in given] or 'neither'}")
    field_name, value = given[0]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field_name}={value!r} must be a non-empty string")
    return field_name, value.strip()


def task_from_tags(tags: Mapping[str, Any]) -> TaskKey | None:
    """The task instance named by a job's tags/labels (:meth:`JobIdentity.tags`), ``None`` without them."""
    dag_id, task_id, run_id = (tags.get(k) for k in (names.TAG_DAG_ID, names.TAG_TASK_ID, names.TAG_RUN_ID))
    if not (dag_id and task_id and run_id):
        return None
    try:
        map_index = int(tags.get(names.TAG_MAP_INDEX) or -1)
    except ValueError:
        return None
    return TaskKey(str(dag_id), str(task_id), str(run_id), map_index)


@dataclass(frozen=True)
class OwnedJob:
    """One active job this provider started, as :meth:`Backend.list_owned` reports it.

    Read from the job's own tags/labels/records, never from Airflow: the reaper asks Airflow
    whether ``task`` still has a live try, and the spend report prices what is still running.
    """

    handle: JobHandle
    task: TaskKey | None
    """The task instance named by the job's tags; ``None`` when they are missing or unreadable."""
    state: JobState
    """A non-terminal state (``list_owned`` reports active jobs only)."""
    try_number: int | None = None
    """The Airflow try that owns the job (the owner-try mark, else the try it was submitted by)."""
    team: str | None = None
    started_at: float | None = None
    """Unix time the job started running, where the service reports it."""
    instance_type: str | None = None
    nodes: int = 1
    gpus: float = 0.0
    """GPUs per node."""
    max_runtime_s: float | None = None
    """The run time limit submitted with the job, where the service records it."""
    region: str | None = None
    """The AWS region the job runs in (for its price); ``None`` for a backend outside AWS (local)."""
    max_wait_s: float | None = None
    """A wall-clock limit counted from submission, waiting for capacity included, where the service
    enforces one besides ``max_runtime_s`` (SageMaker managed spot: ``MaxWaitTimeInSeconds``)."""
    training_seconds: float | None = None
    """The run time the service counts against ``max_runtime_s`` so far, where it counts something
    other than the time since ``started_at`` (SageMaker: time spent training, without waits for
    capacity and restarts); ``None``: the time since ``started_at``."""

    @property
    def total_gpus(self) -> float:
        return self.gpus * self.nodes


@dataclass(frozen=True)
class OwnerRead:
    """Who owns an attempt, read from the service at one moment, with no cache (:meth:`Backend.read_owner`)."""

    owner_try: int | None
    """The Airflow try marked on the job as its owner (:meth:`Backend.mark`), else the try that
    submitted it; ``None`` when the job carries neither (not submitted by this provider)."""
    exists: bool = True
    """``False``: the service no longer knows the job (nothing left to stop or to take over)."""

    def later_than(self, try_number: int | None) -> bool:
        """Whether a later Airflow try than ``try_number`` owns the job (then ``try_number`` is a zombie
        that must not cancel it, resubmit after it, or take it over)."""
        return self.owner_try is not None and try_number is not None and self.owner_try > try_number


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, declared once: :meth:`Backend.validate`, the docs' capabilities table
    (docs/how-to/write-a-gpu-task.md) and the example DAG read it instead of each backend repeating the
    same checks."""

    multi_node: bool = True
    multi_node_spot: bool = True
    fractional_gpus: bool = True
    instance_types: bool = True
    image_required: bool = False
    restarts_inside_job: bool = False
    """The service restarts an interrupted job itself, inside the same attempt."""
    unique_names: bool = False
    """The service refuses a second job with the same name, so :meth:`Backend.submit` adopts the
    existing one; ``False``: names may repeat, and ``submit`` looks the name up before creating."""
    priority_range: tuple[int, int] | None = None
    """Service-side priorities the backend passes on, inclusive; ``None``: none."""
    min_runtime_s: float | None = None
    """The shortest ``max_runtime`` the service accepts."""


class EventSink(ABC):
    """Where an :class:`EventSource` delivers what it learns (implemented by the triggerer's shared poller)."""

    @abstractmethod
    def changed(self, keys: Collection[str] | None) -> None:
        """Jobs changed: their ``JobHandle.job_id`` or ``name``; ``None``: any job may have changed
        (events may have been missed, e.g. after a re-list), so every watched job is polled now."""

    @abstractmethod
    def watches(self, key: str) -> bool:
        """Whether a job with this ``job_id`` or ``name`` is waited on here (a queue's message naming it is
        consumed; others are left for their own readers). May be called from the source's thread."""

    @abstractmethod
    def up(self, flowing: bool) -> None:
        """Whether events are flowing now (the watch is open, the last queue read succeeded). While they
        flow, the poller's regular tick slows to its backstop interval; when not, it polls at its interval."""


class EventSource(ABC):
    """A service's own change notifications (a Kubernetes watch, EventBridge events read from an SQS
    queue), used by the triggerer's shared poller as hints: a job named by an event is polled at once,
    in one batched :meth:`Backend.poll`. Events are never taken as a job's status: the poll is.
    Losing events therefore costs latency only; the poller's backstop tick still sees every end."""

    #: sources with equal keys are one: a process opens one per key (one watch per namespace and cluster)
    key: str = ""

    @abstractmethod
    def run(self, sink: EventSink, stop: threading.Event) -> None:
        """Deliver events to ``sink`` until ``stop`` is set (called in a thread of its own; reconnects
        and resumes itself). Raising ends this run: the caller reports the source down and runs it
        again after a backoff. Must return soon after ``stop`` is set."""

    def close(self) -> None:  # noqa: B027
        """Interrupt a blocking read so :meth:`run` returns soon after ``stop`` is set (optional)."""


class Backend(ABC):
    """A place that runs GPU jobs. Subclasses live one per module under ``gpu_provider/backends/``.

    Backends must be cheap to construct (no client, no network in ``__init__``): the operator
    builds them at DAG parse time. Every method may be called from a thread.
    """

    #: the registered name, e.g. ``"local"``
    name: ClassVar[str]
    #: what this backend can run; :meth:`validate` refuses the rest with one message per capability
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: the service's name in messages, e.g. ``"AWS Batch"``
    service: ClassVar[str] = ""
    #: fixed options (who or what the job runs as, where its secrets come from, which account, endpoint or
    #: folder): literal in the DAG file or from [gpu_provider], never from a template (a template can take
    #: its value from the trigger form, which is untrusted input); checked at parse time and after rendering
    fixed_options: ClassVar[frozenset[str]] = frozenset()
    #: seconds between status checks unless the task or ``[gpu_provider] poll_interval`` says otherwise
    default_poll_interval: ClassVar[float] = 30.0
    #: whether a deferred task's trigger copies the job's log into the task log on every tick; a
    #: backend whose log reads cost one service call per job turns this off, and the worker then
    #: copies each attempt's whole log when it ends
    stream_logs_when_deferred: ClassVar[bool] = True
    #: seconds a job's last log lines may arrive after its end is reported (a log service's delay);
    #: the worker keeps reading the log that long, until a read brings nothing new
    log_settle_s: ClassVar[float] = 0.0
    #: whether ``JobStatus.output_uri`` may be the service's own output (SageMaker's model artifacts)
    #: rather than the one the job declared: a job's declaration (``declare_output``) then wins, so
    #: the worker reads the log for one before collecting a succeeded attempt
    service_output: ClassVar[bool] = False
    #: how the service sells its instances, for prices (:mod:`gpu_provider.spend.prices`): ``"ec2"``,
    #: ``"sagemaker"`` (``ml.`` instance types) or ``"local"`` (``[gpu_provider] local_gpu_hour_usd``)
    price_catalog: ClassVar[str] = "ec2"

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """JSON-serialisable options that rebuild an equal backend with ``from_options`` (for triggers)."""

    @classmethod
    def from_options(cls, **options: Any) -> Backend:
        """Build a backend from options (strings from templates are accepted and converted)."""
        return cls(**options)

    def validate(
        self,
        resources: GpuResources,
        capacity: str,
        *,
        multi_capacity: bool,
        priority: int | None = None,
        max_runtime_s: float | None = None,
    ) -> None:
        """Refuse at parse time what this backend can never run (raise ``ValueError``).

        The checks every backend shares are made here from :attr:`capabilities`; a backend adds its
        own after calling ``super().validate(...)``.

        :param capacity: the first attempt's capacity
        :param multi_capacity: whether later attempts may use the other capacity type
        :param priority: the task's ``priority=``, if given
        :param max_runtime_s: the longest an attempt may run, if limited
        """
        caps, where = self.capabilities, self.service or f"the {self.name} backend"
        if resources.nodes > 1 and not caps.multi_node:
            raise ValueError(f"resources.nodes={resources.nodes}: {where} runs single-node jobs only; use nodes=1")
        if resources.nodes > 1 and not caps.multi_node_spot and (capacity == names.SPOT or multi_capacity):
            raise ValueError(
                f"resources.nodes={resources.nodes} with spot capacity: {where} cannot run multi-node jobs on "
                "spot; use capacity='on_demand' for this job, or a backend that runs distributed training on spot"
            )
        if resources.fractional and not caps.fractional_gpus:
            raise ValueError(
                f"resources.gpus={resources.gpus!r}: {where} allocates whole GPUs only; use gpus=1 or more"
            )
        if resources.instance_types and not caps.instance_types:
            raise ValueError(
                f"resources.instance_types={list(resources.instance_types)!r}: {where} does not pick instance "
                "types per job (its compute environment or node pool decides); leave instance_types empty"
            )
        if priority is not None and caps.priority_range is not None:
            low, high = caps.priority_range
            if not low <= priority <= high:
                raise ValueError(f"priority={priority!r}: {where} accepts priorities from {low} to {high}")
        if max_runtime_s is not None and caps.min_runtime_s is not None and max_runtime_s < caps.min_runtime_s:
            raise ValueError(
                f"max_runtime={max_runtime_s:g}s (or execution_timeout): {where} accepts limits of "
                f"{caps.min_runtime_s:g}s or more"
            )

    def validate_instance_fallback(self, instance_types: Sequence[str]) -> None:
        """Refuse at parse time an ordered instance preference this backend cannot place type by type
        (raise ``ValueError`` naming the type and what is allowed). By default a backend that picks instance
        types per job (``capabilities.instance_types``) takes any; the others refuse."""
        if not self.capabilities.instance_types:
            where = self.service or f"the {self.name} backend"
            raise ValueError(
                f"resources.instance_types={list(instance_types)!r} with capacity.instances=InstanceFallback(...): "
                f"{where} cannot run an attempt on a chosen instance type"
            )

    def validate_image(self, image: str | None) -> None:
        """Refuse an image (or its absence) this backend cannot run; called once the image is known."""
        if self.capabilities.image_required and not image:
            raise ValueError(
                f"image=None: {self.service or self.name} runs containers; set image= to the job's container image"
            )

    @abstractmethod
    def submit(self, request: JobRequest) -> JobHandle:
        """Create the attempt, or adopt it if it exists already, and return its handle.

        Must not block until the job runs. Idempotent per ``request.identity.name``: a service that
        refuses duplicate names (``capabilities.unique_names``) answers with the existing job, which
        the backend returns; on a service that allows them, the backend looks the name up first
        (and again before re-sending a submit whose answer was lost), so a retried call never
        starts a second job of one attempt.
        """

    @abstractmethod
    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        """Report the status of many attempts in as few service calls as the service allows.

        :return: for *every* handle's ``job_id``: its :class:`JobStatus`, or a
            :class:`~gpu_provider.exceptions.GpuJobStatusError` when that one job's answer could not
            be understood. A job the service no longer knows is a terminal status with
            ``interruption="lost"``, never a missing entry. Only a failure of the whole call (the
            service unreachable, throttled) raises.
        """

    @abstractmethod
    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """The try that owns an attempt, read from the service now: never from a cache.

        Everything destructive asks this first: ``on_kill`` (worker and trigger), the engine's
        cancels (capacity timeout, restart limit, queue timeout, deadline, budget, duplicates), a
        resubmission after an interruption, and a try taking an attempt over. :meth:`poll` may
        answer from caches (it serves watching); this must not, so that a zombie try sees at once
        that its successor marked the job (:meth:`mark`). One service call is expected (a tag or
        label read, a describe); a job the service no longer knows is ``OwnerRead(None, exists=False)``.
        Any failure to read raises: the caller decides what missing evidence means. From a signal
        handler it is called in a separate thread with a time limit (it may block on a connection).
        """

    @abstractmethod
    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Stop an attempt (no error if it already ended). ``reason`` is recorded where the service allows.

        Called from ``on_kill``, i.e. from a signal handler on the task's main thread: it must not
        wait for a lock that the interrupted code may hold.
        """

    @abstractmethod
    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt this backend knows for a task instance, oldest first (used to reattach)."""

    @abstractmethod
    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """The handle of one job given its id or its name (exactly one), or ``None`` when the backend
        has no such job. Used by ``GpuJobSensor`` to wait on a job it did not submit.

        The job need not have been submitted by this provider. Where a name is not unique (Batch),
        the newest active job of that name is taken, else the newest. Bad input (both or neither
        given, a value no job of this service can have) raises ``ValueError``.
        """

    @abstractmethod
    def task_of(self, handle: JobHandle) -> TaskKey | None:
        """The task instance an attempt belongs to, read from the job's own tags/labels/records; ``None``
        when the job was not submitted by this provider or the service no longer knows it. With
        :meth:`find_existing`, this finds the attempts that followed it (a resubmit after a preemption)."""

    @abstractmethod
    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Log lines of an attempt after ``cursor``, at most about ``max_bytes`` of them per call.

        Lines come without their newline, each cut to :data:`MAX_LOG_LINE_CHARS` (:func:`clip_line`);
        ``LogChunk.more`` says the read stopped at the limit. Memory stays bounded whatever the job writes.
        """

    @abstractmethod
    def list_owned(self) -> list[OwnedJob]:
        """Every active (non-terminal) job this provider started within this backend's scope, found
        by its tags/labels (Batch: the configured queues; local: the state directory; SageMaker:
        training jobs with the provider's tags; Kubernetes: pods and jobs in the namespace with its
        labels). The reaper stops those with no live task behind them; a backend must implement it
        so that nothing it starts can be forgotten.

        A job whose state cannot be read is reported with its last known active state rather than
        left out (the reaper decides from the owning task, not from the job). Only a failure of the
        whole listing (the service unreachable) raises.
        """

    def price_region(self) -> str | None:
        """The AWS region this backend's jobs run (and are priced) in; ``None``: not in AWS, or unknown.
        May read the connection; not called at parse time."""
        return None

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:  # noqa: B027
        """Record on the job itself which Airflow try owns it, or that its outcome was collected.

        Reported back in :attr:`JobStatus.owner_try` and :attr:`JobStatus.collected`. The task
        state store keeps the same facts; marking the job too lets a zombie try (one Airflow
        replaced) see that it lost the job before cancelling it, and lets a lookup after a lost
        store tell a collected result from one nobody saw. A backend whose service cannot tag
        jobs leaves this a no-op.
        """

    def event_source(self) -> EventSource | None:
        """The service's change notifications for this backend's jobs, if it has any and they are turned
        on; ``None`` (the default): the shared poller polls at its interval only. Must be cheap (no call)."""
        return None

    def console_url(self, handle: JobHandle) -> str | None:
        """Where a person can look at the job (a console link), if anywhere."""
        return None

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` lines of an attempt's output, read from its end without reading it all:
        the error of a job that failed quotes them. ``[]`` where the backend cannot read them cheaply."""
        return []

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
    "kubernetes": "gpu_provider.backends.kubernetes.KubernetesBackend",
    "sagemaker": "gpu_provider.backends.sagemaker.SageMakerBackend",
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
    """The backend class registered as ``name``. A backend whose pip extra is missing raises
    :class:`~gpu_provider.extras.MissingExtraError` naming the extra (``gpu_provider.extras.BACKEND_EXTRAS``)."""
    try:
        path = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"backend={name!r} is not a known backend; valid names: {', '.join(registered_backends())}"
        ) from None
    require_backend_extra(name)
    module_name, _, attr = path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backend {name!r} is registered to {path}, which is not a Backend subclass")
    return cls


def backend_options(cls: type[Backend]) -> list[str]:
    """The option names a backend class takes (its keyword-only constructor parameters)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def check_backend_name(name: str) -> None:
    """Fail with the list of valid names, without importing the backend (parse-time check)."""
    if name not in _REGISTRY:
        backend_class(name)
    require_backend_extra(name)


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
            raise ValueError(
                f"backend mapping with keys {sorted(map(str, value))}: it needs a 'name' key naming the backend "
                f"({', '.join(registered_backends())})"
            )
        cls = backend_class(name.strip())
        unknown = sorted(set(options) - set(backend_options(cls)))
        if unknown:
            # option values may be secrets: name the keys only
            raise ValueError(
                f"backend={name!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
                f"the {name} backend takes: {', '.join(backend_options(cls))}"
            )
        try:
            return cls.from_options(**options)
        except TypeError as err:
            raise ValueError(f"backend={name!r}: bad options for the {name!r} backend: {err}") from err
    raise TypeError(
        f"backend={value!r} ({type(value).__name__}) must be a Backend object, a backend name "
        f"({', '.join(registered_backends())}) or a mapping with a 'name' key"
    )
