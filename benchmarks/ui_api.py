"""Response time of the GPU page's JSON endpoints with a big history (default 10,000 attempt records).

A fresh Airflow home (SQLite metadata DB, ``airflow db migrate``) gets N attempt records the way the
operator stores them: task state store rows under ``gpu_provider_attempts`` (two attempts per task
instance: a spot attempt interrupted, then an on-demand one that succeeded), with their DAG runs and
task instances, spread over the last 30 days across four teams and their ``gpu_<team>`` pools, plus
20 task instances still running. Then Airflow's own API server app (``airflow.api_fastapi.app``,
with the plugin loaded through its entry point and the simple auth manager) answers each endpoint
in-process (Starlette's test client: everything but the socket), signed in with a token:

- **first read**: every cache emptied, so the request fetches and parses every record of the window
  (what the first request after the API server starts pays);
- **refresh**: the page's 10 s cache expired, nothing written since: the request lists the rows
  (ids, update times, task instances) and fetches no value (the steady state, once per 10 s);
- **warm**: the next request within the cache's life, which computes its figures from the records
  read before (what the page's other requests of one refresh get).

Reported: the median of ``--repeat`` requests each, and the response size.

Usage: ``python benchmarks/ui_api.py [--attempts 10000] [--repeat 5] [--write]`` (``--write`` puts the
table into benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENDPOINTS = [
    "/gpu/api/summary",
    "/gpu/api/running",
    "/gpu/api/attempts?offset=0&limit=50",
    "/gpu/api/gpus_in_use?window=day",
    "/gpu/api/gpus_in_use?window=month",
    "/gpu/api/daily_cost?days=30",
]
TEAMS = ["vision", "research", "nlp", "speech"]
SECTION = "## GPU page API (`benchmarks/ui_api.py`)"


def _home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="gpu-ui-bench-"))
    (home / "dags").mkdir()
    (home / "passwords.json").write_text(json.dumps({"admin": "bench"}))
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__GPU_PROVIDER__UI_BACKENDS": json.dumps([{"name": "local", "state_dir": str(home / "jobs")}]),
        }
    )
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    return home


def _record(
    job_id: str, attempt: int, capacity: str, state: str, start: datetime, end: datetime | None
) -> dict[str, Any]:
    gpu_s = 0.0 if end is None else (end - start).total_seconds() * 2
    rate = 1.2 if capacity == "spot" else 3.0
    return {
        "attempt": attempt,
        "handle": {
            "backend": "batch",
            "job_id": job_id,
            "name": f"gp-{job_id}",
            "attempt": attempt,
            "capacity": capacity,
            "submitted_at": start.timestamp() - 30,
            "extra": {"region": "us-east-1", "queue": f"gpu-{capacity}"},
        },
        "state": state,
        "reason": "Host EC2 (instance i-0abc) terminated." if state == "PREEMPTED" else "",
        "started_at": start.isoformat(),
        "ended_at": end.isoformat() if end else None,
        "try_number": 1,
        "owner_try": 1,
        "gpu_seconds": gpu_s,
        "instance_type": "g5.12xlarge",
        "interruption": "preempted" if state == "PREEMPTED" else None,
        "nodes": 1,
        "price": {"usd_per_gpu_hour": rate, "capacity": capacity, "instance_type": "g5.12xlarge"},
        "cost_usd": round(gpu_s / 3600 * rate, 6),
        "queue_wait_s": 12.0,
        "schema": 2,
    }


def _fill(attempts: int, running: int = 20) -> None:
    from airflow import settings
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.pool import Pool
    from airflow.models.task_state_store import TaskStateStoreModel as Store
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import insert, select

    rng = random.Random(7)
    now = datetime.now(timezone.utc)
    tasks = attempts // 2
    for team in TEAMS:
        Pool.create_or_update_pool(f"gpu_{team}", slots=64, description="bench", include_deferred=True)
    with settings.engine.begin() as session:  # plain SQL inserts: 10,000 ORM objects would measure the ORM
        runs, tis, rows = [], [], []
        for i in range(tasks + running):
            team, dag_id, run_id = TEAMS[i % len(TEAMS)], f"pipeline_{i % 25}", f"run_{i}"
            live = i >= tasks
            end = None if live else now - timedelta(seconds=rng.uniform(60, 30 * 86400 - 7200))
            start1 = (end or now) - timedelta(hours=rng.uniform(0.5, 3))
            records = [_record(f"j{i}a1", 1, "spot", "PREEMPTED", start1, start1 + timedelta(minutes=20))]
            second = start1 + timedelta(minutes=22)
            records.append(_record(f"j{i}a2", 2, "on-demand", "RUNNING" if live else "SUCCEEDED", second, end))
            runs.append(
                {
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "run_type": "manual",
                    "state": "running" if live else "success",
                    "logical_date": None,
                    "data_interval_end": None,
                    "run_after": start1,
                }
            )
            tis.append(
                {
                    "id": uuid.uuid4(),
                    "dag_id": dag_id,
                    "run_id": run_id,
                    "task_id": "train",
                    "map_index": -1,
                    "pool": f"gpu_{team}",
                    "pool_slots": 2,
                    "state": "running" if live else "success",
                    "end_date": end,
                    "try_number": 1,
                }
            )
            rows.append((dag_id, run_id, json.dumps(records), end or now))
        dags = sorted({r["dag_id"] for r in runs})
        if not session.execute(select(DagBundleModel.name).where(DagBundleModel.name == "dags-folder")).first():
            session.execute(insert(DagBundleModel.__table__), [{"name": "dags-folder"}])
        session.execute(
            insert(DagModel.__table__),
            [
                {
                    "dag_id": d,
                    "bundle_name": "dags-folder",
                    "max_active_tasks": 16,
                    "max_consecutive_failed_dag_runs": 0,
                    "has_task_concurrency_limits": False,
                }
                for d in dags
            ],
        )
        session.execute(insert(DagRun.__table__), runs)
        session.execute(insert(TI.__table__), tis)
        ids = dict(((d, r), i) for i, d, r in session.execute(select(DagRun.id, DagRun.dag_id, DagRun.run_id)))
        session.execute(
            insert(Store.__table__),
            [
                {
                    "dag_run_id": ids[(d, r)],
                    "task_id": "train",
                    "map_index": -1,
                    "key": "gpu_provider_attempts",
                    "dag_id": d,
                    "run_id": r,
                    "value": v,
                    "updated_at": u,
                }
                for d, r, v, u in rows
            ],
        )


def measure(attempts: int, repeat: int) -> dict[str, Any]:
    _home()
    began = time.monotonic()
    _fill(attempts)
    fill_s = time.monotonic() - began
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    from gpu_provider.plugins.ui import queries

    client = TestClient(create_app())
    token = client.post("/auth/token", json={"username": "admin", "password": "bench"}).json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    results: dict[str, Any] = {}
    for path in ENDPOINTS:
        cold, refresh, warm, size = [], [], [], 0
        for _ in range(repeat):
            queries.clear_cache(records=True)
            t0 = time.perf_counter()
            response = client.get(path, headers=headers)
            cold.append(time.perf_counter() - t0)
            assert response.status_code == 200, (path, response.status_code, response.text[:500])
            queries.clear_cache()
            t0 = time.perf_counter()
            response = client.get(path, headers=headers)
            refresh.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            response = client.get(path, headers=headers)
            warm.append(time.perf_counter() - t0)
            size = len(response.content)
        results[path] = {
            "cold_ms": statistics.median(cold) * 1000,
            "refresh_ms": statistics.median(refresh) * 1000,
            "warm_ms": statistics.median(warm) * 1000,
            "bytes": size,
        }
    summary = client.get("/gpu/api/summary", headers=headers).json()
    total = client.get("/gpu/api/attempts?limit=1", headers=headers).json()["total"]
    return {
        "attempts": attempts,
        "ended_attempts_listed": total,
        "teams": len(summary["teams"]),
        "read_s": summary["read_s"],
        "fill_s": fill_s,
        "results": results,
    }


def table(out: dict[str, Any], repeat: int) -> str:
    lines = [
        SECTION,
        "",
        "Response time of the GPU page's JSON endpoints (see the README, *The GPU page in the Airflow UI*) with a",
        "big history: N attempt records in the task state store (two per task instance, spread over 30 days, four",
        "teams, 20 task instances running), answered by Airflow's own API server app in-process (auth, database,",
        "JSON; not the socket). *First read*: every cache emptied, so the request fetches and parses every record of",
        "the last 30 days (the first request after the API server starts); *refresh*: the page's 10 s cache expired",
        "with nothing written since, so the request lists the rows and their task instances and fetches no record",
        "(the steady state); *warm*: a request within the cache's life (the other requests of one page refresh).",
        "Reproduce: `python benchmarks/ui_api.py --attempts 10000 --write`.",
        "",
        f"### Result, {datetime.now(timezone.utc):%Y-%m-%d} ({os.cpu_count()}-core machine shared with other test "
        f"runs, Python {platform.python_version()}, SQLite, one run, median of {repeat})",
        "",
        f"{out['attempts']:,} attempt records ({out['ended_attempts_listed']:,} ended in the window); the read of the "
        f"records and pools took {out['read_s'] * 1000:.0f} ms of a refresh.",
        "",
        "| endpoint | first read (ms) | refresh (ms) | warm (ms) | response |",
        "|---|---:|---:|---:|---:|",
    ]
    for path, r in out["results"].items():
        lines.append(
            f"| `{path}` | {r['cold_ms']:.0f} | {r['refresh_ms']:.0f} | {r['warm_ms']:.0f} "
            f"| {r['bytes'] / 1024:.1f} KiB |"
        )
    lines += [
        "",
        "One page refresh makes five requests: at most one per 10 s is a refresh, the others are warm. The listing",
        "scans the state store rows of the operator's key (Airflow has no index on the task state store's key or",
        "update time; the values are fetched by primary key, only for rows written since the last read), bounded",
        "at 20,000 task instances per read.",
    ]
    return "\n".join(lines) + "\n"


def write_readme(text: str) -> None:
    path = REPO / "benchmarks" / "README.md"
    current = path.read_text()
    start = current.find(SECTION)
    if start < 0:
        path.write_text(current.rstrip("\n") + "\n\n" + text)
        return
    end = current.find("\n## ", start + len(SECTION))
    path.write_text(current[:start] + text + (current[end + 1 :] if end >= 0 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="put the result into benchmarks/README.md")
    args = parser.parse_args()
    out = measure(args.attempts, args.repeat)
    text = table(out, args.repeat)
    print(text)
    print(json.dumps(out, indent=1))
    if args.write:
        write_readme(text)


if __name__ == "__main__":
    main()
