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

It knows no Airflow internals and touches no metadata database: :class:`AirflowApi` talks to
the REST API over HTTP with the standard library.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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


class AirflowApiError(Exception):
    """Airflow's REST API could not answer (unreachable, refused, an unexpected status, an answer
    that is not Airflow's)."""


#: what ``GET /api/v2/version`` must answer: Airflow 3's version endpoint
_AIRFLOW_3_VERSION = re.compile(r"3\.\d+(\.\d+)?([.+\-a-z0-9]*)?", re.IGNORECASE)


def _is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() in ("application/json", "application/problem+json")


def _snippet(body: bytes) -> str:
    text = body[:300].decode(errors="replace").strip().replace("\n", " ")
    return text if len(body) <= 300 else text + "..."


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
        #: the URL as messages show it (without any user:password@ written into it)
        self.shown_url = re.sub(r"//[^/@]*@", "//", self.base_url)
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
            # any failure here (a 404 included) is an error: no answer of /auth/token says an object is gone
            try:
                answer = self._request("POST", "/auth/token", {"username": self._username, "password": self._password})
                self._token = str(answer["access_token"])
            except urllib.error.HTTPError as err:
                raise AirflowApiError(
                    f"Airflow API at {self.shown_url}: POST /auth/token answered HTTP {err.code} {err.reason} "
                    f"({err.headers.get('Content-Type') or 'no content type'}); no token, so no task instance "
                    "could be asked about"
                ) from err
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise AirflowApiError(
                    f"Airflow API at {self.shown_url}: POST /auth/token gave no token: {type(err).__name__}: {err}"
                ) from err
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def check_identity(self) -> str:
        """Make sure ``base_url`` is Airflow 3's API and a token can be had; return Airflow's version.

        ``GET /api/v2/version`` must answer 200 with a JSON object whose ``version`` is 3.x (a wrong
        base URL, a proxy's page, a missing path prefix or an Airflow 2 server do not); then the token
        is fetched (user and password), so a failing ``/auth/token`` is found here, once per pass.

        :raises AirflowApiError: naming what was answered instead
        """
        url = self.base_url + "/api/v2/version"
        headers = {"Accept": "application/json"}
        if self._token:  # a ready token goes along (a proxy may want one even where Airflow does not)
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, method="GET", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body, content_type = response.read(65536), response.headers.get("Content-Type")
        except urllib.error.HTTPError as err:
            body = err.read(2000)
            raise AirflowApiError(
                f"Airflow API at {self.shown_url} is not Airflow 3's: GET /api/v2/version answered HTTP {err.code} "
                f"{err.reason} ({err.headers.get('Content-Type') or 'no content type'}: {_snippet(body)!r}). "
                "Check the connection's host, port and path prefix (an Airflow 2 server has no /api/v2)"
            ) from err
        except (OSError, ValueError) as err:
            raise AirflowApiError(f"Airflow API at {self.shown_url} could not be reached: {err}") from err
        try:
            answer = json.loads(body) if _is_json(content_type) else None
        except ValueError:
            answer = None
        version = answer.get("version") if isinstance(answer, dict) else None
        if not isinstance(version, str) or not _AIRFLOW_3_VERSION.fullmatch(version):
            raise AirflowApiError(
                f"Airflow API at {self.shown_url} is not Airflow 3's: GET /api/v2/version answered "
                f"{content_type or 'no content type'} {_snippet(body)!r}, not a JSON object with a 3.x 'version'. "
                "Check the connection's host, port and path prefix"
            )
        self._headers()
        return version

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

    def get(self, path: str, *, object_id: str | None = None) -> Any | None:
        """GET ``/api/v2<path>``; ``None`` only for Airflow's own "not found".

        A 404 means "no such object" only when its body is Airflow's: JSON with a ``detail`` that
        says "not found" and names ``object_id`` (the DAG id; Airflow's answer for an unknown route,
        ``{"detail": "Not Found"}``, names nothing). Any other 404 (an HTML page from a proxy, a
        wrong path prefix) is an :class:`AirflowApiError`.
        """
        try:
            return self._request("GET", "/api/v2" + path, headers=self._headers())
        except urllib.error.HTTPError as err:
            body = err.read(2000)
            content_type = err.headers.get("Content-Type")
            if err.code == 404 and _airflow_not_found(body, content_type, object_id):
                return None
            unsure = "; not Airflow's own 'not found' for this object, so nothing is taken as deleted"
            raise AirflowApiError(
                f"Airflow API GET {path} answered HTTP {err.code} {err.reason} "
                f"({content_type or 'no content type'}): {_snippet(body)}" + (unsure if err.code == 404 else "")
            ) from err
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
        found = self.get(path, object_id=task.dag_id)
        if found is not None and not isinstance(found, dict):
            raise AirflowApiError(f"Airflow API GET {path} answered {found!r}, not a task instance")
        return found

    def dag_run(self, task: TaskKey) -> dict[str, Any] | None:
        """The task's DAG run; ``None`` only when Airflow says it does not exist."""
        q = urllib.parse.quote
        path = f"/dags/{q(task.dag_id, safe='')}/dagRuns/{q(task.run_id, safe='')}"
        found = self.get(path, object_id=task.dag_id)
        if found is not None and not isinstance(found, dict):
            raise AirflowApiError(f"Airflow API GET {path} answered {found!r}, not a DAG run")
        return found

    def dag_exists(self, dag_id: str) -> bool:
        """Whether Airflow knows the DAG (``False`` only on Airflow's own "not found")."""
        return self.get(f"/dags/{urllib.parse.quote(dag_id, safe='')}", object_id=dag_id) is not None

    def dag_run_state(self, task: TaskKey) -> str | None:
        found = self.dag_run(task)
        return str(found.get("state")) if found is not None else None


def _airflow_not_found(body: bytes, content_type: str | None, object_id: str | None) -> bool:
    """Whether a 404's body is Airflow 3's answer for a missing object (see :meth:`AirflowApi.get`)."""
    if not _is_json(content_type) or not object_id:
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    detail = answer.get("detail") if isinstance(answer, dict) else None
    return isinstance(detail, str) and "not found" in detail.lower() and object_id in detail


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
