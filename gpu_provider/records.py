"""The attempt record: one typed class for what is known about one attempt of a task instance.

The operator writes records to Airflow's task state store (so a new try can reattach after a
worker crash), hands them to the trigger's ``execute_complete`` and returns them in XCom; spend
control, the reaper and the UI read the same class. Records are JSON dicts on the wire with a
schema version, and :meth:`AttemptRecord.from_dict` is tolerant: a worker and a triggerer one minor
version apart read each other's records (unknown keys are ignored, missing keys take defaults).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import Any

from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.names import CANCEL_PREFIX, LOST, PREEMPTED, STOP_CONFIRMED, STOP_MARKS

#: bump when a field changes meaning; adding a field with a default needs no bump
SCHEMA_VERSION = 2


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat() if ts else None


@dataclass
class AttemptRecord:
    """One attempt of a task instance's job: where it ran, how it ended, what it cost."""

    attempt: int
    handle: JobHandle
    state: JobState = JobState.QUEUED
    reason: str = ""
    started_at: str | None = None
    ended_at: str | None = None
    resume_from: str | None = None
    """The checkpoint the attempt was started from (``None``: fresh, or unknown for one found by lookup)."""
    try_number: int | None = None
    """The Airflow try that submitted the attempt (``None``: found by lookup, submitter unknown)."""
    owner_try: int | None = None
    """The Airflow try that owns the attempt now: only it may cancel the attempt or submit its successor."""
    gpu_seconds: float = 0.0
    billable_seconds: float | None = None
    training_seconds: float | None = None
    """The time the job ran as the service counts it, where it reports it (SageMaker ``TrainingTimeInSeconds``)."""
    instance_type: str | None = None
    """The instance type the attempt ran on: as the service reports it, else the one chosen for it."""
    instance_choice: str | None = None
    """The instance type the capacity policy chose for the attempt (instance fallback); ``None``: the
    backend's choice."""
    exit_code: int | None = None
    output_uri: str | None = None
    interruption: str | None = None
    """Why the attempt ended without the job's own fault (``gpu_provider.names.INTERRUPTION_KINDS``)."""
    restarts: int = 0
    """Interruptions the service absorbed inside the attempt by restarting the job itself."""
    fault: str | None = None
    """For ``interruption="node_fault"``: what failed under the job (``gpu_provider.names.FAULT_KINDS``)."""
    node: str | None = None
    """The node the attempt ran on, where the service said (kept away from after a node fault)."""
    collected: bool = False
    """The task instance's run of the job ended with this attempt (a try returned its result, or failed
    on it with no Airflow retry to follow): a later try is a cleared task, and starts anew."""
    nodes: int = 1
    """Nodes (instances, processes) the attempt ran on."""
    price: dict[str, Any] | None = None
    """The price the attempt is charged at (:meth:`gpu_provider.spend.prices.Price.to_dict`)."""
    cost_usd: float | None = None
    """Estimated USD so far (:func:`gpu_provider.spend.prices.attempt_cost`); ``None``: no price known."""
    queue_wait_s: float | None = None
    """Seconds from submission to start (or to the end, for an attempt that never started)."""
    reported: bool = False
    """The attempt's cost line and metrics were emitted (once per attempt)."""
    spot_return: dict[str, Any] | None = None
    """For ``interruption="moved_to_spot"``: the reading that moved the attempt back to spot and the estimated
    saving (``score``, ``spot_usd_per_hour``, ``on_demand_usd_per_hour``, ``saving_pct``, ``remaining_s``,
    ``saving_usd``: price difference x nodes x remaining time, ``None`` when the remaining time is unknown)."""
    rung: int | None = None
    """Under a capacity :class:`~gpu_provider.capacity.ladder.Ladder`: the index of the rung the attempt ran on."""
    backend_spec: dict[str, Any] | None = None
    """The attempt's own backend, in the mapping form ``{"name": ..., **options}`` (a ladder's rung on another
    service or region); ``None``: the task's backend (every record written before ladders existed)."""
    service: str | None = None
    """The service the attempt ran on, in words ("AWS Batch", "Amazon SageMaker"); ``None``: not recorded."""
    stop: str | None = None
    """A stop this task planned for the running attempt (its restart limit, a move back to spot: the kind is in
    ``interruption``, set while the attempt runs): ``"planned"`` (:data:`~gpu_provider.names.STOP_PLANNED`) from
    before it is sent, ``"confirmed"`` (:data:`~gpu_provider.names.STOP_CONFIRMED`) once a read showed the
    service taking it. ``None``: no stop planned, or a record of 0.4.0, whose ``interruption`` alone said "stop
    sent": read as planned, not confirmed (:attr:`planned_stop`), so it is sent again and confirmed."""
    stop_reason: str | None = None
    """The reason the planned stop is sent with (sent again with the same words)."""

    @property
    def gpu_hours(self) -> float:
        return round(self.gpu_seconds / 3600.0, 6)

    @property
    def spot_saving_pct(self) -> float | None:
        """The share of the run time not billed (managed spot: ``1 - billable / training``), in percent;
        ``None`` unless the service reported both figures (and some run time)."""
        if self.billable_seconds is None or not self.training_seconds:
            return None
        return round(100.0 * (1.0 - self.billable_seconds / self.training_seconds), 1)

    # --- identity, from the handle ---
    @property
    def job_id(self) -> str:
        return self.handle.job_id

    @property
    def name(self) -> str:
        return self.handle.name

    @property
    def capacity(self) -> str:
        return self.handle.capacity

    @property
    def queue(self) -> str | None:
        queue = self.handle.extra.get("queue")
        return str(queue) if queue else None

    @classmethod
    def new(cls, handle: JobHandle, *, resume_from: str | None = None, try_number: int | None = None) -> AttemptRecord:
        return cls(
            attempt=handle.attempt, handle=handle, resume_from=resume_from, try_number=try_number, owner_try=try_number
        )

    @property
    def planned_stop(self) -> str | None:
        """The kind of the stop this task planned for the attempt while it runs (``preempted``: its restart limit;
        ``moved_to_spot``), confirmed or not; ``None`` when none is planned or the attempt has ended."""
        if self.state.terminal or self.interruption not in STOP_MARKS:
            return None
        return self.interruption

    @property
    def stop_confirmed(self) -> bool:
        """Whether the service was seen taking the planned stop (:attr:`planned_stop`)."""
        return self.planned_stop is not None and self.stop == STOP_CONFIRMED

    @property
    def lost(self) -> bool:
        """Ended as far as anyone can tell, but the service no longer knew how (``interruption="lost"``)."""
        return self.state.terminal and self.interruption == LOST

    def settled(self, status: JobStatus) -> bool:
        """Whether what this record knows of the attempt's end outranks ``status``: a terminal record is
        never overwritten by a later read (the job expired or was garbage-collected: the service can only
        say it is lost), except a lost one by a read that says how it really ended."""
        if not self.state.terminal:
            return False
        return not (self.lost and status.state.terminal and status.interruption != LOST)

    def update(self, status: JobStatus) -> None:
        """Take what a status sample says; never forget what an earlier sample knew (GPU time, output),
        and never let a later, weaker read replace a known end (:meth:`settled`)."""
        planned = self.planned_stop
        if planned is not None and status.state.active and stop_taken(status, planned):
            self.stop = STOP_CONFIRMED  # the service is carrying the planned stop out
        if not self.settled(status):
            was_lost = self.lost
            self.state = status.state
            self.reason = status.reason
            kind = status.interruption or (PREEMPTED if status.state is JobState.PREEMPTED else None)
            if planned is not None and status.state.terminal:
                kind = self._end_of_planned_stop(planned, status, kind)
                self.interruption = kind
            elif kind or was_lost:
                self.interruption = kind
            if status.exit_code is not None:
                self.exit_code = status.exit_code
            if status.fault is not None:
                self.fault = status.fault
            self.ended_at = _iso(status.ended_at) or self.ended_at
        self.node = status.node or self.node
        self.started_at = _iso(status.started_at) or self.started_at
        self.gpu_seconds = round(max(self.gpu_seconds, status.gpu_seconds), 3)
        if status.billable_seconds is not None:
            self.billable_seconds = status.billable_seconds
        if status.training_seconds is not None:
            self.training_seconds = status.training_seconds
        self.instance_type = status.instance_type or self.instance_type
        self.output_uri = status.output_uri or self.output_uri
        self.restarts = max(self.restarts, status.restarts)
        if status.owner_try is not None:
            self.owner_try = status.owner_try
        self.collected = self.collected or status.collected

    def _end_of_planned_stop(self, planned: str, status: JobStatus, kind: str | None) -> str | None:
        """How an attempt with a planned stop ended: by that stop (``planned``) when the stop was confirmed or the
        end carries its reason; otherwise the job's own end (``kind``: its own interruption, or none), whatever
        was planned. A job that succeeded before the stop took hold succeeded."""
        if status.state is JobState.SUCCEEDED:
            return None
        if self.stop == STOP_CONFIRMED or stop_taken(status, planned):
            self.stop = STOP_CONFIRMED
            return planned
        return kind

    # --- wire form ---
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = SCHEMA_VERSION
        data["state"] = self.state.value
        data["handle"] = self.handle.to_dict()
        # derived, for readers of XCom and the UI (ignored when loading)
        data.update(
            job_id=self.job_id,
            name=self.name,
            capacity=self.capacity,
            queue=self.queue,
            backend=self.handle.backend,
            region=(self.backend_spec or {}).get("region_name"),
            gpu_hours=self.gpu_hours,
            spot_saving_pct=self.spot_saving_pct,
        )
        return data

    def public(self) -> dict[str, Any]:
        """The XCom form: everything but the backend's lookup data."""
        data = self.to_dict()
        del data["handle"]
        del data["backend_spec"]  # the attempt's backend options: its name, service and region say where it ran
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptRecord:
        """Load a record written by this or a nearby version (schema 1 records of 0.2 load too)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["handle"] = JobHandle.from_dict(data["handle"])
        kwargs["attempt"] = int(data.get("attempt") or kwargs["handle"].attempt)
        kwargs["state"] = JobState(str(data.get("state") or JobState.QUEUED.value))
        if kwargs.get("owner_try") is None and data.get("try_number") is not None:
            kwargs["owner_try"] = int(data["try_number"])
        kwargs["collected"] = bool(kwargs.get("collected"))
        kwargs["gpu_seconds"] = float(kwargs.get("gpu_seconds") or 0.0)
        kwargs["restarts"] = int(kwargs.get("restarts") or 0)
        kwargs["backend_spec"] = (
            dict(kwargs["backend_spec"]) if isinstance(kwargs.get("backend_spec"), Mapping) else None
        )
        return cls(**kwargs)


def stop_taken(status: JobStatus, planned: str) -> bool:
    """Whether ``status`` shows the service taking the stop of kind ``planned`` (``names.STOP_MARKS``): the job
    stopping with the stop's reason (``JobStatus.stopping``), or ended with it."""
    words = status.stopping if status.state.active else status.reason
    words = (words or "").removeprefix(CANCEL_PREFIX)
    return words.startswith(STOP_MARKS[planned])


