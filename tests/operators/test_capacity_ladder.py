"""A capacity ladder across services on one checkpoint, end to end on the AWS emulators (issue 28, item 2).

The training job of the example pipeline (``gpu_provider.examples.train``) runs under
``Ladder(batch spot, sagemaker spot, sagemaker on-demand)``: its Batch spot host is reclaimed, it resumes on
SageMaker managed spot from the very checkpoint step Batch left, is reclaimed there too, and finishes on
SageMaker on-demand. The final model is compared byte for byte with an uninterrupted run. Real Airflow
(``dag.test`` in a child process), sync and deferrable; then a worker crash mid-ladder and a kill, with the
operator run as one Airflow try in a child process (tests/operators/run_try.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.testing.worlds import AwsWorld
from tests.harness import Harness, wait_for

HERE = Path(__file__).resolve().parent
RUN_TRY = HERE / "run_try.py"
TOY_JOB = HERE / "toy_job.py"
#: a run long enough to be reclaimed twice mid-training, short enough for the suite (120 steps, ~6 s in all)
TRAIN = ["--epochs", "3", "--steps-per-epoch", "40", "--batch-size", "64", "--checkpoint-every", "5"]
LADDER = """Ladder(
    LadderRung("batch", "spot"),
    LadderRung("sagemaker", "spot"),
    LadderRung("sagemaker", "on_demand"),
    backoff=0,
)"""


def _dataset(tmp: Path) -> Path:
    out = tmp / "data"
    interval = ["--start", "2026-03-01T00:00:00+00:00", "--end", "2026-03-02T00:00:00+00:00"]
    subprocess.run(
        [sys.executable, "-m", "gpu_provider.examples.preprocess", *interval, "--out", out.as_uri(), "--rows", "4000"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def _reference_model(data: Path, tmp: Path) -> Path:
    """The same training, uninterrupted, as a plain local process (one node, as every rung runs it)."""
    out = tmp / "reference"
    env = {**os.environ, "GPU_PROVIDER_CHECKPOINT_URI": (tmp / "reference-ckpt").as_uri()}
    command = [sys.executable, "-m", "gpu_provider.examples.train", "--data", data.as_uri(), "--out", str(out)]
    subprocess.run(command + TRAIN + ["--step-delay", "0"], check=True, capture_output=True, timeout=180, env=env)
    return out


def _latest_step(aws: AwsWorld, prefix: str) -> int:
    """The step of the checkpoint a ``LATEST`` under ``s3://<checkpoint bucket>/<prefix>`` names (the newest of
    them, if a run's folder below the prefix holds it); -1: none yet."""
    s3 = aws.sagemaker.emulator.client("s3")
    steps = [-1]
    try:
        listed = s3.list_objects_v2(Bucket=aws.checkpoint_bucket, Prefix=f"{prefix}/").get("Contents", [])
        for key in [o["Key"] for o in listed if o["Key"].endswith("/LATEST")]:
            body = s3.get_object(Bucket=aws.checkpoint_bucket, Key=key)["Body"].read().decode()
            steps.append(int(body.strip().rstrip("/").rsplit("-", 1)[-1]))
    except Exception:  # not there yet
        return -1
    return max(steps)


def _step_of(uri: str | None) -> int:
    assert uri and "ckpt-" in uri, uri
    return int(uri.rstrip("/").rsplit("ckpt-", 1)[1])


