"""Attempts ended by something that cannot write their task's records are counted (issue 25, item 5).

A deferred task marked failed (its trigger's ``on_kill`` stops the job in the triggerer) and an orphan
the reaper stops both used to stay ``QUEUED`` on the GPU page and in ``/gpu/api/attempts``: no start,
0 GPU-hours, cost ``-``, and the team's totals shrank when the job stopped. Now whoever stops the job
reports its end once (metrics, the team's month) from the service's own times, and the page reads the
same end from the service (read-only). Real local jobs, a real child process with Airflow's stats
client sending StatsD, the reaper asking an HTTP server that answers as Airflow's REST API does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, JobState, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from gpu_provider.plugins.ui import data, queries
from gpu_provider.plugins.ui.data import TaskRow
from gpu_provider.records import AttemptRecord
from gpu_provider.spend.ended import price_from_dict
from gpu_provider.spend.prices import PriceBook
from tests.harness import REPO, wait_for
from tests.spend.fake_airflow_api import FakeAirflowApi, serving
from tests.statsd import datagrams

#: $0.01 per GPU-second on the local backend
GPU_HOUR_USD = 36.0


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    yield backend
    for handle in backend.list_jobs():
        backend.cancel(handle, "test teardown")


@pytest.fixture
def priced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page prices with ``[gpu_provider] local_gpu_hour_usd``, as the API server would."""
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_GPU_HOUR_USD", str(GPU_HOUR_USD))
    queries.clear_cache(records=True)


def _metric(lines: list[str], name: str) -> list[float]:
    return [float(line.split(":")[1].split("|")[0]) for line in lines if line.startswith(f"airflow.{name},")]


def _running(local: LocalBackend, dag_id: str) -> JobHandle:
    """A job of 2 GPUs for team vision, once it has run for more than a second."""
    handle = local.submit(
        JobRequest(
            identity=JobIdentity(TaskKey(dag_id, "job", "manual__1"), 1, 1, names.ON_DEMAND, team="vision"),
            command=(sys.executable, "-c", "import time; time.sleep(120)"),
            env={},
            resources=GpuResources(gpus=2),
            capacity=names.ON_DEMAND,
        )
    )

    def ran() -> bool:
        status = local.poll([handle])[handle.job_id]
        return bool(status.state is JobState.RUNNING and status.started_at and time.time() - status.started_at > 1.2)

    wait_for(ran, 60, "the job to run for a second")
    return handle


def _child(statsd: socket.socket, *args: str) -> dict[str, object]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.spend.stop_child", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _row(handle: JobHandle, dag_id: str, ti_state: str, price: dict[str, object] | None = None) -> TaskRow:
    record = AttemptRecord.new(handle, try_number=1)  # as the task left it: QUEUED, no start, no GPU time
    record.price = price
    return TaskRow(
        dag_id=dag_id,
        run_id="manual__1",
        task_id="job",
        map_index=-1,
        value="",
        ti_state=ti_state,
        pool="gpu_vision",
        pool_slots=2,
        ti_end_date=None if ti_state == "running" else datetime.now(timezone.utc),
        records=(record,),
    )


def _month(attempts: list[data.Attempt], now: float) -> tuple[float, float]:
    (team,) = [t for t in data.team_figures(attempts, [], now) if t["team"] == "vision"]
    return team["gpu_hours"]["month"], team["cost_usd"]["month"]


def _page(row: TaskRow, local: LocalBackend) -> tuple[list[data.Attempt], float]:
    """What the page computes from ``row``: live jobs, ends read from the service, the attempts."""
    live = queries.read_live([local])
    ended = queries.read_ended([row], live, [local])
    now = time.time()
    return data.attempts_of([row], live.jobs, now, live.usd_per_hour, ended), now


