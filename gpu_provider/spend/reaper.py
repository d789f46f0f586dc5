"""The reaper: stop GPU jobs this provider started that no live Airflow task is behind.

For every configured backend it lists the active jobs the provider tagged
(:meth:`~gpu_provider.backends.base.Backend.list_owned`), asks Airflow's REST API about the task
instance each job names, and stops:

- a job whose task instance is not live: its state is not one of :data:`LIVE_STATES` (failed,
  success, skipped, removed...), or it has no state and its DAG run is not running or queued;
- a job whose task instance does not exist (its DAG run or DAG was deleted);
- a job running longer than its max runtime plus the grace period (the service should have
  stopped it);

and leaves alone a job submitted less than ``grace_period_s`` ago (the task's state may not be
visible yet), a job whose task instance is live, and a job whose owner cannot be asked (the API
unreachable: never stop on a guess). Dry-run reports the same set and stops nothing.

It knows no Airflow internals and touches no metadata database: :class:`AirflowApi` talks to
the REST API over HTTP with the standard library.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_provider.backends.base import Backend, OwnedJob, TaskKey
from gpu_provider.job import GpuResources
from gpu_provider.spend.prices import PriceBook, PriceNotFoundError

log = logging.getLogger(__name__)

#: task instance states with a live try that may still be waiting for the job (or will reattach to it)
LIVE_STATES = frozenset(
    {"queued", "scheduled", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)
#: DAG run states under which a task instance with no state yet will still run (and may reattach)
LIVE_RUN_STATES = frozenset({"queued", "running"})
#: seconds after submission during which a job is never stopped (default of ``grace_period``)
DEFAULT_GRACE_PERIOD_S = 600.0

STOP = "stop"
KEEP = "keep"


class AirflowApiError(Exception):
    """Airflow's REST API could not answer (unreachable, refused, an unexpected status)."""


class AirflowApi:
    """A minimal client of Airflow 3's REST API (``/api/v2``).

    :param base_url: the API server, e.g. ``http://airflow-api:8080``
    :param username: with ``password``, exchanged for a JWT at ``/auth/token`` (simple auth manager
        and FAB both serve it); neither: requests go without a token
    :param token: a ready JWT (``Authorization: Bearer``), instead of a user and password
    """

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._username = username
        self._password = password
        self._token = token
        self.timeout = timeout

    @classmethod
    def from_connection(cls, conn_id: str) -> AirflowApi:
        """From an Airflow connection: host (with scheme, or ``schema`` as the scheme), port, login,
        password, or ``extra={"token": "..."}``."""
        from gpu_provider.connections import get_connection

        conn = get_connection(conn_id)
        host = str(conn.host or "").strip()
        if not host:
            raise ValueError(f"Airflow connection {conn_id!r} has no host: set it to the Airflow API server's URL")
        if "://" not in host:
            host = f"{conn.schema or 'http'}://{host}"
        if conn.port:
            host = f"{host}:{conn.port}"
        extra = conn.extra_dejson or {}
        return cls(host, username=conn.login or None, password=conn.password or None, token=extra.get("token"))

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token is None and self._username and self._password:
            answer = self._request("POST", "/auth/token", {"username": self._username, "password": self._password})
            self._token = str(answer["access_token"])
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers=headers or {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read() or b"null")

    def get(self, path: str) -> Any | None:
        """GET ``/api/v2<path>``; ``None`` for 404 (no such object)."""
        try:
            return self._request("GET", "/api/v2" + path, headers=self._headers())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            detail = err.read(2000).decode(errors="replace").strip()
            raise AirflowApiError(f"Airflow API GET {path} answered HTTP {err.code} {err.reason}: {detail}") from err
        except (OSError, ValueError) as err:
            raise AirflowApiError(f"Airflow API GET {path} failed: {err}") from err

    def send(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """``method`` ``/api/v2<path>`` with a JSON body; any HTTP error is an :class:`AirflowApiError`."""
        try:
            return self._request(method, "/api/v2" + path, body, headers=self._headers())
        except urllib.error.HTTPError as err:
            detail = err.read(2000).decode(errors="replace").strip()
            raise AirflowApiError(
                f"Airflow API {method} {path} answered HTTP {err.code} {err.reason}: {detail}"
            ) from err
        except (OSError, ValueError) as err:
            raise AirflowApiError(f"Airflow API {method} {path} failed: {err}") from err

    def task_instance(self, task: TaskKey) -> dict[str, Any] | None:
        q = urllib.parse.quote
        run = f"/dags/{q(task.dag_id, safe='')}/dagRuns/{q(task.run_id, safe='')}"
        path = f"{run}/taskInstances/{q(task.task_id, safe='')}"
        if task.map_index >= 0:
            path += f"/{task.map_index}"
        found = self.get(path)
        return dict(found) if isinstance(found, dict) else None

    def dag_run_state(self, task: TaskKey) -> str | None:
        q = urllib.parse.quote
        found = self.get(f"/dags/{q(task.dag_id, safe='')}/dagRuns/{q(task.run_id, safe='')}")
        return str(found.get("state")) if isinstance(found, dict) else None


@dataclass
class Verdict:
    """What the reaper decided about one job, and why."""

    job: OwnedJob
    action: str
    why: str
    usd_per_hour: float | None = None
    stopped: bool = False
    error: str | None = None

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
        }


