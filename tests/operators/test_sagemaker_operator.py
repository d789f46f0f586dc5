"""GpuJobOperator on SageMaker, what only SageMaker has: managed spot (its request fields, restarts inside
the job, its own MaxWaitTimeInSeconds), a job stopped from the console, a wait with no 30-minute limit.
Real Airflow (dag.test in a child process) or the real trigger, on the SageMaker emulator (training jobs
whose hosts run as local processes; S3 and CloudWatch Logs on moto).

What every backend does (spot fallback, crash and reattach, kill, a failing job, ...) is tested once for
all backends in tests/operators/suite/."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import ParamValidator

from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.job import GpuResources
from gpu_provider.names import RESTART_LIMIT_MARK
from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.harness import Harness, wait_for
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
    """Managed spot: SageMaker restarts the interrupted job itself; at the restart limit the provider stops it
    and resubmits on on-demand, once the stopped job has ended (the worker's wait, or deferred the trigger's, sees
    the end). Asserts the SageMaker fields of both requests (the suite asserts the rest)."""
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
    # the on-demand job was created only once the stopped one had ended (it checkpoints as it stops: both
    # nodes of the next job must resume from that checkpoint, and two jobs never bill side by side)
    client = sagemaker.emulator.client("sagemaker")
    stopped, created = (client.describe_training_job(TrainingJobName=a["name"]) for a in (first, second))
    assert stopped["TrainingJobStatus"] == "Stopped", stopped["TrainingJobStatus"]
    assert stopped["TrainingEndTime"] <= created["CreationTime"], (stopped["TrainingEndTime"], created["CreationTime"])

    # the training program's own step counter: the on-demand job started where the spot job's checkpoint was
    history = json.loads((out / "result.json").read_text())["history"]
    assert history[-1]["capacity"] == "on-demand"
    assert history[-1]["start"] == int(resumed.rsplit("ckpt-", 1)[1]) > 0, history
    assert "[algo-1] resumed from step" in run.log  # streamed, or copied once the deferred attempt ended
    if not deferrable:  # said by the wait: deferred, the trigger's log
        assert "interrupted and restarted by the service" in run.log


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
