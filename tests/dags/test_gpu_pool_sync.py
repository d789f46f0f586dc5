"""The pool sync example DAG (dags/gpu_pool_sync.py) parses light and runs every 15 minutes; its sync
against a real Airflow is in tests/integration/test_scheduler_postgres.py. What the sync plans for
each pool, from the pools it finds."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

from gpu_provider.quotas.file import parse_quotas
from gpu_provider.quotas.pools import plan
from tests.harness import REPO

DAG_FILE = REPO / "dags" / "gpu_pool_sync.py"


def test_the_pool_sync_dag_parses_light_and_runs_every_15_minutes() -> None:
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('gpu_pool_sync', {str(DAG_FILE)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "print(json.dumps([str(module.dag.schedule), module.dag.params['dry_run'], module.dag.max_active_runs,"
        " 'boto3' in sys.modules, 'yaml' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    schedule, dry_run, max_runs, boto3, _ = json.loads(out.stdout.strip().splitlines()[-1])
    assert "0:15:00" in schedule or schedule == str(timedelta(minutes=15)), schedule
    assert dry_run is False and max_runs == 1 and boto3 is False


def test_the_plan_creates_updates_keeps_and_never_deletes() -> None:
    quotas = parse_quotas({"teams": {"a": {"gpus": 4}, "b": {"gpus": 2}, "c": {"gpus": 1}}})
    found = {
        "gpu_b": {"slots": 2, "include_deferred": True},
        "gpu_c": {"slots": 3, "include_deferred": False},
        "gpu_old": {"slots": 5, "include_deferred": True},
        "default_pool": {"slots": 128, "include_deferred": False},
    }
    changes = {c.pool: c for c in plan(quotas, found)}
    assert set(changes) == {"gpu_a", "gpu_b", "gpu_c", "gpu_old"}  # default_pool is not ours to report
    assert (changes["gpu_a"].action, changes["gpu_a"].slots) == ("create", 4)
    assert changes["gpu_b"].action == "ok"
    assert changes["gpu_c"].action == "update"
    assert changes["gpu_c"].drift == ("slots: 3 -> 1", "include_deferred: False -> True")
    assert changes["gpu_old"].action == "unmanaged"
    assert "kept (the sync never deletes a pool" in changes["gpu_old"].line(dry_run=False)
    assert changes["gpu_a"].line(dry_run=True).startswith("gpu_a: would create with 4 slots")
