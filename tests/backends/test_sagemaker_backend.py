"""The SageMaker backend on its own: the request it builds (checked against botocore's model), the
instance table, the state table fed every state, and against the emulator: adoption of a lost
CreateTrainingJob, list_owned, and the cost of many waiting attempts under throttling."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import botocore.session
import pytest
from botocore.validate import ParamValidator

from gpu_provider import names
from gpu_provider.backends.aws.status import VISIBILITY_GRACE_S
from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, JobState, JobStatus, TaskKey
from gpu_provider.backends.common import END_OF_LOG_COMMAND
from gpu_provider.backends.sagemaker import INSTANCE_TABLE, STATE_TABLE, SageMakerBackend, mapping, status
from gpu_provider.exceptions import GpuJobStatusError
from gpu_provider.job import GpuResources
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.sagemaker_world import CHECKPOINT_BUCKET, SageMakerWorld

ROLE = "arn:aws:iam::123456789012:role/gpu-sagemaker-job"
OPTIONS = {"role_arn": ROLE, "output_path": "s3://models/out"}


def _request(
    *,
    nodes: int = 1,
    gpus: float = 1,
    gpu_type: str | None = None,
    capacity: str = names.SPOT,
    run_id: str = "manual__2026-01-05T00:00:00+00:00",
    **kwargs: Any,
) -> JobRequest:
    identity = JobIdentity(TaskKey("train_dag", "train", run_id), 1, 1, capacity, "ml")
    return JobRequest(
        identity=identity,
        command=("python", "-m", "trainer", "--epochs", "3"),
        env={names.ENV_ATTEMPT: "1", names.ENV_CAPACITY: capacity, "LR": "0.1"},
        resources=GpuResources(gpus=gpus, nodes=nodes, gpu_type=gpu_type),
        capacity=capacity,
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1",
        **kwargs,
    )


def test_the_request_of_a_two_node_spot_job_validates_against_botocore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret-value")  # the worker's: never in a request
    backend = SageMakerBackend(
        **OPTIONS, subnets="subnet-0abc,subnet-0def", security_group_ids=["sg-0abc"], kms_key_id="k1"
    )
    body = backend.create_body(
        _request(
            nodes=2,
            gpus=8,
            gpu_type="a100",
            max_runtime_s=3600,
            capacity_wait_s=900,
            checkpoint_uri="s3://ckpts/train_dag/train",
            resume_from="s3://ckpts/train_dag/train/ckpt-0000000040",
        )
    )
    model = botocore.session.get_session().get_service_model("sagemaker")
    report = ParamValidator().validate(body, model.operation_model("CreateTrainingJob").input_shape)
    assert not report.has_errors(), report.generate_report()

    assert body["ResourceConfig"] == {
        "InstanceType": "ml.p4d.24xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 100,
        "VolumeKmsKeyId": "k1",
    }
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 4500}
    assert body["EnableManagedSpotTraining"] is True and body["EnableNetworkIsolation"] is False
    assert body["CheckpointConfig"] == {"S3Uri": "s3://ckpts/train_dag/train", "LocalPath": "/opt/ml/checkpoints"}
    assert body["OutputDataConfig"] == {"S3OutputPath": "s3://models/out", "KmsKeyId": "k1"}
    assert body["VpcConfig"] == {"SecurityGroupIds": ["sg-0abc"], "Subnets": ["subnet-0abc", "subnet-0def"]}
    env = body["Environment"]
    assert env[names.ENV_CHECKPOINT_URI] == "file:///opt/ml/checkpoints"
    assert env[names.ENV_RESUME_FROM] == "file:///opt/ml/checkpoints/ckpt-0000000040"
    assert (env["NNODES"], env["MASTER_PORT"], env["LR"]) == ("2", "29500", "0.1")
    assert "NODE_RANK" not in env  # the entry derives it on each host from resourceconfig.json
    entry = body["AlgorithmSpecification"]
    assert entry["ContainerEntrypoint"] == ["/bin/sh"]
    assert entry["ContainerArguments"][2:] == [
        "gpu-provider-entry",
        *END_OF_LOG_COMMAND,  # marks the end of each node's log
        "python",
        "-m",
        "trainer",
        "--epochs",
        "3",
    ]
    tags = {t["Key"]: t["Value"] for t in body["Tags"]}
    assert tags[names.TAG_CAPACITY] == "spot" and tags[names.TAG_TEAM] == "ml" and tags[names.TAG_GPUS] == "16"
    assert tags[names.TAG_RUN_ID] == "manual__2026-01-05T00:00:00+00:00"
    assert "worker-secret-value" not in json.dumps(body)


def test_an_on_demand_single_node_job_has_no_spot_fields_and_a_plain_entry() -> None:
    body = SageMakerBackend(**OPTIONS).create_body(_request(capacity=names.ON_DEMAND))
    assert body["EnableManagedSpotTraining"] is False and "CheckpointConfig" not in body and "VpcConfig" not in body
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 28 * 24 * 3600}
    assert body["AlgorithmSpecification"]["ContainerEntrypoint"] == ["python"]
    assert body["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    assert (body["Environment"]["NODE_RANK"], body["Environment"]["MASTER_ADDR"]) == ("0", "127.0.0.1")


def test_requests_the_service_would_refuse_are_refused_with_the_field_named() -> None:
    backend = SageMakerBackend(**OPTIONS)
    with pytest.raises(ValueError, match=r"command\[2\] is 300 characters long; SageMaker allows 256"):
        backend.create_body(_request().__class__(**{**_request().__dict__, "command": ("python", "-c", "x" * 300)}))
    with pytest.raises(Exception, match="SageMaker copies checkpoints to and from S3 only"):
        backend.create_body(_request(checkpoint_uri="file:///tmp/ckpt"))
    with pytest.raises(Exception, match="needs role_arn="):
        SageMakerBackend(output_path="s3://models/out").create_body(_request())
    with pytest.raises(ValueError, match="both"):
        SageMakerBackend(**OPTIONS, subnets=["subnet-1"])
    with pytest.raises(ValueError, match="is not an IAM role ARN"):
        SageMakerBackend(role_arn="gpu-role")


def test_the_instance_table_and_its_refusals_at_parse_time() -> None:
    backend = SageMakerBackend(**OPTIONS)
    assert backend.instance_type_for(GpuResources(gpus=8, gpu_type="h100")) == "ml.p5.48xlarge"
    assert backend.instance_type_for(GpuResources(gpus=1, gpu_type="a10g")) == "ml.g5.xlarge"
    assert backend.instance_type_for(GpuResources(gpus=4)) == "ml.g5.12xlarge"
    assert backend.instance_type_for(GpuResources(gpus=1, instance_types=("g6.2xlarge",))) == "ml.g6.2xlarge"
    assert SageMakerBackend(**OPTIONS, instance_type="g5.2xlarge").instance_type_for(GpuResources()) == "ml.g5.2xlarge"
    with pytest.raises(ValueError, match=r"no SageMaker training instance has 2 a100 GPU.*nearest: ml\.p4d\.24xlarge"):
        backend.validate(GpuResources(gpus=2, gpu_type="a100"), names.SPOT, multi_capacity=True)
    with pytest.raises(ValueError, match="one instance type; give one"):
        backend.validate(GpuResources(instance_types=("g5.xlarge", "g6.xlarge")), names.SPOT, multi_capacity=True)
    with pytest.raises(ValueError, match="whole GPUs"):
        backend.validate(GpuResources(gpus=0.5), names.ON_DEMAND, multi_capacity=False)
    # multi-node on spot is what SageMaker is for: accepted
    backend.validate(GpuResources(gpus=8, nodes=4, gpu_type="h100"), names.SPOT, multi_capacity=True)
    assert all(name.startswith("ml.") for row in INSTANCE_TABLE.values() for name in row.values())


def _job(status: str, secondary: str, **fields: Any) -> dict[str, Any]:
    return {
        "TrainingJobName": "gp-x-t1-a1",
        "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/gp-x-t1-a1",
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 60, "MaxWaitTimeInSeconds": 120},
        "EnableManagedSpotTraining": True,
        **fields,
    }


def test_the_state_table_maps_every_state_and_refuses_an_unknown_one() -> None:
    backend = SageMakerBackend(**OPTIONS, region_name="us-east-1")
    handle = JobHandle("sagemaker", "gp-x-t1-a1", "gp-x-t1-a1", 1, "spot", 0.0, {"gpus": 1})
    for key, expected in STATE_TABLE.items():
        status, secondary = key.split("/")
        assert backend.status_of(_job(status, secondary), handle, {}).state is expected, key
    failed = backend.status_of(_job("Failed", "Failed", FailureReason="AlgorithmError: , exit code: 3"), handle, {})
    assert (failed.exit_code, failed.reason) == (3, "AlgorithmError: , exit code: 3")
    waited = backend.status_of(_job("Stopped", "MaxWaitTimeExceeded"), handle, {})
    assert (waited.state, waited.interruption) == (JobState.CANCELLED, names.CAPACITY_TIMEOUT)
    assert "MaxWaitTimeInSeconds=120" in waited.reason
    ours = backend.status_of(_job("Stopped", "Stopped"), handle, {"gpu-provider/stop-reason": "gpu-provider: killed"})
    assert (ours.state, ours.reason, ours.interruption) == (JobState.CANCELLED, "killed", None)
    outside = backend.status_of(_job("Stopped", "Stopped"), handle, {})
    assert outside.reason.startswith("stopped outside Airflow")
    runtime = backend.status_of(_job("Stopped", "MaxRuntimeExceeded"), handle, {})
    assert runtime.state is JobState.FAILED and "MaxRuntimeInSeconds=60" in runtime.reason
    with pytest.raises(ValueError, match="unknown remote job state 'Archived/Archived'"):
        backend.status_of(_job("Archived", "Archived"), handle, {})


def test_the_status_of_a_handle_that_names_its_region_asks_no_service() -> None:
    """The logs link of a status is in the handle's region; the backend's own (none given here) is not
    read, since learning the connection's region builds a client."""
    backend = SageMakerBackend(**OPTIONS)
    built: list[str] = []

    def build(service: str, *, automatic_retries: bool = True) -> Any:
        built.append(service)
        raise AssertionError(f"a {service} client was built to read a status")

    backend._clients.build = build  # type: ignore[method-assign]
    handle = JobHandle("sagemaker", "gp-x-t1-a1", "gp-x-t1-a1", 1, "spot", 0.0, {"gpus": 1, "region": "eu-west-1"})
    status = backend.status_of(_job("InProgress", "Training"), handle, {})
    assert status.state is JobState.RUNNING and status.log_url is not None
    assert status.log_url.startswith("https://eu-west-1.console.aws.amazon.com/") and built == []


