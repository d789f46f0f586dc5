"""The GPU page's FastAPI app, mounted by Airflow's API server at ``/gpu`` (see :mod:`.plugin`).

Every route but the navigation icon goes through Airflow's own auth dependencies, the ones its public
API uses (``airflow.api_fastapi.core_api.security``): the caller must be signed in (JWT in the
``Authorization`` header or the UI's ``_token`` cookie) and allowed to read task instances; the team
table also needs pool read access. Everything is filtered to the DAGs the user may read
(``get_authorized_dag_ids``): the rows, the charts, and the live figures every answer carries
(``live_jobs``; ``live_errors`` name the backend only, since a service's error may name other teams'
roles). A user who may read every DAG also sees the live jobs of DAGs Airflow does not know
(``untracked``) and the backends' own errors.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Literal

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag, requires_access_pool
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Response

from gpu_provider import __version__
from gpu_provider.plugins.ui import data, queries

#: files of the page (package data under ``static/``) and their media types
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "gpu.js": "text/javascript; charset=utf-8",
    "gpu.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
#: the most ended attempts one page of ``/api/attempts`` returns
MAX_PAGE = 200

read_tis = Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))
read_pools = Depends(requires_access_pool("GET"))
Window = Literal["day", "week", "month"]


def _static(name: str) -> Response:
    body = resources.files("gpu_provider.plugins.ui").joinpath("static").joinpath(name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


def _json_headers(response: Response) -> None:
    response.headers["Cache-Control"] = "no-store"


@dataclass(frozen=True)
class _View:
    """One request's read, cut to what its user may see."""

    attempts: list[data.Attempt]
    snap: queries.Snapshot
    live: dict[str, Any]
    """The live jobs of the DAGs the user may read (all of them for a user who may read every DAG)."""
    every_dag: bool

    def meta(self) -> dict[str, Any]:
        """What every answer carries; every number counts the user's DAGs only."""
        snap = self.snap
        return {
            "generated_at": data._iso(snap.read_at),
            "read_s": round(snap.read_s, 3),
            "truncated": snap.truncated,
            "max_task_rows": queries.MAX_TASK_ROWS,
            "live_backends": snap.live.backends,
            "live_jobs": len(self.live),
            "live_errors": queries.visible_errors(snap.live, self.every_dag),
            "unswept": data.unswept(self.attempts, queries.unswept_place()),
            "all_dags": self.every_dag,
            "version": __version__,
        }


def _view(user: Any) -> _View:
    snap = queries.snapshot()
    auth = get_auth_manager()
    allowed = auth.get_authorized_dag_ids(user=user, method="GET")
    # allowed every DAG Airflow knows: may also see what belongs to none (untracked jobs, services' errors)
    every_dag = set(allowed) >= snap.dag_ids
    rows = queries.permitted(snap.rows, allowed)
    live = queries.visible_live(snap.live.jobs, allowed, every_dag)
    # by job id: only theirs
    attempts = data.attempts_of(rows, snap.live.jobs, time.time(), snap.live.usd_per_hour, snap.ended)
    return _View(attempts, snap, live, every_dag)


def create_app() -> FastAPI:
    app = FastAPI(
        title="GPU jobs",
        description="The GPU page of airflow-provider-gpu and the JSON endpoints behind it.",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    page = APIRouter(dependencies=[read_tis])
    api = APIRouter(prefix="/api", dependencies=[read_tis])

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        """The navigation icon (public, like Airflow's own icons: it shows no data)."""
        return _static("icon.svg")

    @page.get("/", include_in_schema=False)
    def index() -> Response:
        return _static("index.html")

    @page.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC or name == "index.html":
            raise HTTPException(404, "Not Found")
        return _static(name)

    @api.get("/summary", dependencies=[read_pools])
    def summary(user: GetUserDep, response: Response) -> dict[str, Any]:
        """Per team: pool slots in use / total, waiting tasks and jobs, GPU-hours, cost, interruption rates."""
        _json_headers(response)
        view = _view(user)
        return {**view.meta(), "teams": data.team_figures(view.attempts, view.snap.pools, time.time())}

    @api.get("/running")
    def running(user: GetUserDep, response: Response) -> dict[str, Any]:
        """The attempts running or waiting for capacity now, with live state from the backends."""
        _json_headers(response)
        view = _view(user)
        now = time.time()
        rows = data.running(view.attempts, now)
        _add_links(rows)
        # the records of every permitted DAG count as known (not only the window's running ones); a user
        # who may read every DAG also sees the jobs of DAGs Airflow does not know
        return {**view.meta(), "running": rows, "untracked": data.untracked(view.attempts, view.live, now)}

    @api.get("/attempts")
    def attempts(
        user: GetUserDep,
        response: Response,
        offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        team: Annotated[str | None, Query(max_length=80)] = None,
    ) -> dict[str, Any]:
        """Ended attempts of the last 30 days, newest first: how each ended and why."""
        _json_headers(response)
        view = _view(user)
        page = data.recent(view.attempts, time.time(), offset=offset, limit=limit, team=team)
        _add_links(page["attempts"])
        return {**view.meta(), **page}

    @api.get("/gpus_in_use")
    def gpus_in_use(user: GetUserDep, response: Response, window: Window = "day") -> dict[str, Any]:
        """GPUs in use per team over the window (mean per bucket: 5 min, 1 h or 6 h)."""
        _json_headers(response)
        view = _view(user)
        return {**view.meta(), **data.gpus_in_use(view.attempts, window, time.time())}

    @api.get("/daily_cost")
    def daily_cost(
        user: GetUserDep, response: Response, days: Annotated[int, Query(ge=1, le=30)] = 30
    ) -> dict[str, Any]:
        """Estimated USD per team per UTC day."""
        _json_headers(response)
        view = _view(user)
        return {**view.meta(), **data.daily_cost(view.attempts, days, time.time())}

    app.include_router(page)
    app.include_router(api)
    return app


def _add_links(rows: list[dict[str, Any]]) -> None:
    """Each job's console and log links, from its backend (configured as the page's ``ui_backends``)."""
    backends: dict[str, Any] = {}
    for row in rows:
        row.update(_links(row, backends))


def _links(row: dict[str, Any], backends: dict[str, Any]) -> dict[str, Any]:
    from gpu_provider.backends.base import JobHandle

    console = logs = None
    extra = row.pop("_extra", None) or {}
    spec = row.pop("_spec", None)
    try:
        name = str(row["backend"])
        key = json.dumps(spec, sort_keys=True, default=str) if spec else name
        if key not in backends:
            # a capacity ladder's attempt links to its own rung's backend (another region's console)
            backends[key] = _rung_backend(spec) if spec else _backend(name)
        backend = backends[key]
        handle = JobHandle(
            backend=str(row["backend"]),
            job_id=str(row["job_id"]),
            name=str(row["job_name"]),
            attempt=int(row["attempt"]),
            capacity=str(row["capacity"]),
            submitted_at=0.0,
            extra=extra,
        )
        console, logs = backend.console_url(handle), backend.logs_url(handle)
    except Exception:  # a link is a convenience: a backend that cannot build one shows none
        pass
    return {"console_url": console, "logs_url": logs}


def _rung_backend(spec: dict[str, Any]) -> Any:
    from gpu_provider.backends.base import resolve_backend

    return resolve_backend(spec)


def _backend(name: str) -> Any:
    for backend in queries.ui_backends():
        if backend.name == name:
            return backend
    from gpu_provider.backends.base import resolve_backend

    return resolve_backend(name)
