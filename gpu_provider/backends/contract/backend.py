"""The :class:`Backend` class every place that runs jobs implements, and the capabilities it declares."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.contract.events import EventSource
from gpu_provider.backends.contract.identity import TaskKey
from gpu_provider.backends.contract.jobs import JobHandle, JobRequest, OwnedJob, OwnerRead, PollResult
from gpu_provider.backends.contract.logs import LOG_READ_BYTES, LogChunk
from gpu_provider.job import GpuResources


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


class Backend(ABC):
    """A place that runs GPU jobs. Subclasses live one package per backend under ``gpu_provider/backends/``.

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
        own in :meth:`validate_job`, which this calls last.

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
        self.validate_job(resources, capacity, multi_capacity, max_runtime_s)

    def validate_job(self, resources: GpuResources, capacity: str, multi: bool, runtime_s: float | None) -> None:
        """This backend's own parse-time checks, after the shared ones of :meth:`validate` (raise
        ``ValueError`` naming the field, the value and what is allowed). None by default.

        :param multi: whether later attempts may use the other capacity type
        :param runtime_s: the longest an attempt may run, if limited
        """
        return None

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
        starts a second job of one attempt. A handle for a job that existed before this call is
        returned marked with :meth:`JobHandle.as_adopted`: the operator then says in the task log
        that it reattached (``Reattached to <backend> job <name> (started by try N; ...)``) instead
        of reporting a new submission, and takes the mark off before it keeps the handle.
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