def test_restarts_and_the_spot_wait_are_read_from_the_transitions() -> None:
    transitions = [
        {"Status": "Starting", "StartTime": 100.0},
        {"Status": "Training", "StartTime": 110.0},
        {"Status": "Interrupted", "StartTime": 150.0, "StatusMessage": "spot reclaimed"},
        {"Status": "Starting", "StartTime": 151.0},
    ]
    job = _job("InProgress", "Starting", SecondaryStatusTransitions=transitions)
    assert mapping.restarts(job) == 1 and mapping.queued_since(job) == 150.0
    assert mapping.queued_since(_job("InProgress", "Starting", SecondaryStatusTransitions=transitions[:1])) is None


def test_a_job_sagemaker_does_not_describe_is_not_visible_yet_then_lost_with_its_name_said() -> None:
    handle = JobHandle("sagemaker", "gp-x-t1-a1", "gp-x-t1-a1", 1, names.SPOT, 1000.0, {})
    early = status.missing(handle, 1000.0 + VISIBILITY_GRACE_S - 1)
    assert isinstance(early, GpuJobStatusError)
    assert str(early) == (
        "Amazon SageMaker does not describe training job gp-x-t1-a1 yet, 59s after it was submitted; "
        "reading it again on the next poll"
    )
    late = status.missing(handle, 1000.0 + VISIBILITY_GRACE_S)
    assert isinstance(late, JobStatus)
    assert (late.state, late.interruption, late.capacity) == (JobState.FAILED, names.LOST, names.SPOT)
    assert late.reason == (
        "Amazon SageMaker no longer knows training job gp-x-t1-a1 (deleted): how it ended cannot be known. "
        "Treated as lost: the capacity policy decides whether a new attempt runs, resuming from the latest "
        "checkpoint."
    )


