"""The reaper example (dags/gpu_reaper.py): parses without boto3, runs every 15 minutes, and under
dag.test reports (dry run by default) an orphaned local job with its cost per hour, stopping nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from tests.harness import REPO, Harness, pid_alive
from tests.spend.fake_airflow_api import AIRFLOW_2, TOKEN, FakeAirflowApi, serving

DAG_FILE = REPO / "dags" / "gpu_reaper.py"


@pytest.fixture
def api_server() -> Iterator[FakeAirflowApi]:
    with serving() as server:
        yield server


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


def test_the_reaper_dag_parses_without_the_service_extras_and_says_what_it_skipped() -> None:
    """A base install: the AWS and Kubernetes clients cannot be imported (blocked in ``sys.modules``, as
    ``importlib`` sees a missing package), and a backend registered by a third party fails to import
    naming its extra. With no ``reaper_backends`` set the DAG still parses and sweeps what is installed."""
    code = (
        "import importlib.util, json, sys\n"
        "for blocked in ('boto3', 'botocore', 'kubernetes'):\n"
        "    sys.modules[blocked] = None\n"
        "from gpu_provider.backends.base import register_backend\n"
        "register_backend('needs_extra', 'tests.dags.missing_extra_backend.NeedsExtraBackend')\n"
        f"spec = importlib.util.spec_from_file_location('gpu_reaper', {str(DAG_FILE)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "op = module.dag.get_task('reap')\n"
        "print(json.dumps([[b.name for b in op.backends], op.skipped_backends]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    backends, skipped = json.loads(out.stdout.strip().splitlines()[-1])
    assert backends == ["local"], (backends, skipped)
    assert sorted(skipped) == ["batch", "kubernetes", "needs_extra", "sagemaker"], skipped
    assert "its extra [batch] is not installed (missing: boto3)" in skipped["batch"]
    assert "its extra [kubernetes] is not installed" in skipped["kubernetes"]
    assert "pip install 'acme-gpu[client]'" in skipped["needs_extra"]


def test_the_reaper_fails_visibly_and_stops_nothing_when_the_api_is_not_airflow_3(harness: Harness) -> None:
    local = LocalBackend(state_dir=str(harness.state_dir), grace_period=0.5)
    orphan = local.submit(
        JobRequest(
            identity=JobIdentity(TaskKey("deleted_dag", "train", "manual__1"), 1, 1, names.ON_DEMAND),
            command=(sys.executable, "-c", "import time; time.sleep(120)"),
            env={},
            resources=GpuResources(gpus=1),
            capacity=names.ON_DEMAND,
        )
    )
    dag_file = harness.home / "dags" / "gpu_reaper.py"
    shutil.copy(DAG_FILE, dag_file)
    with serving(AIRFLOW_2) as airflow2:
        env = {
            "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
            "AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS": '["local"]',
            "AIRFLOW__GPU_PROVIDER__REAPER_GRACE_PERIOD": "0",
            "AIRFLOW__GPU_PROVIDER__REAPER_DRY_RUN": "False",
            "AIRFLOW_CONN_AIRFLOW_API": json.dumps(
                {"conn_type": "http", "host": airflow2.url, "login": "reaper", "password": "s3cret"}
            ),
        }
        run = harness.run(dag_file, "gpu_reaper", extra_env=env)
        asked = airflow2.gets()
    assert run.task("reap")["state"] == "failed", run.log[-4000:]
    assert "The reaper stopped nothing" in run.log and "is not Airflow 3's" in run.log, run.log[-4000:]
    assert asked == ["GET /api/v2/version"], asked  # nothing asked about any task after that answer
    assert local.poll([orphan])[orphan.job_id].state.active
    assert "s3cret" not in run.log


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
    api_server.runs = {"deleted_dag": "404"}
    api_server.dags_gone = {"deleted_dag"}
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
    assert "does not exist (its DAG was deleted: Airflow answered not found" in verdict["why"]
    assert report["airflow_version"] == "3.3.2"
    assert report["usd_per_hour"] == 4.0
    assert "Would stop local job gp-deleted-dag-train-" in run.log and "$4.00/h" in run.log
    assert "Nothing was stopped (dry_run=True)." in run.log
    assert "s3cret" not in run.log and TOKEN not in run.log
    assert local.poll([orphan])[orphan.job_id].state.active
    assert all(pid_alive(pid) for pid in local.job_pids(orphan))
