"""GpuJobOperator on SageMaker end to end: real Airflow (dag.test in a child process), the SageMaker
emulator (training jobs whose hosts run as local processes; S3 and CloudWatch Logs on moto), asserting
the requests that reached the server and what the tasks returned."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import ParamValidator

from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.backends.sagemaker.backend import TAG_STOP_REASON
from gpu_provider.job import GpuResources
from gpu_provider.names import CANCEL_PREFIX, RESTART_LIMIT_MARK
from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.harness import Harness, pid_alive, wait_for
from tests.sagemaker_world import CHECKPOINT_BUCKET, SageMakerWorld


def _pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}


def _valid_create(body: dict[str, object]) -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateTrainingJob").input_shape
    report = ParamValidator().validate(body, shape)
    assert not report.has_errors(), report.generate_report()


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_two_node_spot_job_interrupted_once_resumes_on_demand_from_its_checkpoint(
    harness: Harness, sagemaker: SageMakerWorld, deferrable: bool
) -> None:
    dag_id = f"sm_fallback_{'def' if deferrable else 'sync'}"
    out = harness.tmp / "out"
    checkpoint = f"s3://{CHECKPOINT_BUCKET}/{dag_id}"
    sagemaker.emulator.interrupt_after(1.5, name_contains=dag_id.replace("_", "-")[:14])
    dag = harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend={sagemaker.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 16, 0.2)},
            resources=GpuResources(gpus=1, nodes=2, gpu_type="a10g"),
            capacity=SpotFallback(after_preemptions=1, backoff=0),
            checkpoint="{checkpoint}",
            deferrable={deferrable},
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    result = task["xcom"]
    first, second = result["attempts"]
    assert (first["capacity"], first["state"], first["interruption"], first["restarts"]) == (
        "spot",
        "CANCELLED",
        "preempted",
        1,
    ), first
    assert first["reason"].startswith(RESTART_LIMIT_MARK) and "spot interruption" in first["reason"], first
    assert (second["capacity"], second["state"], second["restarts"]) == ("on-demand", "SUCCEEDED", 0), second
    assert result["interruptions"] == 1
    for attempt in (first, second):
        assert attempt["instance_type"] == "ml.g5.xlarge" and attempt["billable_seconds"] is not None, attempt
        assert attempt["training_seconds"] is not None and attempt["spot_saving_pct"] is not None, attempt
    assert second["output_uri"].endswith(f"/{second['name']}/output/model.tar.gz") or second["output_uri"].startswith(
        "file://"
    )

    # what reached the server: two CreateTrainingJob, the same checkpoint location, the second on-demand
    spot_body, on_demand_body = sagemaker.bodies("CreateTrainingJob")
    for body in (spot_body, on_demand_body):
        _valid_create(body)
        assert body["CheckpointConfig"] == {"S3Uri": checkpoint, "LocalPath": "/opt/ml/checkpoints"}
        assert body["ResourceConfig"]["InstanceCount"] == 2
        assert body["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
        assert body["Environment"]["GPU_PROVIDER_CHECKPOINT_URI"] == "file:///opt/ml/checkpoints"
    assert spot_body["EnableManagedSpotTraining"] is True
    assert (
        spot_body["StoppingCondition"]["MaxWaitTimeInSeconds"] > spot_body["StoppingCondition"]["MaxRuntimeInSeconds"]
    )
    assert on_demand_body["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in on_demand_body["StoppingCondition"]
    assert on_demand_body["Environment"]["GPU_PROVIDER_CAPACITY"] == "on-demand"
    resumed = on_demand_body["Environment"]["GPU_PROVIDER_RESUME_FROM"]
    assert resumed.startswith("file:///opt/ml/checkpoints/ckpt-"), resumed
    (stop,) = sagemaker.bodies("StopTrainingJob")
    assert stop == {"TrainingJobName": first["name"]}

    # the training program's own step counter: the on-demand job started where the spot job's checkpoint was
    history = json.loads((out / "result.json").read_text())["history"]
    assert history[-1]["capacity"] == "on-demand"
    assert history[-1]["start"] == int(resumed.rsplit("ckpt-", 1)[1]) > 0, history
    assert "[algo-1] resumed from step" in run.log or deferrable  # the log of a deferred attempt ends up later
    assert "interrupted and restarted by the service" in run.log or deferrable


def test_spot_capacity_sagemaker_gave_up_on_resubmits_on_demand(harness: Harness, sagemaker: SageMakerWorld) -> None:
    sagemaker.emulator.hold("spot")  # no spot capacity comes
    sagemaker.emulator.wait_clock(100.0)  # MaxWaitTimeInSeconds = 60 + 300 s pass in about 4 s
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "sm_max_wait",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={sagemaker.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 2, 0.05)},
            capacity=SpotFallback(spot_wait_timeout=300, backoff=0),
            max_runtime=timedelta(seconds=60),
            checkpoint="s3://{CHECKPOINT_BUCKET}/sm_max_wait",
            deferrable=True,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "sm_max_wait")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["state"], first["interruption"]) == ("spot", "CANCELLED", "capacity_timeout")
    assert "MaxWaitTimeExceeded" in first["reason"] or "MaxWaitTimeInSeconds" in first["reason"], first
    assert (second["capacity"], second["state"]) == ("on-demand", "SUCCEEDED")
    spot_body, _ = sagemaker.bodies("CreateTrainingJob")
    assert spot_body["StoppingCondition"] == {"MaxRuntimeInSeconds": 60, "MaxWaitTimeInSeconds": 360}
    assert sagemaker.bodies("StopTrainingJob") == [], "SageMaker itself gave the spot job up"


def test_a_failing_program_fails_the_task_with_sagemakers_failure_reason(
    harness: Harness, sagemaker: SageMakerWorld
) -> None:
    dag = harness.write_dag(
        "sm_failing",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={sagemaker.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / "out"), 6, 0.05, "--fail-on-attempt", "1")},
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "sm_failing")
    assert run.task()["state"] == "failed", run.log[-4000:]
    assert "ended FAILED: AlgorithmError: , exit code: 3 (exit code 3)" in run.log, run.log[-4000:]
    assert "failing on purpose" in run.log  # the job's own last lines reached the task log


def test_a_job_stopped_outside_airflow_cancels_the_task_with_a_clear_message(
    harness: Harness, sagemaker: SageMakerWorld
) -> None:
    pid_dir = harness.tmp / "pids"
    dag = harness.write_dag(
        "sm_stopped",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={sagemaker.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / "out"), 300, 0.2)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            poll_interval=0.3,
        )
        """,
    )
    worker, _out, log = harness.start(dag, "sm_stopped")
    wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the training job to start")
    (create,) = sagemaker.bodies("CreateTrainingJob")
    sagemaker.emulator.client("sagemaker").stop_training_job(TrainingJobName=create["TrainingJobName"])
    worker.wait(timeout=60)
    text = log.read_text()
    assert "was CANCELLED: stopped outside Airflow" in text, text[-4000:]
    assert "clear the task to run it again" in text


