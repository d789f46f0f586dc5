"""A killed task writes its attempt's end (issue 25, item 5): ``CANCELLED`` with who stopped it, its
start, GPU-seconds and cost from the job's own times, and the metrics say the same. Before, the record
stayed ``QUEUED`` with no start and 0 GPU-hours: the GPU page showed the attempt as never run, and the
team's totals shrank when it ended."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.base import JobState, JobStatus
from gpu_provider.spend.ended import end_status
from tests.harness import Harness, wait_for
from tests.statsd import datagrams

#: $0.01 per GPU-second on the local backend
LOCAL_PRICE = {"AIRFLOW__GPU_PROVIDER__LOCAL_GPU_HOUR_USD": "36"}


def _stored(home: Path, dag_id: str) -> list[dict[str, Any]]:
    """The attempt records in the metadata DB's task state store (what the GPU page reads)."""
    (db,) = home.glob("*.db")
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select value from task_state_store where dag_id = ? and key = 'gpu_provider_attempts'", (dag_id,)
        ).fetchall()
    return [r for (value,) in rows for r in json.loads(value)]


def test_a_killed_task_records_its_attempt_as_cancelled_with_gpu_time_and_cost(
    harness: Harness, statsd: socket.socket
) -> None:
    started = harness.tmp / "started"
    dag = harness.write_dag(
        "kill_records",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=1),
            command=["/bin/sh", "-c", "touch {started}; sleep 300"],
            resources=GpuResources(gpus=2),
            team="vision",
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    env = {
        **LOCAL_PRICE,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
    }
    worker, _, log = harness.start(dag, "kill_records", extra_env=env)
    wait_for(started.exists, 120, "the job to start")
    running_since = time.time()
    wait_for(lambda: time.time() - running_since > 2, 10, "two seconds of running")
    worker.send_signal(signal.SIGTERM)  # what Airflow sends a task it kills (marked failed in the UI)
    worker.wait(timeout=60)
    (record,) = _stored(harness.home, "kill_records")
    assert record["state"] == JobState.CANCELLED.value, (record, log.read_text()[-3000:])
    assert "Airflow task kill_records.job of run" in record["reason"] and "was killed" in record["reason"]
    assert record["started_at"] is not None and record["ended_at"] is not None
    assert record["gpu_seconds"] >= 2 * 2, record  # 2 GPUs for at least 2 seconds
    assert record["cost_usd"] == pytest.approx(record["gpu_seconds"] * 0.01, rel=1e-3)
    assert record["reported"] is True
    lines = datagrams(statsd)
    gpu_hours = [line for line in lines if line.startswith("airflow.gpu_provider.gpu_hours,")]
    assert len(gpu_hours) == 1 and "team=vision" in gpu_hours[0], lines
    sent = float(gpu_hours[0].split(":")[1].split("|")[0])
    assert sent == pytest.approx(record["gpu_seconds"] / 3600, rel=1e-3)


def test_the_end_written_keeps_the_services_times() -> None:
    running = JobStatus(state=JobState.RUNNING, started_at=100.0, gpu_seconds=240.0, instance_type="g5.xlarge")
    ended = end_status(running, JobState.CANCELLED, "Airflow task d.t was killed", now=220.0)
    assert (ended.state, ended.started_at, ended.ended_at, ended.gpu_seconds) == (
        JobState.CANCELLED,
        100.0,
        220.0,
        240.0,
    )
    assert ended.instance_type == "g5.xlarge" and ended.reason == "Airflow task d.t was killed"
    # it had succeeded before the stop: that end stands
    done = JobStatus(state=JobState.SUCCEEDED, started_at=100.0, ended_at=150.0, gpu_seconds=50.0)
    assert end_status(done, JobState.CANCELLED, "killed", now=220.0) == done
    unknown = end_status(None, JobState.CANCELLED, "killed", now=220.0)
    assert unknown.ended_at == 220.0 and "could not be read" in unknown.reason
