"""The reaper's decisions for every task instance state, through its real REST client talking to a
small HTTP server that answers as Airflow's API does (the states the real-Airflow test cannot pin
down: queued, scheduled, no state yet; an API that fails; token auth), and its grace and max
runtime rules on real local-backend jobs."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from gpu_provider.spend.prices import PriceBook
from gpu_provider.spend.reaper import KEEP, STOP, AirflowApi, reap

TOKEN = "jwt-for-the-reaper"


class FakeAirflowApi(ThreadingHTTPServer):
    """Task instances by ``dag_id``: a state, ``None`` (no state yet), ``"404"`` or ``"500"``."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tis: dict[str, Any] = {}
        self.runs: dict[str, str] = {}
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeAirflowApi

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/auth/token" and body == {"username": "reaper", "password": "s3cret"}:
            self._send(201, {"access_token": TOKEN})
        else:
            self._send(401, {"detail": "bad credentials"})

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, {"detail": "Not authenticated"})
            return
        parts = self.path.split("/")  # /api/v2/dags/<dag>/dagRuns/<run>[/taskInstances/<task>[/<map>]]
        dag_id = parts[4]
        if len(parts) == 7:
            self._send(200, {"state": self.server.runs.get(dag_id, "success")})
            return
        state = self.server.tis.get(dag_id, "404")
        if state == "404":
            self._send(404, {"detail": "not found"})
        elif state == "500":
            self._send(500, {"detail": "database is locked"})
        else:
            self._send(200, {"state": state, "try_number": 1})


@pytest.fixture
def api_server() -> Iterator[FakeAirflowApi]:
    server = FakeAirflowApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    yield backend
    for handle in backend.list_jobs():
        backend.cancel(handle, "test teardown")


def _submit(backend: LocalBackend, dag_id: str, *, map_index: int = -1, max_runtime_s: float | None = None) -> str:
    handle = backend.submit(
        JobRequest(
            identity=JobIdentity(TaskKey(dag_id, "job", "manual__1", map_index), 1, 1, names.ON_DEMAND, team="ml"),
            command=(sys.executable, "-c", "import time; time.sleep(60)"),
            env={},
            resources=GpuResources(gpus=2),
            capacity=names.ON_DEMAND,
            max_runtime_s=max_runtime_s,
        )
    )
    return handle.job_id


def test_each_task_instance_state_decides_and_only_non_live_owners_lose_their_jobs(
    api_server: FakeAirflowApi, local: LocalBackend
) -> None:
    cases = {
        "queued": ("queued", KEEP),
        "scheduled": ("scheduled", KEEP),
        "running": ("running", KEEP),
        "deferred": ("deferred", KEEP),
        "up_for_retry": ("up_for_retry", KEEP),
        "up_for_reschedule": ("up_for_reschedule", KEEP),
        "restarting": ("restarting", KEEP),
        "nostate_live_run": (None, KEEP),
        "nostate_done_run": (None, STOP),
        "failed": ("failed", STOP),
        "success": ("success", STOP),
        "skipped": ("skipped", STOP),
        "removed": ("removed", STOP),
        "gone": ("404", STOP),
        "api_broken": ("500", KEEP),
    }
    api_server.tis = {dag: state for dag, (state, _) in cases.items()}
    api_server.runs = {"nostate_live_run": "running", "nostate_done_run": "failed"}
    jobs = {dag: _submit(local, dag) for dag in cases}
    mapped = _submit(local, "failed", map_index=3)
    api = AirflowApi(api_server.url, username="reaper", password="s3cret")
    book = PriceBook(local_gpu_hour_usd=1.5)

    dry = reap([local], api, dry_run=True, grace_period_s=0, book=book)
    report = reap([local], api, dry_run=False, grace_period_s=0, book=book)
    assert {v.job.handle.job_id for v in dry.to_stop} == {v.job.handle.job_id for v in report.to_stop}
    actions = {v.job.task.dag_id: v.action for v in report.verdicts if v.job.task and v.job.task.map_index < 0}
    assert actions == {dag: action for dag, (_, action) in cases.items()}
    assert "/api/v2/dags/failed/dagRuns/manual__1/taskInstances/job/3" in api_server.paths
    (error,) = report.errors  # the broken answer is reported, and its job kept
    assert "answered HTTP 500" in error and "database is locked" in error, error
    by_dag = {v.job.task.dag_id: v for v in report.verdicts if v.job.task and v.job.task.map_index < 0}
    assert "does not exist (its DAG run or DAG was deleted)" in by_dag["gone"].why
    assert "has no state yet and its DAG run is running" in by_dag["nostate_live_run"].why
    # cost per hour: 2 GPUs at $1.5 per GPU-hour, for each job to stop
    stopped = [v for v in report.to_stop]
    assert all(v.usd_per_hour == 3.0 and v.stopped for v in stopped)
    assert report.to_dict()["usd_per_hour"] == 3.0 * len(stopped) == 3.0 * 7
    statuses = local.poll(local.list_jobs())
    for dag, job_id in jobs.items():
        if cases[dag][1] == KEEP:
            assert statuses[job_id].state.active, (dag, statuses[job_id])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(
        local.poll([h])[h.job_id].state.active for h in local.list_jobs() if h.job_id in {jobs["failed"], mapped}
    ):
        time.sleep(0.1)
    ended = local.poll([h for h in local.list_jobs() if h.job_id in {jobs["failed"], mapped}])
    assert all(s.state.value == "CANCELLED" and "the GPU reaper" in s.reason for s in ended.values()), ended
    assert local.poll([h for h in local.list_jobs() if h.job_id == jobs["running"]])[jobs["running"]].state.active


def test_grace_period_and_max_runtime(api_server: FakeAirflowApi, local: LocalBackend) -> None:
    api_server.tis = {"young": "404", "long": "running"}
    young = _submit(local, "young")
    long = _submit(local, "long", max_runtime_s=30)
    api = AirflowApi(api_server.url, username="reaper", password="s3cret")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(o.started_at for o in local.list_owned()):
        time.sleep(0.1)
    report = reap([local], api, dry_run=True, grace_period_s=300)
    assert {v.job.handle.job_id: v.action for v in report.verdicts} == {young: KEEP, long: KEEP}
    assert all("within the grace period of 300s" in v.why for v in report.verdicts)
    # an hour later the unknown task's job goes, and so does the running task's job past its max runtime
    later = reap([local], api, dry_run=True, grace_period_s=300, clock=lambda: time.time() + 3600)
    whys = {v.job.handle.job_id: (v.action, v.why) for v in later.verdicts}
    assert whys[young][0] == STOP and whys[long][0] == STOP
    assert "past its max runtime of 30s (+300s grace)" in whys[long][1]


def test_an_unreachable_api_keeps_every_job(local: LocalBackend) -> None:
    job = _submit(local, "anything")
    report = reap([local], AirflowApi("http://127.0.0.1:9", timeout=2), dry_run=False, grace_period_s=0)
    (verdict,) = report.verdicts
    assert verdict.job.handle.job_id == job and verdict.action == KEEP and not verdict.stopped
    assert "could not ask Airflow" in verdict.why and report.errors
