"""The local AWS Batch emulator: real processes behind moto's Batch API, driven over HTTP with boto3."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionClosedError

from gpu_provider.testing.emulators.aws_batch import BatchEmulator, BatchSetup
from tests.harness import pid_alive, wait_for

REPO = Path(__file__).resolve().parents[2]
# retries.max_attempts counts retries in botocore (1 = one retry); total_max_attempts=1 is "no retries"
NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})
HOST_TERMINATED = re.compile(r"^Host EC2 \(instance i-[0-9a-f]{17}\) terminated\.$")
ORDER = ["SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED"]
# when this module starts its own emulator (the suite's shared one may have other settings)
STEP = 0.1
GRACE = 1.0

# job programs (python -c); PYTHONUNBUFFERED is set by the emulator, so lines reach CloudWatch at once
PRINT_ENV = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('AWS_BATCH_', 'FOO'))}))"
)
SLEEP_WITH_CHILD = (
    "import subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print('started child', child.pid); time.sleep(60)"
)
IGNORE_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('ignoring SIGTERM')); "
    "print('running'); [time.sleep(0.1) for _ in range(600)]"
)
EXIT_ON_SIGTERM = (
    "import signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM'), sys.exit(0))); "
    "print('running'); time.sleep(60)"
)

MNP_RENDEZVOUS = """
import pathlib, time
here, index = pathlib.Path(os.environ["RENDEZVOUS"]), os.environ["AWS_BATCH_JOB_NODE_INDEX"]
if index != "0":
    (here / index).touch()
    time.sleep(60)
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not all((here / i).exists() for i in ("1", "2")):
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BatchEmulator]:
    running = BatchEmulator.running()
    if running is not None:  # the suite's shared one (tests/batch_world.py): one per process
        running.reset_faults()
        yield running
        return
    with BatchEmulator(step_seconds=STEP, grace_period=GRACE, job_cwd=tmp_path_factory.mktemp("jobs")) as emu:
        yield emu


@pytest.fixture(scope="module")
def setup(emulator: BatchEmulator) -> BatchSetup:
    return emulator.create_environment(fair_share=True)


@pytest.fixture(scope="module")
def batch(emulator: BatchEmulator, setup: BatchSetup) -> Any:
    return emulator.client("batch", config=NO_RETRIES)


@pytest.fixture(scope="module")
def logs(emulator: BatchEmulator) -> Any:
    return emulator.client("logs", config=NO_RETRIES)


_definitions: dict[tuple[str, str], str] = {}


def job_definition(batch: Any, name: str, code: str, **extra: Any) -> str:
    """A container job definition running ``python -c code`` (registered once per name)."""
    key = (batch.meta.endpoint_url, name)
    if key not in _definitions:
        properties = {
            "image": "public.ecr.aws/docker/library/python:3.11",
            "command": [sys.executable, "-c", code],
            "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
            "environment": [{"name": "FOO_FROM_DEFINITION", "value": "definition"}],
        }
        found = batch.register_job_definition(
            jobDefinitionName=name, type="container", containerProperties=properties, **extra
        )
        _definitions[key] = found["jobDefinitionArn"]
    return _definitions[key]


def describe(batch: Any, job_id: str) -> dict[str, Any]:
    return batch.describe_jobs(jobs=[job_id])["jobs"][0]  # type: ignore[no-any-return]