def test_an_orphan_the_reaper_stops_shows_reaped_with_gpu_time_and_cost_and_is_counted_once(
    airflow_home: Path, local: LocalBackend, statsd: socket.socket, priced: None
) -> None:
    handle = _running(local, "reaped_dag")
    attempts, now = _page(_row(handle, "reaped_dag", "running"), local)
    before = _month(attempts, now)
    assert before[0] > 0 and before[1] > 0, before  # the running attempt counts what it used so far

    with serving() as api:
        server: FakeAirflowApi = api
        server.tis = {"reaped_dag": "failed"}
        report = _child(statsd, "reap", str(local.state_dir), server.url)
        (stopped,) = report["to_stop"]  # type: ignore[misc]
        assert stopped["stopped"] and stopped["gpu_hours"] > 0 and stopped["cost_usd"] > 0, report
        lines = datagrams(statsd)
        (sent_hours,) = _metric(lines, "gpu_provider.gpu_hours")
        (sent_cost,) = _metric(lines, "gpu_provider.cost_usd")
        assert [line for line in lines if "gpu_hours" in line and "team=vision" in line], lines
        assert sent_hours == pytest.approx(stopped["gpu_hours"], rel=1e-3)
        assert sent_cost == pytest.approx(stopped["gpu_hours"] * GPU_HOUR_USD, rel=1e-2)
        # a later pass finds nothing to stop: the end is not counted twice
        again = _child(statsd, "reap", str(local.state_dir), server.url)
        assert again["to_stop"] == [] and _metric(datagrams(statsd), "gpu_provider.gpu_hours") == []

    # the page: the record the task left says QUEUED; the end comes from the service, read once stopped
    row = _row(handle, "reaped_dag", "failed")
    attempts = wait_for(lambda: (lambda a: a if a[0][0].end is not None else None)(_page(row, local)), 30, "the end")
    attempts, now = attempts
    shown = attempts[0].to_dict(now)
    assert shown["end"] == "reaped" and shown["state"] == JobState.CANCELLED.value, shown
    assert "the GPU reaper" in shown["reason"] and shown["started_at"] and shown["ended_at"], shown
    assert shown["gpu_hours"] >= stopped["gpu_hours"] > 0, (shown, stopped)
    assert shown["cost_usd"] == pytest.approx(shown["gpu_hours"] * GPU_HOUR_USD, rel=1e-3)
    after = _month(attempts, now)
    assert after[0] >= before[0] and after[1] >= before[1], (before, after)


def test_a_deferred_task_killed_shows_cancelled_with_gpu_time_and_cost_and_is_counted_once(
    airflow_home: Path, local: LocalBackend, statsd: socket.socket, priced: None
) -> None:
    handle = _running(local, "killed_dag")
    price = PriceBook(local_gpu_hour_usd=GPU_HOUR_USD).job_price(
        GpuResources(gpus=2), names.ON_DEMAND, None, local.price_catalog
    )
    attempts, now = _page(_row(handle, "killed_dag", "deferred", price.to_dict()), local)
    before = _month(attempts, now)

    spend = {"team": "vision", "nodes": 1, "price": price.to_dict()}  # what the operator hands its trigger
    _child(statsd, "trigger", str(local.state_dir), json.dumps(handle.to_dict()), json.dumps(spend))
    lines = datagrams(statsd)
    (sent_hours,) = _metric(lines, "gpu_provider.gpu_hours")
    (sent_cost,) = _metric(lines, "gpu_provider.cost_usd")
    assert sent_hours > 0 and sent_cost == pytest.approx(sent_hours * GPU_HOUR_USD, rel=1e-2), lines
    assert [line for line in lines if "gpu_hours" in line and "team=vision" in line], lines

    row = _row(handle, "killed_dag", "failed", price.to_dict())  # marked failed in the UI
    attempts = wait_for(lambda: (lambda a: a if a[0][0].end is not None else None)(_page(row, local)), 30, "the end")
    attempts, now = attempts
    shown = attempts[0].to_dict(now)
    assert shown["end"] == "cancelled" and shown["started_at"], shown
    assert "killed_dag.job of run manual__1 was killed while deferred" in shown["reason"], shown
    assert shown["gpu_hours"] == pytest.approx(sent_hours, rel=0.05), (shown, sent_hours)
    assert shown["cost_usd"] == pytest.approx(shown["gpu_hours"] * GPU_HOUR_USD, rel=1e-3)
    after = _month(attempts, now)
    assert after[0] >= before[0] and after[1] >= before[1], (before, after)


def test_the_page_reads_no_end_while_the_task_or_its_backend_may_still_hold_the_job() -> None:
    handle = JobHandle(
        backend="local", job_id="j1", name="gp-job", attempt=1, capacity=names.ON_DEMAND, submitted_at=time.time()
    )
    record = AttemptRecord.new(handle)
    rows = [
        TaskRow("d", "r", "t", -1, "", ti_state="deferred", records=(record,)),
        TaskRow("d", "r", "u", -1, "", ti_state="failed", records=(record,)),
    ]
    answered = queries.LiveJobs(backends=["local"])
    assert [r.task_id for r, _ in queries.unwritten_ends(rows, answered)] == ["u"]
    # the backend could not list its jobs: the job may still run, so nothing is read as ended
    unlisted = queries.LiveJobs(backends=["local"], failed=["local"])
    assert queries.unwritten_ends(rows, unlisted) == []


def test_a_records_price_comes_back_from_its_wire_form() -> None:
    price = PriceBook().instance_price("p4d.24xlarge", names.ON_DEMAND, "us-east-1", "ec2")
    back = price_from_dict(price.to_dict())
    assert back is not None
    assert (back.usd_per_hour, back.accelerators) == (pytest.approx(price.usd_per_hour), price.accelerators)
    assert price_from_dict(None) is None and price_from_dict({"usd_per_hour": "x"}) is None
