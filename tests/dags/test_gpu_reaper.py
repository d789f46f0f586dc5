"""The reaper example (dags/gpu_reaper.py): parses without boto3, runs every 15 minutes, and under
dag.test reports (dry run by default) an orphaned local job with its cost per hour, stopping nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from tests.harness import REPO, Harness, pid_alive
from tests.spend.test_reaper_api import TOKEN, FakeAirflowApi

DAG_FILE = REPO / "dags" / "gpu_reaper.py"


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


def test_the_reaper_dag_parses_light_and_runs_every_15_minutes() -> None:
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('gpu_reaper', {str(DAG_FILE)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "op = module.dag.get_task('reap')\n"
        "print(json.dumps([str(module.dag.schedule), op.report_only, op.grace_period_s,"
        " [b.name for b in op.backends], 'boto3' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    schedule, report_only, grace, backends, boto3 = json.loads(out.stdout.strip().splitlines()[-1])
    assert schedule == str(timedelta(minutes=15)) or "0:15:00" in schedule, schedule
    assert report_only is True and grace == 600.0
    assert set(backends) >= {"local", "batch"} and boto3 is False


def test_the_reaper_dag_reports_an_orphan_and_stops_nothing_by_default(
    harness: Harness, api_server: FakeAirflowApi
) -> None:
    local = LocalBackend(state_dir=str(harness.state_dir), grace_period=0.5)
    orphan = local.submit(
        JobRequest(
            identity=JobIdentity(TaskKey("deleted_dag", "train", "manual__1"), 1, 1, names.SPOT, team="vision"),
            command=(sys.executable, "-c", "import time; time.sleep(120)"),
            env={},
            resources=GpuResources(gpus=2),
            capacity=names.SPOT,
        )
    )
    dag_file = harness.home / "dags" / "gpu_reaper.py"
    shutil.copy(DAG_FILE, dag_file)
    host = f"http://127.0.0.1:{api_server.server_address[1]}"
    env = {
        "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
        "AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS": '["local"]',
        "AIRFLOW__GPU_PROVIDER__REAPER_GRACE_PERIOD": "0",
        "AIRFLOW__GPU_PROVIDER__LOCAL_GPU_HOUR_USD": "2",
        "AIRFLOW_CONN_AIRFLOW_API": json.dumps(
            {"conn_type": "http", "host": host, "login": "reaper", "password": "s3cret"}
        ),
    }
    run = harness.run(dag_file, "gpu_reaper", extra_env=env)
    task = run.task("reap")
    assert task["state"] == "success", run.log[-4000:]
    report = task["xcom"]
    assert report["dry_run"] is True and report["stopped"] == 0 and report["errors"] == []
    (verdict,) = report["to_stop"]
    assert (verdict["job_id"], verdict["team"], verdict["usd_per_hour"]) == (orphan.job_id, "vision", 4.0)
    assert "does not exist (its DAG run or DAG was deleted)" in verdict["why"]
    assert report["usd_per_hour"] == 4.0
    assert "Would stop local job gp-deleted-dag-train-" in run.log and "$4.00/h" in run.log
    assert "Nothing was stopped (dry_run=True)." in run.log
    assert "s3cret" not in run.log and TOKEN not in run.log
    assert local.poll([orphan])[orphan.job_id].state.active
    assert all(pid_alive(pid) for pid in local.job_pids(orphan))
