"""What travels between the operator, the trigger and a backend: requests, handles, statuses, owned jobs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from gpu_provider.backends.contract.identity import JobIdentity, TaskKey
from gpu_provider.backends.contract.states import JobState
from gpu_provider.exceptions import GpuJobStatusError
from gpu_provider.job import CAPACITY_TYPES, GpuResources

#: the key of :meth:`JobHandle.as_adopted`'s mark in a handle's ``extra``
ADOPTED = "adopted_at_submit"


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

    def as_adopted(self) -> JobHandle:
        """This handle, marked as the answer of a :meth:`~gpu_provider.backends.base.Backend.submit` that found
        the attempt existing already (created by another execution of the task, not by this call): the
        operator says so in the task log and takes the mark off (:meth:`take_adopted`) before keeping it."""
        return replace(self, extra={**self.extra, ADOPTED: True})

    def take_adopted(self) -> tuple[JobHandle, bool]:
        """This handle without the mark of :meth:`as_adopted`, and whether it had it."""
        if not self.extra.get(ADOPTED):
            return self, False
        return replace(self, extra={k: v for k, v in self.extra.items() if k != ADOPTED}), True

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
    stopping: str | None = None
    """For an attempt that has not ended yet: the reason of the stop this provider asked for (without
    :data:`~gpu_provider.names.CANCEL_PREFIX`), where the service shows the stop being taken before the job ends
    (SageMaker: ``Stopping`` with this provider's stop tag; local: the job's cancel request). ``None``: no stop
    shown (AWS Batch shows a TerminateJob only by the job's end; Kubernetes reads a stopped object CANCELLED at
    once). A try reads it to confirm a stop it planned (:mod:`gpu_provider.engine.planned_stops`)."""

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