def wait_until_done(batch: Any, job_id: str, timeout: float = 15.0) -> tuple[dict[str, Any], list[str]]:
    """Poll until the job ends; returns its last description and the states seen, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        job = describe(batch, job_id)
        if not seen or seen[-1] != job["status"]:
            seen.append(job["status"])
        if job["status"] in ("SUCCEEDED", "FAILED"):
            return job, seen
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout}s (seen {seen})")
        time.sleep(0.02)


def moves_of(caplog: pytest.LogCaptureFixture, job_id: str) -> list[str]:
    """The state changes the emulator made to one job (``"RUNNABLE -> STARTING"``), in order, from its log:
    a transient state (STARTING lasts ~0.1 s) is there even when no poll of a loaded machine saw it."""
    moves = []
    for record in caplog.records:
        message = record.getMessage()
        if record.name.endswith("aws_batch_jobs") and f"({job_id}) " in message and " -> " in message:
            moves.append(message.split(f"({job_id}) ", 1)[1].split(":", 1)[0])
    return moves


def wait_for_status(batch: Any, job_id: str, status: str, timeout: float = 10.0) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (job := describe(batch, job_id))["status"] == status and job, timeout, f"job {job_id} {status}"
    )


def log_lines(logs: Any, stream: str) -> list[str]:
    try:
        events = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream, startFromHead=True)
    except ClientError:
        return []
    return [e["message"] for e in events["events"]]


# --------------------------------------------------------------------------- lifecycle of the emulator


STOP_SCRIPT = """
import json, sys, threading, time
from gpu_provider.testing.emulators.aws_batch import BatchEmulator
emu = BatchEmulator(step_seconds=0.1, grace_period=30, job_cwd=sys.argv[1]).start()
emu.create_environment(fair_share=False)
client = emu.client("batch")
definition = client.register_job_definition(
    jobDefinitionName="sleeper",
    type="container",
    containerProperties={
        "image": "busybox",
        "command": [sys.executable, "-c", sys.argv[2]],
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
    },
)["jobDefinitionArn"]
job_id = client.submit_job(jobName="sleeper", jobQueue="gpu-spot", jobDefinition=definition)["jobId"]
deadline = time.monotonic() + 20
while len(emu.job_pids(job_id)) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
pids = emu.job_pids(job_id)
started = time.monotonic()
emu.stop()
took = time.monotonic() - started
emu.stop()  # idempotent
from moto.batch.models import Job
threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
print(json.dumps({"pids": pids, "took": took, "threads": threads, "patched": "start" in Job.__dict__}))
"""


def test_stop_kills_job_processes_undoes_patches_and_lets_the_interpreter_exit(tmp_path: Path) -> None:
    # in a child interpreter: the suite's shared emulator may be running in this one
    done = subprocess.run(
        [sys.executable, "-c", STOP_SCRIPT, str(tmp_path), SLEEP_WITH_CHILD],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["pids"]) == 2  # the job and the child it started
    assert not [pid for pid in result["pids"] if pid_alive(pid)]
    assert result["took"] < 10, "stop() waited for the 30 s grace period instead of killing"
    assert result["threads"] == [] and result["patched"] is False


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    command = [
        sys.executable,
        "-m",
        "gpu_provider.testing.emulators.aws_batch",
        "serve",
        "--port",
        "0",
        "--job-cwd",
        str(tmp_path),
    ]
    command += ["--ready-file", str(ready), "--fair-share", "--step-seconds", "0.1", "--grace-period", "1"]
    command += ["--preempt-after", "0.2", "--preempt-queue", "gpu-spot", "--preempt-name-contains", "train"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        info = wait_for(lambda: ready.exists() and json.loads(ready.read_text()), timeout=30, what="ready file")
        assert info["pid"] == proc.pid and info["region"] == "us-east-1"
        queues = (info["spot_queue"], info["on_demand_queue"], info["fair_share_queue"])
        assert queues == ("gpu-spot", "gpu-on-demand", "gpu-fair-share")
        clients = {
            service: boto3.client(
                service,
                endpoint_url=info["endpoint_url"],
                region_name=info["region"],
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
            for service in ("batch", "logs")
        }
        client = clients["batch"]
        assert {q["jobQueueName"] for q in client.describe_job_queues()["jobQueues"]} == set(queues)
        definition = job_definition(client, "print-pid", "import os, time; print(os.getpid()); time.sleep(60)")
        train = client.submit_job(jobName="train-1", jobQueue="gpu-spot", jobDefinition=definition)["jobId"]
        serve = client.submit_job(jobName="serve-1", jobQueue="gpu-spot", jobDefinition=definition)["jobId"]
        job, _ = wait_until_done(client, train)
        assert HOST_TERMINATED.match(job["statusReason"])
        job = wait_for_status(client, serve, "RUNNING")
        (pid,) = wait_for(lambda: log_lines(clients["logs"], job["container"]["logStreamName"]), what="the pid")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert not ready.exists()
    assert not pid_alive(int(pid))  # the job still running at shutdown was killed
    assert f"job train-1 ({train}) STARTING -> RUNNING" in output
    assert f"job train-1 ({train}) preempted: Host EC2 (instance i-" in output
    assert f"job serve-1 ({serve}) RUNNING -> FAILED: AWS Batch emulator stopped" in output
    assert output.rstrip().endswith("AWS Batch emulator stopped")


# --------------------------------------------------------------------------- jobs


def test_job_runs_as_a_process_and_logs_reach_cloudwatch(
    emulator: BatchEmulator, batch: Any, logs: Any, setup: BatchSetup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_provider.testing.emulators.aws_batch_jobs")
    definition = job_definition(batch, "print-env", PRINT_ENV)
    emulator.reset_requests()
    job_id = batch.submit_job(
        jobName="print-env-1",
        jobQueue=setup.spot_queue,
        jobDefinition=definition,
        containerOverrides={"environment": [{"name": "FOO_FROM_SUBMIT", "value": "submit"}]},
    )["jobId"]
    job, seen = wait_until_done(batch, job_id)

    assert seen[0] in ("SUBMITTED", "PENDING")
    assert seen == sorted(seen, key=ORDER.index) and seen[-1] == "SUCCEEDED"  # what the polls saw, in order
    assert moves_of(caplog, job_id) == [
        "SUBMITTED -> PENDING",
        "PENDING -> RUNNABLE",
        "RUNNABLE -> STARTING",
        "STARTING -> RUNNING",
        "RUNNING -> SUCCEEDED",
    ]
    assert job["status"] == "SUCCEEDED"
    assert job["statusReason"] == "Essential container in task exited"
    assert job["container"]["exitCode"] == 0
    assert job["createdAt"] <= job["startedAt"] <= job["stoppedAt"]
    stream = job["container"]["logStreamName"]
    assert stream.startswith("print-env/default/") and job["attempts"][-1]["container"]["logStreamName"] == stream
    (line,) = log_lines(logs, stream)
    assert json.loads(line) == {
        "AWS_BATCH_JOB_ID": job_id,
        "AWS_BATCH_JQ_NAME": "gpu-spot",
        "AWS_BATCH_CE_NAME": "gpu-spot-ce",
        "AWS_BATCH_JOB_ATTEMPT": "1",
        "FOO_FROM_DEFINITION": "definition",
        "FOO_FROM_SUBMIT": "submit",
    }
    # the request log has the exact request, under the API's name
    (submit,) = emulator.requests("SubmitJob")
    assert submit["body"]["containerOverrides"] == {"environment": [{"name": "FOO_FROM_SUBMIT", "value": "submit"}]}
    assert submit["status"] == 200 and not submit["throttled"]
    assert emulator.count("DescribeJobs") >= len(seen) and emulator.count("logs:GetLogEvents") == 1
    # moto appended AWS_BATCH_JOB_ID to the environment on every describe; the emulator does not
    env = describe(batch, job_id)["container"]["environment"]
    assert [e["name"] for e in env].count("AWS_BATCH_JOB_ID") == 1


def test_nonzero_exit_fails_with_exit_code(batch: Any, setup: BatchSetup) -> None:
    definition = job_definition(batch, "exit-3", "import sys; sys.exit(3)")
    job_id = batch.submit_job(jobName="exit-3", jobQueue=setup.on_demand_queue, jobDefinition=definition)["jobId"]
    job, _ = wait_until_done(batch, job_id)
    assert job["status"] == "FAILED"
    assert job["statusReason"] == "Essential container in task exited"
    assert job["container"]["exitCode"] == 3
    assert job["attempts"][-1]["container"]["exitCode"] == 3


def test_logs_stream_while_running_and_terminate_kills_the_process_group(
    emulator: BatchEmulator, batch: Any, logs: Any, setup: BatchSetup
) -> None:
    definition = job_definition(batch, "sleep-with-child", SLEEP_WITH_CHILD)
    job_id = batch.submit_job(jobName="sleeper-1", jobQueue=setup.spot_queue, jobDefinition=definition)["jobId"]
    job = wait_for_status(batch, job_id, "RUNNING")
    lines = wait_for(lambda: log_lines(logs, job["container"]["logStreamName"]), timeout=1.5, what="a log line")
    assert lines[0].startswith("started child ")
    pids = wait_for(lambda: len(emulator.job_pids(job_id)) == 2 and emulator.job_pids(job_id), what="two pids")

    batch.terminate_job(jobId=job_id, reason="Stopped by the test")
    job, _ = wait_until_done(batch, job_id, timeout=5)
    assert job["status"] == "FAILED"
    assert job["statusReason"] == "Stopped by the test"
    assert job["container"]["exitCode"] == 128 + signal.SIGTERM
    assert emulator.job_pids(job_id) == []
    assert not [pid for pid in pids if pid_alive(pid)]


def test_preempt_sends_sigterm_and_fails_with_host_terminated(
    emulator: BatchEmulator, batch: Any, logs: Any, setup: BatchSetup
) -> None:
    definition = job_definition(batch, "exit-on-sigterm", EXIT_ON_SIGTERM)
    job_id = batch.submit_job(jobName="spot-1", jobQueue=setup.spot_queue, jobDefinition=definition)["jobId"]
    job = wait_for_status(batch, job_id, "RUNNING")
    wait_for(lambda: log_lines(logs, job["container"]["logStreamName"]), what="the job to print")

    emulator.preempt(job_id)
    job, _ = wait_until_done(batch, job_id, timeout=5)
    assert job["status"] == "FAILED"  # although the process exited 0 on SIGTERM
    assert HOST_TERMINATED.match(job["statusReason"]), job["statusReason"]
    assert job["attempts"][-1]["statusReason"] == job["statusReason"]
    assert "exitCode" not in job["container"]
    assert log_lines(logs, job["container"]["logStreamName"]) == ["running", "got SIGTERM"]
    with pytest.raises(ValueError, match="already ended FAILED"):
        emulator.preempt(job_id)


def test_preempt_after_picks_matching_jobs_and_kills_after_the_grace_period(
    emulator: BatchEmulator, batch: Any, logs: Any, setup: BatchSetup
) -> None:
    stubborn = job_definition(batch, "ignore-sigterm", IGNORE_SIGTERM)
    quick = job_definition(batch, "quick", "print('done')")
    emulator.preempt_after(0.3, queue=setup.spot_queue, name_contains="train")
    bystander = batch.submit_job(jobName="prep-1", jobQueue=setup.spot_queue, jobDefinition=quick)["jobId"]
    victim = batch.submit_job(jobName="train-1", jobQueue=setup.spot_queue, jobDefinition=stubborn)["jobId"]
    spared = batch.submit_job(jobName="train-2", jobQueue=setup.spot_queue, jobDefinition=quick)["jobId"]

    job = wait_for_status(batch, victim, "RUNNING")
    running_at = time.monotonic()
    job, _ = wait_until_done(batch, victim, timeout=5 + emulator.grace_period)
    took = time.monotonic() - running_at
    assert job["status"] == "FAILED" and HOST_TERMINATED.match(job["statusReason"])
    grace = emulator.grace_period  # SIGTERM ignored: SIGKILL after the grace period
    assert 0.3 + grace - 0.2 < took < 0.3 + grace + 1.5, took
    assert "ignoring SIGTERM" in log_lines(logs, job["container"]["logStreamName"])
    assert emulator.job_pids(victim) == []
    assert wait_until_done(batch, bystander)[0]["status"] == "SUCCEEDED"
    assert wait_until_done(batch, spared)[0]["status"] == "SUCCEEDED"  # count=1: only the first train job


def test_hold_keeps_jobs_runnable_until_release_and_cancel_fails_a_held_job(
    emulator: BatchEmulator,
    batch: Any,
    setup: BatchSetup,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_provider.testing.emulators.aws_batch_jobs")
    looks: list[str] = []  # every time a job's thread looks whether its queue is still held
    is_held = emulator._is_held
    monkeypatch.setattr(emulator, "_is_held", lambda queue: looks.append(queue) or is_held(queue))
    definition = job_definition(batch, "quick", "print('done')")
    emulator.hold(setup.on_demand_queue)
    try:
        waiting = batch.submit_job(jobName="held-1", jobQueue=setup.on_demand_queue, jobDefinition=definition)
        cancelled = batch.submit_job(jobName="held-2", jobQueue=setup.on_demand_queue, jobDefinition=definition)
        wait_for_status(batch, waiting["jobId"], "RUNNABLE")
        wait_for_status(batch, cancelled["jobId"], "RUNNABLE")
        looks.clear()
        time.sleep(5 * emulator.step_seconds)
        assert describe(batch, waiting["jobId"])["status"] == "RUNNABLE"
        # held jobs sleep until a release or a stop wakes them (at most each one's first look is left):
        # polling every 50 ms, 1,000 held jobs took half a core from the requests the emulator serves
        assert len(looks) <= 2, len(looks)

        batch.cancel_job(jobId=cancelled["jobId"], reason="No longer needed")
        job, _ = wait_until_done(batch, cancelled["jobId"], timeout=3)
        assert (job["status"], job["statusReason"]) == ("FAILED", "No longer needed")
        assert "startedAt" not in job and job["attempts"] == []
    finally:
        emulator.release(setup.on_demand_queue)
    job, seen = wait_until_done(batch, waiting["jobId"])
    assert job["status"] == "SUCCEEDED" and seen[0] == "RUNNABLE"
    assert moves_of(caplog, waiting["jobId"])[2:] == [
        "RUNNABLE -> STARTING",
        "STARTING -> RUNNING",
        "RUNNING -> SUCCEEDED",
    ]


def test_throttle_answers_every_third_describe_with_429(emulator: BatchEmulator, batch: Any) -> None:
    emulator.reset_requests()
    emulator.throttle("DescribeJobs", every=3)
    outcomes = []
    try:
        for _ in range(9):
            try:
                batch.describe_jobs(jobs=["no-such-job"])
                outcomes.append("ok")
            except ClientError as err:
                assert err.response["ResponseMetadata"]["HTTPStatusCode"] == 429
                outcomes.append(err.response["Error"]["Code"])
    finally:
        emulator.throttle("DescribeJobs", every=0)
    assert outcomes == ["ok", "ok", "TooManyRequestsException"] * 3
    assert emulator.count("DescribeJobs") == 9
    assert [r["throttled"] for r in emulator.requests("DescribeJobs")] == [False, False, True] * 3
    batch.describe_jobs(jobs=["no-such-job"])  # off again


def test_describe_jobs_rejects_more_than_100_ids(batch: Any) -> None:
    assert batch.describe_jobs(jobs=[f"job-{i}" for i in range(100)])["jobs"] == []
    with pytest.raises(ClientError) as raised:
        batch.describe_jobs(jobs=[f"job-{i}" for i in range(101)])
    assert raised.value.response["Error"]["Code"] == "ClientException"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "at most 100" in raised.value.response["Error"]["Message"]


def test_fair_share_rules(emulator: BatchEmulator, batch: Any, setup: BatchSetup) -> None:
    definition = job_definition(batch, "quick", "print('done')")
    assert setup.fair_share_queue and setup.scheduling_policy_arn

    def rejected(**kwargs: Any) -> str:
        with pytest.raises(ClientError) as raised:
            batch.submit_job(jobName="fs", jobDefinition=definition, **kwargs)
        assert raised.value.response["Error"]["Code"] == "ClientException"
        return str(raised.value.response["Error"]["Message"])

    fair = setup.fair_share_queue
    assert rejected(jobQueue=fair) == "shareIdentifier must be specified."
    assert "schedulingPriorityOverride" in rejected(jobQueue=fair, shareIdentifier="team_a")
    assert "no scheduling policy" in rejected(jobQueue=setup.on_demand_queue, shareIdentifier="team_a")
    assert "no scheduling policy" in rejected(jobQueue=setup.spot_queue, schedulingPriorityOverride=5)

    job_id = batch.submit_job(
        jobName="fs-ok", jobQueue=fair, jobDefinition=definition, shareIdentifier="team_a", schedulingPriorityOverride=7
    )["jobId"]
    job, _ = wait_until_done(batch, job_id)
    assert (job["status"], job["shareIdentifier"], job["schedulingPriority"]) == ("SUCCEEDED", "team_a", 7)
    # a scheduling priority in the job definition is enough
    prioritised = job_definition(batch, "quick-prioritised", "print('done')", schedulingPriority=3)
    job_id = batch.submit_job(jobName="fs-ok2", jobQueue=fair, jobDefinition=prioritised, shareIdentifier="b")["jobId"]
    assert describe(batch, job_id)["schedulingPriority"] == 3
    assert [r["status"] for r in emulator.requests("SubmitJob")][-6:] == [400, 400, 400, 400, 200, 200]


def test_multi_node_job_runs_every_node_with_batch_environment(
    emulator: BatchEmulator, batch: Any, logs: Any, setup: BatchSetup, tmp_path: Path
) -> None:
    # Every node prints its environment. The other nodes then say so with a file in a shared directory
    # and sleep until they are stopped; the main node exits once both have printed.
    code = PRINT_ENV + MNP_RENDEZVOUS
    definition = batch.register_job_definition(
        jobDefinitionName="mnp",
        type="multinode",
        nodeProperties={
            "numNodes": 3,
            "mainNode": 0,
            "nodeRangeProperties": [
                {
                    "targetNodes": "0:",
                    "container": {
                        "image": "busybox",
                        "command": [sys.executable, "-c", "raise SystemExit('overridden')"],
                        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
                    },
                }
            ],
        },
    )["jobDefinitionArn"]
    job_id = batch.submit_job(
        jobName="mnp-1",
        jobQueue=setup.on_demand_queue,
        jobDefinition=definition,
        nodeOverrides={
            "nodePropertyOverrides": [
                {
                    "targetNodes": "0:",
                    "containerOverrides": {
                        "command": [sys.executable, "-c", code],
                        "environment": [
                            {"name": "FOO", "value": "bar"},
                            {"name": "RENDEZVOUS", "value": str(tmp_path)},
                        ],
                    },
                }
            ]
        },
    )["jobId"]
    job, _ = wait_until_done(batch, job_id)
    assert job["status"] == "SUCCEEDED", job.get("statusReason")
    nodes = batch.describe_jobs(jobs=[f"{job_id}#{i}" for i in range(3)])["jobs"]
    assert [n["nodeDetails"] for n in nodes] == [
        {"nodeIndex": 0, "isMainNode": True},
        {"nodeIndex": 1, "isMainNode": False},
        {"nodeIndex": 2, "isMainNode": False},
    ]
    assert job["container"]["logStreamName"] == nodes[0]["container"]["logStreamName"]
    assert len({n["container"]["logStreamName"] for n in nodes}) == 3
    for i, node in enumerate(nodes):
        (line,) = log_lines(logs, node["container"]["logStreamName"])
        expected = {
            "AWS_BATCH_JOB_ID": f"{job_id}#{i}",
            "AWS_BATCH_JQ_NAME": "gpu-on-demand",
            "AWS_BATCH_CE_NAME": "gpu-on-demand-ce",
            "AWS_BATCH_JOB_ATTEMPT": "1",
            "AWS_BATCH_JOB_NUM_NODES": "3",
            "AWS_BATCH_JOB_NODE_INDEX": str(i),
            "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
            "FOO": "bar",
        }
        if i != 0:  # real Batch leaves it out on the main node
            expected["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
        assert json.loads(line) == expected
    assert emulator.job_pids(job_id) == []  # the sleeping nodes were stopped with the main node
    listed = batch.list_jobs(multiNodeJobId=job_id, jobStatus="SUCCEEDED")["jobSummaryList"]
    assert [s["jobId"] for s in listed] == [f"{job_id}#0"]


def test_list_jobs_job_name_filter_ignores_status_like_batch(batch: Any, setup: BatchSetup) -> None:
    definition = job_definition(batch, "quick", "print('done')")
    queue = setup.on_demand_queue
    first = batch.submit_job(jobName="lj-alpha-1", jobQueue=queue, jobDefinition=definition)["jobId"]
    second = batch.submit_job(jobName="lj-alpha-2", jobQueue=queue, jobDefinition=definition)["jobId"]
    other = batch.submit_job(jobName="lj-beta-1", jobQueue=queue, jobDefinition=definition)["jobId"]
    for job_id in (first, second, other):
        wait_until_done(batch, job_id)

    found = batch.list_jobs(
        jobQueue=queue, jobStatus="RUNNING", filters=[{"name": "JOB_NAME", "values": ["LJ-Alpha*"]}]
    )["jobSummaryList"]
    assert [s["jobId"] for s in found] == [second, first]  # any status, case-insensitive, newest first
    assert {s["status"] for s in found} == {"SUCCEEDED"}
    exact = batch.list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": ["lj-beta-1"]}])
    assert [s["jobId"] for s in exact["jobSummaryList"]] == [other]
    # without a status or filter, Batch lists RUNNING jobs only
    assert {s["status"] for s in batch.list_jobs(jobQueue=queue)["jobSummaryList"]} <= {"RUNNING"}
    succeeded = {s["jobId"] for s in batch.list_jobs(jobQueue=queue, jobStatus="SUCCEEDED")["jobSummaryList"]}
    assert {first, second, other} <= succeeded


# --------------------------------------------------------------------------- faults added for the backend contract


def test_throttle_bursts_on_every_action_outlast_botocores_own_retries(
    emulator: BatchEmulator, batch: Any, logs: Any, setup: BatchSetup
) -> None:
    emulator.reset_requests()
    emulator.throttle_bursts("*", 4)
    try:
        outcomes = []
        for _ in range(5):
            try:
                batch.list_jobs(jobQueue=setup.spot_queue)
                outcomes.append("ok")
            except ClientError as err:
                outcomes.append(err.response["Error"]["Code"])
        with pytest.raises(ClientError) as raised:  # each action counted on its own: the first is throttled
            logs.describe_log_groups()
        assert raised.value.response["Error"]["Code"] == "ThrottlingException"
        # what a client with botocore's standard retries (3 retries: 4 attempts) sees: every call fails
        retrying = emulator.client("batch", config=Config(retries={"mode": "standard", "max_attempts": 3}))
        with pytest.raises(ClientError, match="TooManyRequestsException"):
            retrying.describe_job_queues()
    finally:
        emulator.throttle_bursts("*", 0)
    assert outcomes == ["TooManyRequestsException"] * 4 + ["ok"]
    assert [r["throttled"] for r in emulator.requests("ListJobs")] == [True, True, True, True, False]
    batch.list_jobs(jobQueue=setup.spot_queue)  # off again


@pytest.mark.parametrize("how", ["error", "disconnect"])
def test_lose_response_carries_the_submit_out_and_loses_the_answer(
    emulator: BatchEmulator, batch: Any, setup: BatchSetup, how: str
) -> None:
    definition = job_definition(batch, "quick", "print('done')")
    emulator.hold(setup.spot_queue)
    emulator.reset_requests()
    emulator.lose_response("SubmitJob", how=how)
    name = f"lost-{how}"
    try:
        with pytest.raises((ClientError, BotoCoreError)) as raised:
            batch.submit_job(jobName=name, jobQueue=setup.spot_queue, jobDefinition=definition)
        if how == "error":
            assert isinstance(raised.value, ClientError)
            assert raised.value.response["Error"]["Code"] == "ServerException"
            assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        else:
            assert isinstance(raised.value, ConnectionClosedError)
        # the job exists although the client never heard of it; the next submit is answered again
        found = batch.list_jobs(jobQueue=setup.spot_queue, filters=[{"name": "JOB_NAME", "values": [name]}])
        assert len(found["jobSummaryList"]) == 1
        batch.submit_job(jobName=name + "-2", jobQueue=setup.spot_queue, jobDefinition=definition)
        (lost, answered) = emulator.requests("SubmitJob")
        assert (lost["lost"], lost["status"], answered["lost"]) == (how, 200, None)
    finally:
        emulator.release(setup.spot_queue)


def test_forget_report_status_and_status_reasons(emulator: BatchEmulator, batch: Any, setup: BatchSetup) -> None:
    definition = job_definition(batch, "quick", "print('done')")
    emulator.hold(setup.spot_queue, reason="CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no spot")
    try:
        first = batch.submit_job(jobName="reasons-1", jobQueue=setup.spot_queue, jobDefinition=definition)["jobId"]
        second = batch.submit_job(jobName="reasons-2", jobQueue=setup.spot_queue, jobDefinition=definition)["jobId"]
        job = wait_for_status(batch, first, "RUNNABLE")
        assert job["statusReason"] == "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no spot"
        emulator.set_status_reason(second, "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - too big")
        assert wait_for_status(batch, second, "RUNNABLE")["statusReason"].startswith("MISCONFIGURATION:")
        listed = batch.list_jobs(jobQueue=setup.spot_queue, jobStatus="RUNNABLE")["jobSummaryList"]
        assert {s["jobId"]: s.get("statusReason") for s in listed if s["jobId"] in (first, second)} == {
            first: "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - no spot",
            second: "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - too big",
        }
        emulator.report_status(first, "SCHEDULED")
        assert describe(batch, first)["status"] == "SCHEDULED"
        emulator.report_status(first, None)
        assert describe(batch, first)["status"] == "RUNNABLE"
        emulator.forget(second)
        assert batch.describe_jobs(jobs=[first, second])["jobs"][0]["jobId"] == first
        assert len(batch.describe_jobs(jobs=[first, second])["jobs"]) == 1
        listed = batch.list_jobs(jobQueue=setup.spot_queue, filters=[{"name": "JOB_NAME", "values": ["reasons-*"]}])
        assert [s["jobId"] for s in listed["jobSummaryList"]] == [first]
    finally:
        emulator.release(setup.spot_queue)
    job, _ = wait_until_done(batch, first)
    assert job["status"] == "SUCCEEDED" and job["statusReason"] == "Essential container in task exited"


def test_each_request_records_the_access_key_that_signed_it(emulator: BatchEmulator) -> None:
    """Two clients of one emulator, told apart in its request log (the polling benchmark counts each side's
    calls this way while both watch at once)."""
    before = len(emulator.requests())
    for key in ("team-a", "team-b", "team-a"):
        client = emulator.client("batch", aws_access_key_id=key, aws_secret_access_key="x", config=NO_RETRIES)
        client.describe_jobs(jobs=[f"no-such-job-{key}"])
    mine = [r for r in emulator.requests()[before:] if r["action"] == "DescribeJobs"]
    assert [(r["client"], r["body"]["jobs"]) for r in mine] == [
        ("team-a", ["no-such-job-team-a"]),
        ("team-b", ["no-such-job-team-b"]),
        ("team-a", ["no-such-job-team-a"]),
    ]