#: how many attempt records a task instance keeps by default (``[gpu_provider] max_attempt_records``)
DEFAULT_MAX_ATTEMPT_RECORDS = 50


@dataclass
class AttemptSummary:
    """The attempts folded out of a task instance's record list once it grew past its cap: counted, not dropped.

    Only history is folded (attempts of runs a try already collected); the current run's attempts, which
    the interruption budget counts, stay records.
    """

    attempts: int = 0
    first_attempt: int | None = None
    last_attempt: int | None = None
    states: dict[str, int] | None = None
    """How many folded attempts ended in each state (``SUCCEEDED``: 3, ...)."""
    interruptions: int = 0
    gpu_seconds: float = 0.0
    billable_seconds: float | None = None
    cost_usd: float | None = None

    def add(self, record: AttemptRecord) -> None:
        self.attempts += 1
        self.first_attempt = min(self.first_attempt or record.attempt, record.attempt)
        self.last_attempt = max(self.last_attempt or record.attempt, record.attempt)
        states = dict(self.states or {})
        states[record.state.value] = states.get(record.state.value, 0) + 1
        self.states = states
        self.interruptions += record.restarts + (1 if record.interruption else 0)
        self.gpu_seconds = round(self.gpu_seconds + record.gpu_seconds, 3)
        if record.billable_seconds is not None:
            self.billable_seconds = round((self.billable_seconds or 0.0) + record.billable_seconds, 3)
        if record.cost_usd is not None:
            self.cost_usd = round((self.cost_usd or 0.0) + record.cost_usd, 6)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": {**asdict(self), "gpu_hours": round(self.gpu_seconds / 3600.0, 6)}, "schema": SCHEMA_VERSION}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptSummary:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def compact(records: list[AttemptRecord], summary: AttemptSummary | None, cap: int) -> AttemptSummary | None:
    """Fold the oldest records into ``summary`` (a new one if ``None``) until at most ``cap`` are left,
    whole runs at a time and only runs that ended before the latest collected one (the current run, which
    the interruption budget counts, and the run a try may be returning stay records); ``records`` is
    changed in place. Returns the summary."""
    need = len(records) - cap
    ends = [i + 1 for i, r in enumerate(records) if r.collected and r.state.terminal][:-1]
    if need <= 0 or not ends:
        return summary
    fold = next((end for end in ends if end >= need), ends[-1])
    summary = summary or AttemptSummary()
    for record in records[:fold]:
        summary.add(record)
    del records[:fold]
    return summary


