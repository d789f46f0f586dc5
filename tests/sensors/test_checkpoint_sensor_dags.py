"""CheckpointSensor in real DAG runs (dag.test in a child process): deferred by default, and newer_than across runs."""

from __future__ import annotations

import json
from pathlib import Path

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
    wait_for(lambda: "waiting for step 20" in log.read_text() and "running trigger in line" in log.read_text(), 60)
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
    wait_for(lambda: "waiting for step 11" in log.read_text(), 60, "the second run to wait for step 11")
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
