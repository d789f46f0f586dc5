"""The reaper: stop GPU jobs this provider started that no live Airflow task is behind.

For every configured backend it lists the active jobs the provider tagged
(:meth:`~gpu_provider.backends.base.Backend.list_owned`), asks Airflow's REST API about the task
instance each job names, and stops:

- a job whose task instance is not live: its state is not one of :data:`LIVE_STATES` (failed,
  success, skipped, removed...), or it has no state and its DAG run is not running or queued;
- a job whose task instance does not exist because its DAG run (or DAG) was deleted: Airflow
  answered 404 with its own JSON body naming the object for the task instance, and again for its
  DAG run (a second read, so a 404 from anything else is never taken for a deletion);
- a job whose tags name no task instance, once it is past its service's own limit plus the grace
  period (:func:`past_service_limit`: SageMaker counts training time against
  ``MaxRuntimeInSeconds`` and wall time against ``MaxWaitTimeInSeconds``; the others count run time
  from the start against their timeout);

and leaves alone a job submitted less than ``grace_period_s`` ago (the task's state may not be
visible yet), a job whose task instance is live (whatever its run time: the task's own wait
enforces ``max_runtime``), and a job whose owner cannot be asked (the API unreachable, an answer
that is not Airflow's: never stop on a guess). Every pass first checks that the API is Airflow 3's
(``GET /api/v2/version``, JSON, version 3.x) and gets its token; when that fails the pass stops
nothing and reports why. Dry-run reports the same set and stops nothing.

It knows no Airflow internals and touches no metadata database: :class:`~gpu_provider.airflow_api.AirflowApi`
(defined in :mod:`gpu_provider.airflow_api`, importable from here too) talks to the REST API over HTTP with
the standard library.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_provider.airflow_api import AirflowApi, AirflowApiError
from gpu_provider.backends.base import Backend, OwnedJob, TaskKey
from gpu_provider.job import GpuResources
from gpu_provider.records import AttemptRecord
from gpu_provider.spend.prices import Price, PriceBook, PriceNotFoundError

log = logging.getLogger(__name__)

#: task instance states with a live try that may still be waiting for the job (or will reattach to it)
LIVE_STATES = frozenset(
    {"queued", "scheduled", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)
#: DAG run states under which a task instance with no state yet will still run (and may reattach)
LIVE_RUN_STATES = frozenset({"queued", "running"})
#: seconds after submission during which a job is never stopped (default of ``grace_period``)
DEFAULT_GRACE_PERIOD_S = 600.0

#: the longest the reaper reads a stopped job's status for its figures
REPORT_READ_S = 30.0

STOP = "stop"
KEEP = "keep"


@dataclass
class Verdict:
    """What the reaper decided about one job, and why."""

    job: OwnedJob
    action: str
    why: str
    usd_per_hour: float | None = None
    stopped: bool = False
    error: str | None = None
    ended: AttemptRecord | None = None
    """The end reported for a job it stopped (GPU time and cost from the service's own times)."""

    def to_dict(self) -> dict[str, Any]:
        task = self.job.task
        return {
            "backend": self.job.handle.backend,
            "job_id": self.job.handle.job_id,
            "job_name": self.job.handle.name,
            "state": self.job.state.value,
            "task": None
            if task is None
            else {"dag_id": task.dag_id, "task_id": task.task_id, "run_id": task.run_id, "map_index": task.map_index},
            "try_number": self.job.try_number,
            "team": self.job.team,
            "action": self.action,
            "why": self.why,
            "usd_per_hour": None if self.usd_per_hour is None else round(self.usd_per_hour, 4),
            "stopped": self.stopped,
            "error": self.error,
            "gpu_hours": None if self.ended is None else self.ended.gpu_hours,
            "cost_usd": None if self.ended is None else self.ended.cost_usd,
        }


@dataclass
class ReapReport:
    """The reaper's report (the operator logs it and returns :meth:`to_dict` to XCom)."""

    dry_run: bool
    verdicts: list[Verdict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    airflow_version: str | None = None
    """Airflow's version, as its API answered this pass's identity check."""
    api_error: str | None = None
    """Why this pass could not trust Airflow's API (then nothing was stopped); ``None`` when it could."""

    @property
    def to_stop(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.action == STOP]

    @property
    def kept(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.action == KEEP]

    def usd_per_hour(self) -> float:
        return round(sum(v.usd_per_hour or 0.0 for v in self.to_stop), 4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "to_stop": [v.to_dict() for v in self.to_stop],
            "kept": [v.to_dict() for v in self.kept],
            "stopped": sum(1 for v in self.to_stop if v.stopped),
            "usd_per_hour": self.usd_per_hour(),
            "errors": list(self.errors),
            "airflow_version": self.airflow_version,
        }


def past_service_limit(job: OwnedJob, now: float, grace_period_s: float) -> str | None:
    """Why ``job`` is past its service's own limit plus the grace period, or ``None`` when it is not.

    Each limit is judged on the clock its service uses: ``max_wait_s`` (SageMaker managed spot's
    ``MaxWaitTimeInSeconds``) on the wall time since submission, waiting for capacity included;
    ``max_runtime_s`` on the run time the service counts (``training_seconds`` where it reports one,
    e.g. SageMaker's training time, which excludes waiting and restarts), else the time since
    ``started_at``. A job that never started has used none of its max runtime.
    """
    if job.max_wait_s:
        waited = now - job.handle.submitted_at
        if waited > job.max_wait_s + grace_period_s:
            return (
                f"{waited:.0f}s since its submission, past its max wait of {job.max_wait_s:.0f}s "
                f"(+{grace_period_s:.0f}s grace)"
            )
    if job.max_runtime_s:
        if job.training_seconds is not None:
            ran, clock = job.training_seconds, "training time as the service counts it"
        elif job.started_at is not None:
            ran, clock = now - job.started_at, "run time since it started"
        else:
            return None
        if ran > job.max_runtime_s + grace_period_s:
            return (
                f"{ran:.0f}s of {clock}, past its max runtime of {job.max_runtime_s:.0f}s "
                f"(+{grace_period_s:.0f}s grace)"
            )
    return None


def decide(job: OwnedJob, api: AirflowApi, *, now: float, grace_period_s: float) -> tuple[str, str]:
    """``(STOP | KEEP, why)`` for one job (may raise :class:`AirflowApiError`: then the job is kept).

    A job whose task instance is live is kept whatever its run time (the task's own wait enforces
    ``max_runtime``; a managed-spot job may wait for capacity long past its max runtime). The
    service's own limits (:func:`past_service_limit`) decide only for a job no task can be asked about.
    """
    age = now - job.handle.submitted_at
    if age < grace_period_s:
        return KEEP, f"submitted {age:.0f}s ago, within the grace period of {grace_period_s:.0f}s"
    task = job.task
    if task is None:
        over = past_service_limit(job, now, grace_period_s)
        if over is not None:
            return STOP, f"its tags name no task instance and it is {over}: no task waits for it"
        return KEEP, "its tags name no task instance; cannot tell whether a task waits for it (within its limits)"
    ti = api.task_instance(task)
    if ti is None:
        # Airflow said the task instance does not exist: confirm with a second read that its DAG run is gone
        run = api.dag_run(task)
        if run is not None:
            raise AirflowApiError(
                f"task instance {_label(task)} was not found, yet its DAG run is there ({run.get('state')}): "
                "the job is kept; check the job's tags and the API's path prefix"
            )
        try:
            what = "DAG run" if api.dag_exists(task.dag_id) else "DAG"
        except AirflowApiError:
            what = "DAG run or DAG"
        return STOP, (
            f"task instance {_label(task)} does not exist (its {what} was deleted: Airflow answered not found "
            "for the task instance and again for its DAG run)"
        )
    state = ti.get("state")
    if state in LIVE_STATES:
        return KEEP, f"task instance {_label(task)} is {state} (try {ti.get('try_number')})"
    if state is None:
        run = api.dag_run(task)
        run_state = None if run is None else run.get("state")
        if run_state in LIVE_RUN_STATES:
            return KEEP, f"task instance {_label(task)} has no state yet and its DAG run is {run_state}"
        return STOP, f"task instance {_label(task)} has no state and its DAG run is {run_state or 'gone'}"
    return STOP, f"task instance {_label(task)} is {state} (try {ti.get('try_number')}): no live try waits for the job"


def _label(task: TaskKey) -> str:
    mi = f"[{task.map_index}]" if task.map_index >= 0 else ""
    return f"{task.dag_id}.{task.task_id}{mi} of run {task.run_id}"


def job_price(backend: Backend, job: OwnedJob, book: PriceBook) -> Price | None:
    """The price the job is charged at (its GPUs at its capacity's price), ``None`` when none is known."""
    gpus = job.gpus if job.gpus > 0 else 1.0
    try:
        resources = GpuResources(gpus=gpus if gpus < 1 else round(gpus), nodes=max(1, job.nodes))
        return book.job_price(
            resources, job.handle.capacity, job.region, backend.price_catalog, instance_type=job.instance_type
        )
    except (PriceNotFoundError, ValueError):
        return None


def job_usd_per_hour(backend: Backend, job: OwnedJob, book: PriceBook) -> float | None:
    """What the job bills per hour (its GPUs at its capacity's price), ``None`` when no price is known."""
    price = job_price(backend, job, book)
    if price is None:
        return None
    gpus = job.gpus if job.gpus > 0 else 1.0
    return price.usd_per_gpu_hour * gpus * max(1, job.nodes)


def report_reaped(backend: Backend, job: OwnedJob, reason: str, book: PriceBook) -> AttemptRecord:
    """The end of a job the reaper stopped, reported once (metrics, the team's month): its status read
    after the stop (bounded), with the service's start and GPU time, priced like every other attempt.
    The reaper cannot write the owning task's records; the GPU page reads the same end from the service."""
    from gpu_provider.engine.runner import poll_one
    from gpu_provider.spend.ended import report_stopped

    status = poll_one(backend, job.handle, timeout=REPORT_READ_S)
    return report_stopped(
        job.handle,
        status,
        reason,
        team=job.team,
        backend=backend.name,
        price=job_price(backend, job, book),
        nodes=job.nodes,
        log=log,
    )


def reap(
    backends: Sequence[Backend],
    api: AirflowApi,
    *,
    dry_run: bool = True,
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
    book: PriceBook | None = None,
    reason: str = "the GPU reaper: no live Airflow task is behind this job",
    clock: Callable[[], float] = time.time,
) -> ReapReport:
    """List, decide and (unless ``dry_run``) stop, on every backend; a failure on one backend or one
    job is reported and the others go on."""
    book = book or PriceBook.from_config()
    report = ReapReport(dry_run=dry_run)
    try:
        report.airflow_version = api.check_identity()
    except AirflowApiError as err:
        report.api_error = str(err)
        report.errors.append(f"Nothing stopped this pass: {err}")
    for backend in backends:
        try:
            owned = backend.list_owned()
        except Exception as err:
            report.errors.append(f"{backend.name}: could not list its jobs: {err}")
            continue
        now = clock()
        for job in owned:
            try:
                if report.api_error is not None:
                    raise AirflowApiError("the API's identity could not be confirmed this pass")
                action, why = decide(job, api, now=now, grace_period_s=grace_period_s)
            except AirflowApiError as err:
                action, why = KEEP, f"could not ask Airflow about its task ({err}); kept"
                if report.api_error is None:
                    report.errors.append(f"{backend.name} job {job.handle.job_id}: {err}")
            verdict = Verdict(job, action, why, job_usd_per_hour(backend, job, book))
            if action == STOP and not dry_run:
                try:
                    backend.cancel(job.handle, f"{reason} ({why})")
                    verdict.stopped = True
                except Exception as err:
                    verdict.error = str(err)
                    report.errors.append(f"{backend.name} job {job.handle.job_id}: could not stop it: {err}")
                if verdict.stopped:
                    verdict.ended = report_reaped(backend, job, f"{reason} ({why})", book)
            report.verdicts.append(verdict)
    return report
