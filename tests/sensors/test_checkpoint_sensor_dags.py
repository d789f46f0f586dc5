"""CheckpointSensor in real DAG runs (dag.test in a child process): deferred by default, on a running local-backend
job's checkpoints, and newer_than across runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpu_provider import GpuResources, names
from gpu_provider.backends.base import JobIdentity, JobRequest, JobState, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.runtime import save_checkpoint
from tests.harness import Harness, wait_for


def _save(uri: str, step: int) -> None:
    with save_checkpoint(uri, step, keep=None) as folder:
        (folder / "w.bin").write_bytes(str(step).encode())


def _sensor_dag(harness: Harness, dag_id: str, uri: str, **kwargs: object) -> Path:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return harness.write_dag(
        dag_id,
        f"""
        from gpu_provider.sensors import CheckpointSensor
        CheckpointSensor(task_id="job", uri={uri!r}, poll_interval=0.2, {args})
        """,
    )


def test_deferred_by_default_and_fires_once_the_step_is_published(harness: Harness, tmp_path: Path) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    _save(uri, 10)
    dag_file = _sensor_dag(harness, "ckpt_deferred", uri, min_step=20)
    proc, out, log = harness.start(dag_file, "ckpt_deferred")
    # the task deferred: its trigger runs (dag.test runs it in line) and sees only step 10
    wait_for(lambda: "waiting for step 20" in log.read_text() and "running trigger in line" in log.read_text(), 120)
    assert not out.exists()
    _save(uri, 20)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    result = json.loads(out.read_text())
    assert result["tasks"]["job"]["state"].endswith("success")
    assert result["tasks"]["job"]["xcom"] == {"checkpoint": f"{uri}/ckpt-0000000020", "step": 20}
    assert "Found checkpoint" in log.read_text()


def test_newer_than_previous_run_waits_for_a_checkpoint_the_last_run_did_not_see(
    harness: Harness, tmp_path: Path
) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    _save(uri, 10)
    dag_file = _sensor_dag(harness, "ckpt_previous", uri, newer_than="previous_run")

    first = harness.run(dag_file, "ckpt_previous", logical_date="2026-01-05T00:00:00+00:00", timeout=90)
    assert first.task()["xcom"] == {"checkpoint": f"{uri}/ckpt-0000000010", "step": 10}, first.log[-3000:]
    assert "no earlier run of this task saw a checkpoint" in first.log

    # the next week's run: step 10 is what the previous run saw, so it waits for a newer one
    proc, out, log = harness.start(dag_file, "ckpt_previous", logical_date="2026-01-12T00:00:00+00:00")
    wait_for(lambda: "waiting for step 11" in log.read_text(), 120, "the second run to wait for step 11")
    assert "an earlier run of this task saw step 10" in log.read_text()
    assert not out.exists()
    _save(uri, 15)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert json.loads(out.read_text())["tasks"]["job"]["xcom"] == {"checkpoint": f"{uri}/ckpt-0000000015", "step": 15}

    # a third run, with no new checkpoint since, does not take step 15 again: it times out
    third = harness.run(
        _sensor_dag(harness, "ckpt_previous", uri, newer_than="previous_run", timeout=2),
        "ckpt_previous",
        logical_date="2026-01-19T00:00:00+00:00",
        timeout=90,
    )
    assert third.task()["state"].endswith("failed"), third.log[-3000:]
    assert "an earlier run of this task saw step 15" in third.log
    assert "Timed out waiting for a published checkpoint" in third.log


#: the job: waits for the test's go, then publishes steps 10 and 20 through the runtime helper, slowly
JOB = """
import os, sys, time
from pathlib import Path
from gpu_provider.runtime import job_env, save_checkpoint
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
for step in (10, 20):
    with save_checkpoint(job_env().checkpoint_uri, step) as folder:
        (folder / "w.bin").write_bytes(b"x")
        time.sleep(0.5)
    print("published", step, flush=True)
"""


def test_fires_on_a_checkpoint_of_a_running_local_backend_job_not_before(harness: Harness, tmp_path: Path) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    go = tmp_path / "go"
    backend = LocalBackend(state_dir=str(harness.state_dir))
    handle = backend.submit(
        JobRequest(
            identity=JobIdentity(
                TaskKey("trainer", "train", "run-1"), try_number=1, attempt=1, capacity=names.ON_DEMAND
            ),
            command=(sys.executable, "-c", JOB, str(go)),
            env={names.ENV_CHECKPOINT_URI: uri, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            resources=GpuResources(gpus=1),
            capacity=names.ON_DEMAND,
            checkpoint_uri=uri,
        )
    )
    wait_for(lambda: backend.poll([handle])[handle.job_id].state == JobState.RUNNING, 30, "the job to run")

    dag_file = _sensor_dag(harness, "ckpt_local_job", uri, min_step=20)
    proc, out, log = harness.start(dag_file, "ckpt_local_job")
    wait_for(lambda: "No published checkpoint at" in log.read_text(), 120, "the deferred sensor to look")
    assert not out.exists() and backend.poll([handle])[handle.job_id].state == JobState.RUNNING
    go.touch()
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    xcom = json.loads(out.read_text())["tasks"]["job"]["xcom"]
    assert xcom == {"checkpoint": f"{uri}/ckpt-0000000020", "step": 20}
    assert "running trigger in line" in log.read_text(), "the sensor waited deferred"
    wait_for(lambda: backend.poll([handle])[handle.job_id].state == JobState.SUCCEEDED, 30, "the job to end")