def load_summary(data: Any) -> AttemptSummary | None:
    """The summary entry of a stored record list (:func:`dump_records`), ``None`` when there is none."""
    if not isinstance(data, list):
        return None
    for item in data:
        if isinstance(item, Mapping) and isinstance(item.get("summary"), Mapping):
            try:
                return AttemptSummary.from_dict(item["summary"])
            except (TypeError, ValueError):
                return None
    return None


def load_records(data: Any) -> list[AttemptRecord]:
    """Records from the task state store or ``defer(kwargs=...)``; entries that are not records are skipped."""
    if not isinstance(data, list):
        return []
    out = []
    for item in data:
        if isinstance(item, Mapping) and isinstance(item.get("handle"), Mapping):
            try:
                out.append(AttemptRecord.from_dict(item))
            except (KeyError, TypeError, ValueError):
                continue  # a damaged entry must not stop a retry; the backend lookup finds the job anyway
    return sorted(out, key=lambda r: (r.attempt, r.handle.submitted_at))


def dump_records(records: Iterable[AttemptRecord], summary: AttemptSummary | None = None) -> list[dict[str, Any]]:
    """The wire form: the summary of folded attempts first (when there is one), then the records."""
    head = [summary.to_dict()] if summary is not None and summary.attempts else []
    return head + [r.to_dict() for r in records]