@dataclass
class ReapReport:
    """The reaper's report (the operator logs it and returns :meth:`to_dict` to XCom)."""

    dry_run: bool
    verdicts: list[Verdict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

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
        }


def decide(job: OwnedJob, api: AirflowApi, *, now: float, grace_period_s: float) -> tuple[str, str]:
    """``(STOP | KEEP, why)`` for one job (may raise :class:`AirflowApiError`: then the job is kept)."""
    age = now - job.handle.submitted_at
    if age < grace_period_s:
        return KEEP, f"submitted {age:.0f}s ago, within the grace period of {grace_period_s:.0f}s"
    if job.max_runtime_s and job.started_at and now - job.started_at > job.max_runtime_s + grace_period_s:
        return STOP, (
            f"running {now - job.started_at:.0f}s, past its max runtime of {job.max_runtime_s:.0f}s "
            f"(+{grace_period_s:.0f}s grace)"
        )
    task = job.task
    if task is None:
        return KEEP, "its tags name no task instance; cannot tell whether a task waits for it"
    ti = api.task_instance(task)
    if ti is None:
        return STOP, f"task instance {_label(task)} does not exist (its DAG run or DAG was deleted)"
    state = ti.get("state")
    if state in LIVE_STATES:
        return KEEP, f"task instance {_label(task)} is {state} (try {ti.get('try_number')})"
    if state is None:
        run_state = api.dag_run_state(task)
        if run_state in LIVE_RUN_STATES:
            return KEEP, f"task instance {_label(task)} has no state yet and its DAG run is {run_state}"
        return STOP, f"task instance {_label(task)} has no state and its DAG run is {run_state or 'gone'}"
    return STOP, f"task instance {_label(task)} is {state} (try {ti.get('try_number')}): no live try waits for the job"


def _label(task: TaskKey) -> str:
    mi = f"[{task.map_index}]" if task.map_index >= 0 else ""
    return f"{task.dag_id}.{task.task_id}{mi} of run {task.run_id}"


def job_usd_per_hour(backend: Backend, job: OwnedJob, book: PriceBook) -> float | None:
    """What the job bills per hour (its GPUs at its capacity's price), ``None`` when no price is known."""
    gpus = job.gpus if job.gpus > 0 else 1.0
    try:
        resources = GpuResources(gpus=gpus if gpus < 1 else round(gpus), nodes=max(1, job.nodes))
        price = book.job_price(
            resources, job.handle.capacity, job.region, backend.price_catalog, instance_type=job.instance_type
        )
    except (PriceNotFoundError, ValueError):
        return None
    return price.usd_per_gpu_hour * gpus * max(1, job.nodes)


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
    for backend in backends:
        try:
            owned = backend.list_owned()
        except Exception as err:
            report.errors.append(f"{backend.name}: could not list its jobs: {err}")
            continue
        now = clock()
        for job in owned:
            try:
                action, why = decide(job, api, now=now, grace_period_s=grace_period_s)
            except AirflowApiError as err:
                action, why = KEEP, f"could not ask Airflow about its task ({err}); kept"
                report.errors.append(f"{backend.name} job {job.handle.job_id}: {err}")
            verdict = Verdict(job, action, why, job_usd_per_hour(backend, job, book))
            if action == STOP and not dry_run:
                try:
                    backend.cancel(job.handle, f"{reason} ({why})")
                    verdict.stopped = True
                except Exception as err:
                    verdict.error = str(err)
                    report.errors.append(f"{backend.name} job {job.handle.job_id}: could not stop it: {err}")
            report.verdicts.append(verdict)
    return report
