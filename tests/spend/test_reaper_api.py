"""The reaper's decisions for every task instance state, through its real REST client talking to a
small HTTP server that answers as Airflow's API does (the states the real-Airflow test cannot pin
down: queued, scheduled, no state yet; an API that fails; token auth), and its grace and max
runtime rules on real local-backend jobs."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from gpu_provider.spend.prices import PriceBook
from gpu_provider.spend.reaper import KEEP, STOP, AirflowApi, reap
from tests.spend.fake_airflow_api import TOKEN, FakeAirflowApi, serving

__all__ = ["TOKEN", "FakeAirflowApi"]


@pytest.fixture
def api_server() -> Iterator[FakeAirflowApi]:
    with serving() as server:
        yield server


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
        "gone": ("404", STOP),  # Airflow's not-found for the task instance, and again for its DAG run
        "dag_gone": ("404", STOP),
        "ti_gone_run_there": ("404", KEEP),  # evidence that does not agree: kept, and reported
        "api_broken": ("500", KEEP),
    }
    api_server.tis = {dag: state for dag, (state, _) in cases.items()}
    api_server.runs = {
        "nostate_live_run": "running",
        "nostate_done_run": "failed",
        "gone": "404",
        "dag_gone": "404",
        "ti_gone_run_there": "running",
    }
    api_server.dags_gone = {"dag_gone"}
    jobs = {dag: _submit(local, dag) for dag in cases}
    mapped = _submit(local, "failed", map_index=3)
    api = AirflowApi(api_server.url, username="reaper", password="s3cret")
    book = PriceBook(local_gpu_hour_usd=1.5)

    dry = reap([local], api, dry_run=True, grace_period_s=0, book=book)
    report = reap([local], api, dry_run=False, grace_period_s=0, book=book)
    assert {v.job.handle.job_id for v in dry.to_stop} == {v.job.handle.job_id for v in report.to_stop}
    actions = {v.job.task.dag_id: v.action for v in report.verdicts if v.job.task and v.job.task.map_index < 0}
    assert actions == {dag: action for dag, (_, action) in cases.items()}
    assert "GET /api/v2/dags/failed/dagRuns/manual__1/taskInstances/job/3" in api_server.paths
    assert report.airflow_version == "3.3.2" and report.api_error is None
    # the broken answer and the disagreeing one are reported, and their jobs kept
    inconsistent, broken = sorted(report.errors, key=lambda e: "HTTP 500" in e)
    assert "answered HTTP 500" in broken and "database is locked" in broken, broken
    assert "was not found, yet its DAG run is there (running)" in inconsistent, inconsistent
    by_dag = {v.job.task.dag_id: v for v in report.verdicts if v.job.task and v.job.task.map_index < 0}
    assert "does not exist (its DAG run was deleted: Airflow answered not found" in by_dag["gone"].why
    assert "does not exist (its DAG was deleted" in by_dag["dag_gone"].why
    # a deletion is believed only after the second read: the DAG run of each task instance found missing
    assert "GET /api/v2/dags/gone/dagRuns/manual__1" in api_server.paths
    assert "has no state yet and its DAG run is running" in by_dag["nostate_live_run"].why
    # cost per hour: 2 GPUs at $1.5 per GPU-hour, for each job to stop
    stopped = [v for v in report.to_stop]
    assert all(v.usd_per_hour == 3.0 and v.stopped for v in stopped)
    assert report.to_dict()["usd_per_hour"] == 3.0 * len(stopped) == 3.0 * 8
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


def test_grace_period_and_a_live_owner_outlasting_max_runtime(api_server: FakeAirflowApi, local: LocalBackend) -> None:
    api_server.tis = {"young": "404", "long": "running"}
    api_server.runs = {"young": "404"}
    young = _submit(local, "young")
    long = _submit(local, "long", max_runtime_s=30)
    api = AirflowApi(api_server.url, username="reaper", password="s3cret")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(o.started_at for o in local.list_owned()):
        time.sleep(0.1)
    report = reap([local], api, dry_run=True, grace_period_s=300)
    assert {v.job.handle.job_id: v.action for v in report.verdicts} == {young: KEEP, long: KEEP}
    assert all("within the grace period of 300s" in v.why for v in report.verdicts)
    # an hour later the deleted task's job goes; the running task's job stays, though past its max runtime:
    # a job with a live owner is never stopped by the runtime rule (the task's own wait enforces it)
    later = reap([local], api, dry_run=True, grace_period_s=300, clock=lambda: time.time() + 3600)
    whys = {v.job.handle.job_id: (v.action, v.why) for v in later.verdicts}
    assert whys[young][0] == STOP and whys[long][0] == KEEP, whys
    assert "is running" in whys[long][1]


def test_an_unreachable_api_keeps_every_job(local: LocalBackend) -> None:
    job = _submit(local, "anything")
    report = reap([local], AirflowApi("http://127.0.0.1:9", timeout=2), dry_run=False, grace_period_s=0)
    (verdict,) = report.verdicts
    assert verdict.job.handle.job_id == job and verdict.action == KEEP and not verdict.stopped
    assert "could not ask Airflow" in verdict.why and report.errors
    assert report.api_error is not None and "could not be reached" in report.api_error