def test_a_lost_create_answer_adopts_the_job_it_created(sagemaker: SageMakerWorld) -> None:
    sagemaker.emulator.lose_response("CreateTrainingJob", how="disconnect")
    backend = SageMakerBackend(**sagemaker.options)
    request = _request(capacity=names.ON_DEMAND, checkpoint_uri=f"s3://{CHECKPOINT_BUCKET}/adopt", run_id="adopt")
    request = request.__class__(**{**request.__dict__, "command": (sys.executable, "-c", "print('once')")})
    handle = backend.submit(request)
    creates = sagemaker.emulator.requests("CreateTrainingJob")
    assert len(creates) == 2 and creates[0]["lost"] == "disconnect", creates  # sent again, answered ResourceInUse
    assert creates[1]["status"] == 400
    assert handle.name == request.identity.name and handle.extra["job_arn"]
    assert handle.take_adopted()[1] is False, "the job this submit created itself is no reattach"
    assert [h.job_id for h in backend.find_existing(request.identity.task)] == [handle.job_id]


def test_list_owned_reports_the_active_jobs_this_provider_tagged(sagemaker: SageMakerWorld) -> None:
    sagemaker.emulator.hold("on-demand")
    backend = SageMakerBackend(**sagemaker.options)
    ours = backend.submit(_request(capacity=names.ON_DEMAND, nodes=2, gpus=4, run_id="owned"))
    client = sagemaker.emulator.client("sagemaker")
    foreign = dict(backend.create_body(_request(capacity=names.ON_DEMAND)), TrainingJobName="gp-not-ours", Tags=[])
    client.create_training_job(**foreign)
    owned = {o.handle.job_id: o for o in backend.list_owned()}
    assert ours.job_id in owned and "gp-not-ours" not in owned, owned
    job = owned[ours.job_id]
    assert job.task == TaskKey("train_dag", "train", "owned")
    assert (job.state, job.try_number, job.team, job.nodes, job.gpus) == (JobState.QUEUED, 1, "ml", 2, 4.0)
    assert (job.instance_type, job.max_runtime_s) == ("ml.g5.12xlarge", 28 * 24 * 3600)
    backend.cancel(ours, "reaped")
    client.stop_training_job(TrainingJobName="gp-not-ours")
    assert ours.job_id not in {o.handle.job_id for o in SageMakerBackend(**sagemaker.options).list_owned()}