class Reclaimer:
    """Reclaims the spot capacity under the ladder's first two attempts once each has written a checkpoint:
    the Batch host (Batch ends the job FAILED, ``Host EC2 ... terminated``), then SageMaker's managed spot
    instances (SageMaker restarts the job inside its attempt; the ladder moves on instead)."""

    def __init__(self, aws: AwsWorld, prefix: str, name_part: str) -> None:
        self.aws, self.prefix, self.name_part = aws, prefix, name_part
        self.batch_step = -1
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Reclaimer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=5)

    def _run(self) -> None:
        try:
            batch = self.aws.batch
            spot = batch.setup.spot_queue

            def running_batch_job() -> str | None:
                jobs = batch.emulator.client("batch").list_jobs(jobQueue=spot, jobStatus="RUNNING")["jobSummaryList"]
                return next((j["jobId"] for j in jobs if self.name_part in j["jobName"]), None)

            job_id = wait_for(running_batch_job, 120, "the Batch spot attempt running")
            wait_for(lambda: _latest_step(self.aws, self.prefix) > 0, 120, "a checkpoint of the Batch attempt")
            batch.emulator.preempt(job_id)
            wait_for(lambda: batch.describe(job_id)["status"] == "FAILED", 60, "the reclaimed Batch job ended")
            self.batch_step = _latest_step(self.aws, self.prefix)

            def sagemaker_spot_job() -> str | None:
                bodies = self.aws.sagemaker.bodies("CreateTrainingJob")
                return next((b["TrainingJobName"] for b in bodies if b.get("EnableManagedSpotTraining")), None)

            name = wait_for(sagemaker_spot_job, 120, "the SageMaker managed spot attempt")
            wait_for(
                lambda: _latest_step(self.aws, self.prefix) > self.batch_step, 120, "a checkpoint on SageMaker spot"
            )
            self.aws.sagemaker.emulator.interrupt(name)
        except BaseException as err:  # the test reports it
            self.error = err


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_training_interrupted_on_batch_spot_resumes_on_sagemaker_spot_then_on_demand_bit_exact(
    deferrable: bool, harness: Harness, gpu_aws: AwsWorld
) -> None:
    data = _dataset(harness.tmp)
    reference = _reference_model(data, harness.tmp)
    dag_id = f"ladder_{'defer' if deferrable else 'sync'}"
    prefix = f"ladder/{uuid.uuid4().hex[:8]}"
    checkpoint = f"s3://{gpu_aws.checkpoint_bucket}/{prefix}"
    out = harness.tmp / "model"
    command = [sys.executable, "-m", "gpu_provider.examples.train", "--data", data.as_uri(), "--out", str(out)]
    dag = harness.write_dag(
        dag_id,
        f"""
        from gpu_provider import Ladder, LadderRung
        GpuJobOperator(
            task_id="job",
            image="trainer:1",
            command={command + TRAIN + ["--step-delay", "0.05"]!r},
            resources=GpuResources(gpus=1),
            capacity={LADDER},
            checkpoint="{checkpoint}",
            deferrable={deferrable},
            poll_interval=0.3,
        )
        """,
    )
    with Reclaimer(gpu_aws, prefix, dag_id.replace("_", "-")) as reclaimer:
        run = harness.run(dag, dag_id, extra_env=gpu_aws.env(), timeout=300)
    assert reclaimer.error is None, reclaimer.error
    task = run.task()
    assert task["state"] == "success", run.log[-6000:]
    result = task["xcom"]

    # three attempts on two services, each where the ladder put it
    attempts = result["attempts"]
    assert [(a["backend"], a["service"], a["rung"], a["capacity"]) for a in attempts] == [
        ("batch", "AWS Batch", 0, "spot"),
        ("sagemaker", "Amazon SageMaker", 1, "spot"),
        ("sagemaker", "Amazon SageMaker", 2, "on-demand"),
    ], attempts
    assert [(a["state"], a["interruption"]) for a in attempts] == [
        ("PREEMPTED", "preempted"),
        ("CANCELLED", "preempted"),
        ("SUCCEEDED", None),
    ], attempts
    assert attempts[1]["restarts"] == 1 and "backend_spec" not in attempts[0]
    assert (result["backend"], result["backends"], result["interruptions"]) == ("sagemaker", ["batch", "sagemaker"], 2)
    # each attempt priced on its own service: an EC2 instance for the Batch attempt, SageMaker's ml. ones after it
    prices = [(a["price"] or {}).get("instance_type", "") for a in attempts]
    assert not prices[0].startswith("ml.") and all(p.startswith("ml.") for p in prices[1:]), prices

    # one checkpoint for every rung: SageMaker spot resumed from the step Batch left, on-demand from a later one
    assert _step_of(attempts[0]["resume_from"] if attempts[0]["resume_from"] else "ckpt-0") == 0
    assert _step_of(attempts[1]["resume_from"]) == reclaimer.batch_step > 0
    assert _step_of(attempts[2]["resume_from"]) > reclaimer.batch_step
    creates = gpu_aws.sagemaker.bodies("CreateTrainingJob")
    assert [b["CheckpointConfig"]["S3Uri"] for b in creates] == [checkpoint, checkpoint]
    assert [b["EnableManagedSpotTraining"] for b in creates] == [True, False]
    (submit,) = gpu_aws.batch.bodies("SubmitJob")
    assert submit["jobQueue"] == gpu_aws.batch.setup.spot_queue
    # each attempt was stopped on its own service: the SageMaker spot job by StopTrainingJob, nothing on Batch
    assert gpu_aws.sagemaker.bodies("StopTrainingJob") == [{"TrainingJobName": attempts[1]["name"]}]
    assert gpu_aws.batch.bodies("TerminateJob") == []

    assert "resubmitting on sagemaker spot (ladder rung 1) (attempt 2" in run.log
    assert "resubmitting on sagemaker on-demand (ladder rung 2) (attempt 3" in run.log
    # resume across services is exact: the model is the uninterrupted run's, byte for byte
    for name in ("model.npz", "metrics.json"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


# ------------------------------------------------------------------------------------- one try at a time


def _start_try(harness: Harness, spec: dict[str, Any], name: str, env: dict[str, str]) -> tuple[Any, Path]:
    out = harness.tmp / f"{name}.json"
    proc = subprocess.Popen(
        [sys.executable, str(RUN_TRY), json.dumps(spec), str(out)],
        env={**os.environ, **env},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(harness.tmp / f"{name}.log", "w"),  # noqa: SIM115 - closed with the process
    )
    wait_for(lambda: out.with_name(out.name + ".pid-ready").exists(), 120, f"{name} ready")
    return proc, out


def _try_spec(harness: Harness, aws: AwsWorld, try_number: int, prefix: str) -> dict[str, Any]:
    return {
        "state_dir": str(harness.state_dir),
        "command": [sys.executable, str(TOY_JOB), "--steps", "60", "--delay", "0.1", "--out", str(harness.tmp / "o")],
        "try_number": try_number,
        "store": str(harness.tmp / "store.json"),
        "run_id": "ladder-run",
        "poll_interval": 0.3,
        "image": "trainer:1",
        "checkpoint": f"s3://{aws.checkpoint_bucket}/{prefix}",
        "ladder": [{"backend": "batch", "capacity": "spot"}, {"backend": "sagemaker", "capacity": "on_demand"}],
    }


def _to_sagemaker(aws: AwsWorld) -> str:
    """Reclaim the Batch spot attempt once it runs; the name of the SageMaker attempt that follows, once it runs."""
    spot = aws.batch.setup.spot_queue

    def running() -> str | None:
        jobs = aws.batch.emulator.client("batch").list_jobs(jobQueue=spot, jobStatus="RUNNING")["jobSummaryList"]
        return jobs[0]["jobId"] if jobs else None

    aws.batch.emulator.preempt(wait_for(running, 120, "the Batch spot attempt running"))
    name = wait_for(
        lambda: next((b["TrainingJobName"] for b in aws.sagemaker.bodies("CreateTrainingJob")), None),
        120,
        "the SageMaker attempt",
    )
    wait_for(lambda: aws.sagemaker.describe(name)["SecondaryStatus"] == "Training", 120, "SageMaker training")
    return str(name)


@pytest.mark.parametrize("store", ["kept", "lost"])
def test_a_worker_crash_mid_ladder_reattaches_to_the_attempt_on_its_own_service(
    store: str, harness: Harness, gpu_aws: AwsWorld
) -> None:
    """Try 1 is SIGKILLed while attempt 2 trains on SageMaker; try 2 reattaches to that training job, read from
    SageMaker (from the stored record, or, with the store lost, by asking every rung's backend): no second job."""
    env = gpu_aws.env()
    prefix = f"ladder-crash/{uuid.uuid4().hex[:8]}"
    first, _ = _start_try(harness, _try_spec(harness, gpu_aws, 1, prefix), "try1", env)
    name = _to_sagemaker(gpu_aws)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    if store == "lost":
        (harness.tmp / "store.json").unlink()
    second, out = _start_try(harness, _try_spec(harness, gpu_aws, 2, prefix), "try2", env)
    assert second.wait(240) == 0
    result = json.loads(out.read_text())
    assert result["state"] == "success", result
    attempts = result["xcom"]["attempts"]
    assert [(a["backend"], a["capacity"], a["state"]) for a in attempts] == [
        ("batch", "spot", "PREEMPTED"),
        ("sagemaker", "on-demand", "SUCCEEDED"),
    ], attempts
    assert attempts[1]["name"] == name and attempts[1]["owner_try"] == 2
    assert [b["TrainingJobName"] for b in gpu_aws.sagemaker.bodies("CreateTrainingJob")] == [name]
    assert len(gpu_aws.batch.bodies("SubmitJob")) == 1


def test_on_kill_mid_ladder_stops_the_attempt_on_its_own_service(harness: Harness, gpu_aws: AwsWorld) -> None:
    env = gpu_aws.env()
    prefix = f"ladder-kill/{uuid.uuid4().hex[:8]}"
    proc, out = _start_try(harness, _try_spec(harness, gpu_aws, 1, prefix), "try1", env)
    name = _to_sagemaker(gpu_aws)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    assert json.loads(out.read_text())["state"] == "failed"
    assert gpu_aws.sagemaker.bodies("StopTrainingJob") == [{"TrainingJobName": name}]
    wait_for(lambda: gpu_aws.sagemaker.describe(name)["TrainingJobStatus"] == "Stopped", 60, "the job stopped")
    assert gpu_aws.batch.bodies("TerminateJob") == []  # the Batch attempt had ended: nothing was sent there


def test_a_rung_in_another_region_submits_watches_and_stops_through_its_own_connection(
    harness: Harness, gpu_aws: AwsWorld
) -> None:
    """Managed spot in the default region, then on-demand in us-west-2 through the ``aws_west`` connection (its
    own credentials, told apart by the emulator): every call about the second attempt goes through that
    connection, every call about the first through ``aws_default``."""
    sagemaker = gpu_aws.sagemaker
    west = {
        "conn_type": "aws",
        "login": "WESTKEY",
        "password": "west-secret",
        "extra": {"endpoint_url": sagemaker.emulator.endpoint_url, "region_name": "us-west-2"},
    }
    dag_id = "ladder_region"
    prefix = f"ladder-region/{uuid.uuid4().hex[:8]}"
    out = harness.tmp / "out"
    sagemaker.emulator.interrupt_after(1.0, name_contains="ladder-region", checkpointed=True)
    dag = harness.write_dag(
        dag_id,
        f"""
        from gpu_provider import Ladder, LadderRung
        GpuJobOperator(
            task_id="job",
            image="trainer:1",
            command={harness.toy_command(str(out), 30, 0.1)},
            capacity=Ladder(
                LadderRung("sagemaker", "spot"),
                LadderRung("sagemaker", "on_demand", aws_conn_id="aws_west", region_name="us-west-2"),
                backoff=0,
            ),
            checkpoint="s3://{gpu_aws.checkpoint_bucket}/{prefix}",
            deferrable=False,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, dag_id, extra_env={**gpu_aws.env(), "AIRFLOW_CONN_AWS_WEST": json.dumps(west)}, timeout=240)
    task = run.task()
    assert task["state"] == "success", run.log[-6000:]
    first, second = task["xcom"]["attempts"]
    assert (first["region"], first["capacity"], first["interruption"]) == (None, "spot", "preempted"), first
    assert (second["region"], second["capacity"], second["state"]) == ("us-west-2", "on-demand", "SUCCEEDED")
    assert _step_of(second["resume_from"]) > 0  # the one checkpoint, read in the other region

    def signers(action: str, name: str) -> set[str]:
        return {
            r["client"]
            for r in sagemaker.emulator.requests(action)
            if not r["throttled"] and r["body"].get("TrainingJobName") == name
        }

    assert signers("CreateTrainingJob", second["name"]) == {"WESTKEY"}
    assert signers("DescribeTrainingJob", second["name"]) == {"WESTKEY"}
    assert signers("CreateTrainingJob", first["name"]) == signers("StopTrainingJob", first["name"]) == {"testing"}


# ------------------------------------------------------- one policy: instance fallback + ladder + back to spot

SM_TYPES = ("ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.g6e.48xlarge")


def test_a_rung_tries_its_instance_types_in_order_then_a_reclaim_moves_to_the_next_rung(
    harness: Harness, gpu_aws: AwsWorld
) -> None:
    """``Ladder(..., instances=InstanceFallback(...))``: the first rung's first two types have no spot capacity, so
    it runs on its third; SageMaker reclaims that one, and the next rung (on-demand) runs it to the end."""
    sagemaker = gpu_aws.sagemaker
    for held in SM_TYPES[:2]:
        sagemaker.emulator.hold("spot", instance_type=held)
    sagemaker.emulator.interrupt_after(0.3, name_contains="ladder-types", checkpointed=True)
    release = harness.tmp / "release"  # the spot attempt holds after its last step: the reclaim always finds it

    def release_once_on_demand() -> None:
        wait_for(
            lambda: any(not b.get("EnableManagedSpotTraining") for b in sagemaker.bodies("CreateTrainingJob")),
            120,
            "the on-demand attempt",
        )
        release.touch()

    releaser = threading.Thread(target=release_once_on_demand, daemon=True)
    releaser.start()
    dag_id = "ladder_types"
    out = harness.tmp / "out"
    dag = harness.write_dag(
        dag_id,
        f"""
        from gpu_provider import InstanceFallback, Ladder, LadderRung
        GpuJobOperator(
            task_id="job",
            image="trainer:1",
            command={harness.toy_command(str(out), 10, 0.05, "--hold-until", str(release))},
            capacity=Ladder(
                LadderRung("sagemaker", "spot", instance_types={list(SM_TYPES)!r}),
                LadderRung("sagemaker", "on_demand", instance_types={list(SM_TYPES[2:])!r}),
                instances=InstanceFallback(capacity_wait=60),
                spot_wait_timeout=1.0,
                backoff=0,
            ),
            checkpoint="s3://{gpu_aws.checkpoint_bucket}/ladder-types/{uuid.uuid4().hex[:8]}",
            deferrable=False,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, dag_id, extra_env=gpu_aws.env(), timeout=240)
    releaser.join(timeout=10)
    task = run.task()
    assert task["state"] == "success", run.log[-6000:]
    result = task["xcom"]
    attempts = result["attempts"]
    assert [(a["rung"], a["capacity"], a["instance_choice"], a["interruption"]) for a in attempts] == [
        (0, "spot", SM_TYPES[0], "capacity_timeout"),
        (0, "spot", SM_TYPES[1], "capacity_timeout"),
        (0, "spot", SM_TYPES[2], "preempted"),
        (1, "on-demand", SM_TYPES[2], None),
    ], attempts
    assert attempts[-1]["state"] == "SUCCEEDED" and result["interruptions"] == 3
    bodies = sagemaker.bodies("CreateTrainingJob")
    assert [(b["ResourceConfig"]["InstanceType"], b["EnableManagedSpotTraining"]) for b in bodies] == [
        (SM_TYPES[0], True),
        (SM_TYPES[1], True),
        (SM_TYPES[2], True),
        (SM_TYPES[2], False),
    ]
    assert _step_of(attempts[-1]["resume_from"]) > 0  # the reclaimed type's checkpoint, read on the next rung
    assert "resubmitting on sagemaker spot (ladder rung 0) (attempt 2" in run.log
    assert "resubmitting on sagemaker on-demand (ladder rung 1) (attempt 4" in run.log


SPOT_TYPE = "p4d.24xlarge"  # 32.7726 USD/h on-demand in us-east-1 (the shipped price table)


def test_an_on_demand_rung_moves_back_to_the_batch_spot_rung_when_spot_scores_rise(
    harness: Harness, gpu_aws: AwsWorld, ec2_spot_emulator: Any
) -> None:
    """``Ladder(batch spot, sagemaker on-demand, spot_return=SpotReturn(...))``: the Batch spot attempt is
    reclaimed, SageMaker on-demand takes over; when the EC2 emulator's spot scores rise, the on-demand attempt
    checkpoints and stops (a planned move, with its saving), and the job resumes on Batch spot at that very step."""
    from gpu_provider.testing.worlds import aws_connection_env

    ec2 = ec2_spot_emulator
    ec2.reset()
    ec2.set_price("us-east-1", "us-east-1a", SPOT_TYPE, 11.5)
    batch, sagemaker = gpu_aws.batch, gpu_aws.sagemaker
    prefix = f"ladder-back/{uuid.uuid4().hex[:8]}"
    release = harness.tmp / "release"  # every attempt holds after its last step until the job is back on spot
    steps: dict[str, int] = {}

    def spot_jobs(status: str) -> list[str]:
        listed = batch.emulator.client("batch").list_jobs(jobQueue=batch.setup.spot_queue, jobStatus=status)
        return [j["jobId"] for j in listed["jobSummaryList"]]

    def drive() -> None:
        try:
            first = wait_for(lambda: (spot_jobs("RUNNING") or [None])[0], 120, "the Batch spot attempt running")
            wait_for(lambda: _latest_step(gpu_aws, prefix) > 0, 120, "a checkpoint on Batch")
            batch.emulator.preempt(first)
            wait_for(lambda: batch.describe(first)["status"] == "FAILED", 60, "the reclaimed Batch job ended")
            steps["batch"] = _latest_step(gpu_aws, prefix)
            name = wait_for(
                lambda: next((b["TrainingJobName"] for b in sagemaker.bodies("CreateTrainingJob")), None),
                120,
                "the SageMaker on-demand attempt",
            )
            wait_for(lambda: _latest_step(gpu_aws, prefix) > steps["batch"], 120, "a checkpoint on SageMaker")
            ec2.set_scores({"us-east-1": 9})  # spot returns
            wait_for(lambda: sagemaker.describe(name)["TrainingJobStatus"] == "Stopped", 120, "the move's stop")
            wait_for(lambda: [j for j in spot_jobs("RUNNING") if j != first], 120, "the job back on Batch spot")
        finally:
            release.touch()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    dag_id = "ladder_back"
    out = harness.tmp / "out"
    spot_return = (
        f"SpotReturn(check_every=0.5, instance_types=[{SPOT_TYPE!r}], regions=['us-east-1'], aws_conn_id='aws_spot', "
        "expected_runtime=3600, min_remaining=60, cooldown=0)"
    )
    dag = harness.write_dag(
        dag_id,
        f"""
        from gpu_provider import Ladder, LadderRung, SpotReturn
        GpuJobOperator(
            task_id="job",
            image="trainer:1",
            command={harness.toy_command(str(out), 20, 0.05, "--hold-until", str(release))},
            capacity=Ladder(
                LadderRung("batch", "spot"),
                LadderRung("sagemaker", "on_demand"),
                spot_return={spot_return},
                backoff=0,
            ),
            checkpoint="s3://{gpu_aws.checkpoint_bucket}/{prefix}",
            deferrable=True,
            poll_interval=0.3,
        )
        """,
    )
    env = aws_connection_env(ec2.endpoint_url, ec2.region, "aws_spot")
    env.pop("AWS_DEFAULT_REGION", None)  # the world's own region stays
    try:
        run = harness.run(dag, dag_id, extra_env={**env, **gpu_aws.env()}, timeout=240)
    finally:
        release.touch()
        driver.join(timeout=10)
        scores = ec2.requests("GetSpotPlacementScores")
        ec2.reset()
    task = run.task()
    assert task["state"] == "success", run.log[-6000:]
    result = task["xcom"]
    attempts = result["attempts"]
    # three attempts on two services, each on the rung the policy chose: back to rung 0 after the move
    assert [(a["rung"], a["backend"], a["service"], a["capacity"], a["interruption"]) for a in attempts] == [
        (0, "batch", "AWS Batch", "spot", "preempted"),
        (1, "sagemaker", "Amazon SageMaker", "on-demand", "moved_to_spot"),
        (0, "batch", "AWS Batch", "spot", None),
    ], attempts
    assert attempts[-1]["state"] == "SUCCEEDED" and result["backends"] == ["batch", "sagemaker"]
    assert (result["interruptions"], result["moves_to_spot"]) == (1, 1)  # the move is planned, not counted
    move = attempts[1]["spot_return"]
    assert (move["score"], move["spot_usd_per_hour"], move["instance_type"]) == (9, 11.5, SPOT_TYPE), move
    assert move["saving_usd"] > 0 and result["spot_return_saving_usd"] == move["saving_usd"]
    # Batch spot resumed at the exact step SageMaker checkpointed when asked to stop
    moved_at = _step_of(attempts[2]["resume_from"])
    assert moved_at > steps["batch"] > 0 and _step_of(attempts[1]["resume_from"]) == steps["batch"]
    history = json.loads((out / "result.json").read_text())["history"]
    assert [(h["attempt"], h["start"]) for h in history] == [(1, 0), (2, steps["batch"]), (3, moved_at)], history
    assert [b["jobQueue"] for b in batch.bodies("SubmitJob")] == [batch.setup.spot_queue] * 2
    assert "Moving back to spot: resubmitting on batch spot (ladder rung 0) (attempt 3, planned move 1" in run.log
    # the readings: the spot rung's instance type, in its region, only while the attempt ran on on-demand
    assert scores and {(r["body"]["InstanceType.1"], r["body"]["RegionName.1"]) for r in scores} == {
        (SPOT_TYPE, "us-east-1")
    }