def test_worker_crash_then_retry_reattaches_without_a_second_create(
    harness: Harness, sagemaker: SageMakerWorld
) -> None:
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = harness.write_dag(
        "sm_crash",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={sagemaker.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 600, 0.15)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            checkpoint="s3://{CHECKPOINT_BUCKET}/sm_crash",
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    worker, _, _ = harness.start(dag, "sm_crash")
    job_pid = wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the training job to start")
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies; the training job does not
    worker.wait(timeout=10)
    assert pid_alive(job_pid)

    run = harness.run(dag, "sm_crash")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    assert "Reattaching to sagemaker job" in run.log, run.log[-6000:]
    assert len(sagemaker.bodies("CreateTrainingJob")) == 1, "the retry must not create a second training job"
    assert len(task["xcom"]["attempts"]) == 1


def test_killing_a_running_task_stops_its_training_job(harness: Harness, sagemaker: SageMakerWorld) -> None:
    pid_dir = harness.tmp / "pids"
    dag = harness.write_dag(
        "sm_kill",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={sagemaker.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / "out"), 300, 0.2)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    worker, _, _ = harness.start(dag, "sm_kill")
    job_pid = wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the training job to start")
    worker.send_signal(signal.SIGTERM)  # what Airflow sends a task it kills
    (stop,) = wait_for(lambda: sagemaker.bodies("StopTrainingJob"), 15, "StopTrainingJob")
    tags = [t for body in sagemaker.bodies("AddTags") for t in body["Tags"] if t["Key"] == TAG_STOP_REASON]
    assert tags and tags[-1]["Value"].startswith(CANCEL_PREFIX + "Airflow task sm_kill.job of run ")
    wait_for(lambda: not pid_alive(job_pid), 15, "the host process to stop")
    worker.wait(timeout=30)
    # Stopping -> Stopped happens on the service's own time, as on AWS: wait for it rather than read once
    wait_for(
        lambda: sagemaker.describe(stop["TrainingJobName"])["TrainingJobStatus"] == "Stopped",
        30,
        "the training job to reach Stopped",
    )


def test_killing_a_deferred_task_stops_its_training_job(sagemaker: SageMakerWorld) -> None:
    backend = SageMakerBackend(**sagemaker.options)
    identity = JobIdentity(TaskKey("sm_deferred", "train", "manual__1"), try_number=1, attempt=1, capacity="on-demand")
    handle = backend.submit(
        JobRequest(
            identity, (sys.executable, "-c", "import time; time.sleep(60)"), {}, GpuResources(), "on-demand", image="x"
        )
    )
    trigger = GpuJobTrigger(
        backend=backend.spec(),
        handle=handle.to_dict(),
        poll_interval=0.3,
        task_label="Airflow task sm_deferred.train of run manual__1",
    )

    async def wait_then_kill() -> None:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(1.0)
        assert not waiting.done()
        waiting.cancel()
        await trigger.on_kill()

    asyncio.run(wait_then_kill())
    assert sagemaker.bodies("StopTrainingJob") == [{"TrainingJobName": handle.job_id}]
    status = backend.poll([handle])[handle.job_id]
    assert not isinstance(status, Exception)
    assert status.reason == "Airflow task sm_deferred.train of run manual__1 was killed while deferred", status


def test_a_training_job_running_longer_than_30_minutes_is_not_given_up(sagemaker: SageMakerWorld) -> None:
    """A deferred wait has no timer beyond the job's own limits (the amazon operator's gives up after 30 min)."""
    backend = SageMakerBackend(**sagemaker.options)
    identity = JobIdentity(TaskKey("sm_long", "train", "manual__1"), try_number=1, attempt=1, capacity="spot")
    command = (sys.executable, "-c", "import time; time.sleep(4)")
    handle = backend.submit(JobRequest(identity, command, {}, GpuResources(), "spot", image="x", capacity_wait_s=600))
    wait_for(lambda: sagemaker.describe(handle.job_id)["SecondaryStatus"] == "Training", 30, "training to start")
    sagemaker.emulator.backdate(handle.job_id, 45 * 60)  # by its own clock, it has trained for 45 minutes
    long_ago = handle.to_dict() | {"submitted_at": handle.submitted_at - 45 * 60}
    trigger = GpuJobTrigger(
        backend=backend.spec(), handle=long_ago, poll_interval=0.3, spot_wait_timeout=600, stream_logs=False
    )

    async def first_event() -> dict[str, object]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    event = asyncio.run(asyncio.wait_for(first_event(), 60))
    assert event["status"] == "succeeded", event
    status = event["job_status"]
    assert isinstance(status, dict) and status["started_at"] < handle.submitted_at - 40 * 60, status
    assert status["billable_seconds"] >= 45 * 60 * 0.3 - 1, status  # spot: 30% of the training time billed