def test_a_job_waiting_for_held_capacity_sleeps_until_a_release_or_its_max_wait_wakes_it(
    sagemaker: SageMakerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator = sagemaker.emulator
    looks: list[str] = []  # every time a waiting job's thread looks at its capacity and its wait
    waited_too_long = emulator._waited_too_long
    monkeypatch.setattr(emulator, "_waited_too_long", lambda job: looks.append(job.name) or waited_too_long(job))
    emulator.hold("on-demand")
    emulator.hold("spot")
    backend = SageMakerBackend(**sagemaker.options)

    def quick(request: JobRequest) -> JobRequest:
        return request.__class__(**{**request.__dict__, "command": (sys.executable, "-c", "print('trained')")})

    on_demand = backend.submit(quick(_request(capacity=names.ON_DEMAND, run_id="held-on-demand")))
    spot = backend.submit(quick(_request(run_id="held-spot", capacity_wait_s=60)))
    deadline = time.monotonic() + 10
    while len(set(looks)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    looks.clear()
    time.sleep(1.0)
    # asleep: no look in a second (looking every 0.2 s, 1,000 waiting jobs starved the emulator's requests)
    assert looks == []
    emulator.release("on-demand")
    deadline = time.monotonic() + 10
    while emulator.job(on_demand.job_id).status == "InProgress" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert emulator.job(on_demand.job_id).status == "Completed"
    emulator.wait_clock(1e8)  # its MaxWaitTimeInSeconds (the run time and 60 s) has now run out: it wakes, gives up
    deadline = time.monotonic() + 5
    while emulator.job(spot.job_id).status == "InProgress" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (emulator.job(spot.job_id).status, emulator.job(spot.job_id).secondary) == (
        "Stopped",
        "MaxWaitTimeExceeded",
    )


def test_250_waiting_attempts_cost_at_most_3_calls_per_tick_with_a_third_throttled(sagemaker: SageMakerWorld) -> None:
    backend = SageMakerBackend(**sagemaker.options)
    sagemaker.emulator.hold("spot")
    handles = []
    for i in range(250):
        identity = JobIdentity(TaskKey("sm_many", f"t{i}", "manual__1"), try_number=1, attempt=1, capacity="spot")
        request = JobRequest(identity, ("true",), {}, GpuResources(), "spot", image="x", capacity_wait_s=3600)
        handles.append(backend.submit(request))
    interval = 1.0

    async def wait_together() -> list[str]:
        triggers = [
            GpuJobTrigger(backend=backend.spec(), handle=h.to_dict(), poll_interval=interval, stream_logs=False)
            for h in handles
        ]

        async def first(trigger: GpuJobTrigger) -> str:
            async for event in trigger.run():
                return str(event.payload["status"])
            return "none"

        waiting = [asyncio.ensure_future(first(t)) for t in triggers]
        # every trigger subscribed and every job described once (a loaded machine takes longer than a few ticks)
        deadline = time.monotonic() + 90
        while len({r["body"].get("TrainingJobName") for r in sagemaker.emulator.requests("DescribeTrainingJob")}) < 250:
            assert time.monotonic() < deadline, "the poller did not read every job within 90 s"
            await asyncio.sleep(interval / 2)
        await asyncio.sleep(interval * 2)
        sagemaker.emulator.throttle("*", 3)  # a third of the calls are throttled from now on
        sagemaker.emulator.reset_requests()

        def tick_starts() -> int:
            return sum(
                r["action"] == "ListTrainingJobs" and not r["throttled"] and not (r.get("body") or {}).get("NextToken")
                for r in sagemaker.emulator.requests()
            )

        # a few ticks under throttling (counted, not timed: a loaded machine ticks late)
        deadline = time.monotonic() + 90
        while tick_starts() < 4:
            assert time.monotonic() < deadline, f"only {tick_starts()} ticks in 90 s"
            await asyncio.sleep(interval / 2)
        pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
        assert len(pollers) == 1, "one shared poller per event loop and backend"
        requests = [r for r in sagemaker.emulator.requests() if not r["action"].startswith("logs:")]
        sagemaker.emulator.reset_faults()
        # one tick = the calls from one first-page ListTrainingJobs the service answered (no NextToken) to
        # the next: its pages, and its throttled calls retried (time gaps would merge ticks on a loaded machine)
        ticks: list[list[dict[str, Any]]] = []
        for request in requests:
            starts_tick = not request["throttled"] and not (request.get("body") or {}).get("NextToken")
            if starts_tick or not ticks:
                ticks.append([])
            ticks[-1].append(request)
        assert len(ticks) >= 3, f"expected several ticks, saw {len(ticks)}"
        accepted = [sum(not r["throttled"] for r in tick) for tick in ticks]
        assert max(accepted) <= 3, accepted
        assert any(r["throttled"] for r in requests), "the test should have throttled some calls"
        assert {r["action"] for r in requests} <= {"ListTrainingJobs"}, "unchanged jobs are not described again"
        return list(await asyncio.wait_for(asyncio.gather(*waiting), 120))

    statuses = asyncio.run(wait_together())
    assert statuses == ["succeeded"] * 250


def test_a_sagemaker_task_is_validated_at_parse_time_without_importing_boto3() -> None:
    heavy = ("boto3", "botocore")
    code = (
        "import sys, json\n"
        "from gpu_provider import GpuResources\n"
        "from gpu_provider.operators import GpuJobOperator\n"
        "backend = {'name': 'sagemaker', 'role_arn': 'arn:aws:iam::123456789012:role/r', 'output_path': 's3://bkt/o'}\n"
        "GpuJobOperator(task_id='t', command=['true'], image='img', capacity='spot_fallback', backend=backend,\n"
        "               resources=GpuResources(gpus=8, nodes=2, gpu_type='h100'))\n"
        "try:\n"
        "    GpuJobOperator(task_id='u', command=['true'], image='img', backend=backend,\n"
        "                   resources=GpuResources(gpus=2, gpu_type='h100'))\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused: resources.gpus=2 with gpu_type='h100'" in out and "ml.p5.48xlarge" in out, out
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_a_stop_reason_keeps_its_punctuation_through_the_tag() -> None:
    """SageMaker tag values allow letters, digits, spaces and ``_.:/=+-@``: the reason is encoded reversibly,
    so the status (and the task's XCom) reads it back exactly, not 'the job 1 time s  inside ...'."""
    from gpu_provider.backends.sagemaker.ownership import _TAG_UNSAFE, decode_tag_text, encode_tag_text

    reason = "the service restarted the job 1 time(s) inside this attempt; stopped (see ops@example.com), 100% ok"
    value = encode_tag_text(names.CANCEL_PREFIX + reason)
    assert _TAG_UNSAFE.search(value) is None and len(value) <= 256
    backend = SageMakerBackend(**OPTIONS, region_name="us-east-1")
    handle = JobHandle("sagemaker", "gp-x-t1-a1", "gp-x-t1-a1", 1, "spot", 0.0, {"gpus": 1})
    status = backend.status_of(_job("Stopped", "Stopped"), handle, {"gpu-provider/stop-reason": value})
    assert status.reason == reason
    long = encode_tag_text(";" * 300)
    assert len(long) <= 256 and decode_tag_text(long) == ";" * (len(long) // 3)
