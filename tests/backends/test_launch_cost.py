"""What a launch costs before its submit request (benchmarks figure 5), and that each cut keeps its guarantee.

A worker builds a new backend object per task: the clients, the Batch job definitions and queue policies it
learned are kept for the process, so a warm launch sends only the create-or-adopt lookup and the submit. What
keeps that safe is tested next to each cut: a definition deregistered behind the worker's back is registered
again (one job, not two); a changed connection gets its own client. Locally, the job's supervisor starts
without ``site`` and without the runtime package; the first try writes nothing to the task state store before
its submit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.aws import calls
from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.local import launch
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.engine.attempts import AttemptEngine
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.job import GpuResources
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import SpotFallback
from tests.batch_world import BatchWorld
from tests.harness import REPO
from tests.sagemaker_world import SageMakerWorld
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

SM_OPTIONS = {"role_arn": "arn:aws:iam::123456789012:role/gpu-sagemaker-job", "output_path": "s3://models/out"}


def _request(task: str, attempt: int, *, capacity: str = "on-demand") -> JobRequest:
    return JobRequest(
        identity=JobIdentity(TaskKey("launch_tests", task, "manual__run", -1), 1, attempt, capacity),
        command=(sys.executable, "-c", "pass"),
        env={"GPU_PROVIDER_ATTEMPT": str(attempt)},
        resources=GpuResources(gpus=1),
        capacity=capacity,
        image="gpu-test:1",
    )


def _service_calls(requests: list[dict[str, Any]]) -> list[str]:
    return [r["action"] for r in requests if not r["action"].startswith("logs:")]


def test_a_warm_batch_launch_sends_only_the_create_or_adopt_lookup_and_submit(batch: BatchWorld) -> None:
    batch.emulator.hold(batch.setup.on_demand_queue)
    BatchBackend(**batch.queues).submit(_request("warm", 1))  # the process's first task: learns it all
    before = len(batch.emulator.requests())
    second = BatchBackend(**batch.queues)  # the next task of the worker process: a new backend object
    handle = second.submit(_request("warm", 2))
    assert _service_calls(batch.emulator.requests(since=before)) == ["ListJobs", "SubmitJob"]
    assert handle.attempt == 2


def test_a_job_definition_deregistered_behind_the_workers_back_is_registered_again(batch: BatchWorld) -> None:
    batch.emulator.hold(batch.setup.on_demand_queue)
    BatchBackend(**batch.queues).submit(_request("gone", 1))
    (first,) = batch.bodies("SubmitJob")
    batch.emulator.client("batch").deregister_job_definition(jobDefinition=first["jobDefinition"])

    handle = BatchBackend(**batch.queues).submit(_request("gone", 2))

    # the remembered (now INACTIVE) revision was refused, creating nothing; registered again, sent once more
    refused, sent = batch.emulator.requests("SubmitJob")[1:]
    assert refused["status"] == 400 and refused["body"]["jobDefinition"] == first["jobDefinition"]
    assert sent["status"] == 200 and sent["body"]["jobDefinition"] != first["jobDefinition"]
    assert len(batch.bodies("RegisterJobDefinition")) == 2
    listed = batch.emulator.client("batch").list_jobs(
        jobQueue=batch.setup.on_demand_queue, filters=[{"name": "JOB_NAME", "values": [handle.name]}]
    )["jobSummaryList"]
    assert [j["jobId"] for j in listed] == [handle.job_id]  # one job of that attempt, not two


def test_a_warm_sagemaker_launch_builds_no_client(sagemaker: SageMakerWorld) -> None:
    first = SageMakerBackend(**SM_OPTIONS)
    second = SageMakerBackend(**SM_OPTIONS)  # another task's backend object in the same worker process
    assert second._clients.get("sagemaker") is first._clients.get("sagemaker")
    sending_once = first._clients.get("sagemaker", automatic_retries=False)
    assert second._clients.get("sagemaker", automatic_retries=False) is sending_once
    assert sending_once is not first._clients.get("sagemaker")  # SubmitJob's client keeps botocore's retries off


def test_a_changed_connection_gets_its_own_client(monkeypatch: pytest.MonkeyPatch) -> None:
    def connect(endpoint: str) -> None:
        extra = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    connect("http://127.0.0.1:1")
    before = calls.Clients("aws_default", None).get("batch")
    assert calls.Clients("aws_default", None).get("batch") is before
    connect("http://127.0.0.1:2")  # the connection was edited (another endpoint): a new client
    after = calls.Clients("aws_default", None).get("batch")
    assert after is not before and after.meta.endpoint_url == "http://127.0.0.1:2"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rotated")  # so are rotated keys in the environment
    assert calls.Clients("aws_default", None).get("batch") is not after


def _fresh_connection(monkeypatch: pytest.MonkeyPatch, endpoint: str, **extra: Any) -> None:
    """``aws_default`` at ``endpoint`` (a port nothing listens on: no request is sent), dummy keys."""
    fields = {"endpoint_url": endpoint, "region_name": "us-east-1", **extra}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": fields}))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_a_client_says_it_comes_from_this_provider_without_walking_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from gpu_provider import __version__

    # the amazon hook finds its caller with inspect.stack(), 50-300 ms on a task's first client
    def walked(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect.stack() was called while building a client")

    _fresh_connection(monkeypatch, "http://127.0.0.1:3", config_kwargs={"user_agent_extra": "team/vision"})
    monkeypatch.setattr(inspect, "stack", walked)
    clients = calls.Clients("aws_default", None, main_service="sagemaker")
    for client in (clients.get("sagemaker"), clients.get("sagemaker", automatic_retries=False)):
        agent = client.meta.config.user_agent_extra
        assert agent.startswith(f"airflow-provider-gpu/{__version__} Airflow/"), agent
        assert agent.endswith(" team/vision"), agent  # the connection's own part is kept
    # the client built beside a busy shared lock (a signal handler's) does not walk the stack either
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    lone = calls.Clients._new_client(AwsBaseHook("aws_default", client_type="batch"), automatic_retries=True)
    assert lone.meta.config.user_agent_extra.startswith("airflow-provider-gpu/")


def test_the_garbage_collector_is_paused_while_a_client_parses_its_service_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from botocore.client import ClientCreator

    seen: list[bool] = []
    create = ClientCreator.create_client

    def observed(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return create(self, *args, **kwargs)

    monkeypatch.setattr(ClientCreator, "create_client", observed)
    _fresh_connection(monkeypatch, "http://127.0.0.1:4")
    assert gc.isenabled()
    calls.Clients("aws_default", None).get("batch")
    assert seen == [False] and gc.isenabled()  # paused for the parse, on again after
    gc.disable()  # a process that turned it off keeps it off
    try:
        _fresh_connection(monkeypatch, "http://127.0.0.1:5")
        calls.Clients("aws_default", None).get("batch")
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_the_local_supervisor_starts_without_site_or_the_runtime_package() -> None:
    code = (
        "import json, sys\nimport gpu_provider.backends.local.supervisor\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'site' or m.startswith("
        "('gpu_provider.runtime', 'gpu_provider.capacity', 'gpu_provider.job')))))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, *launch.SUPERVISOR_FLAGS, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.usefixtures("scripted")
def test_a_first_try_writes_nothing_to_the_task_state_store_before_its_submit() -> None:
    saved: list[int] = []

    def runner(records: list[AttemptRecord]) -> AttemptRunner:
        engine = AttemptEngine(SpotFallback(backoff=0), records, try_number=1, backend_name="scripted")
        return AttemptRunner(
            ScriptedBackend(),
            engine,
            log=logging.getLogger("test-launch-cost"),
            label="Airflow task d.t of run r",
            stop=threading.Event(),
            persist=lambda records: saved.append(len(records)),
        )

    runner([]).cancel_duplicates(set())
    assert saved == []  # nothing stored, nothing found: no write (an API server round trip)
    handle = JobHandle("scripted", "j1", "gp-j1", 1, "spot", time.time() - 100)
    runner([AttemptRecord.new(handle)]).cancel_duplicates({handle.job_id})
    assert saved == [1]  # records found: saved as before


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: "%s"}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]
current-context: x
"""


def test_kubernetes_api_objects_are_shared_until_the_kubeconfig_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpu_provider.backends.kubernetes.calls import Api

    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG % "token-1")
    extra = {"kube_config_path": str(path)}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    first = Api("kubernetes_default").core
    assert Api("kubernetes_default").core is first  # another task's backend object: no new client
    path.write_text(KUBECONFIG % "token-2")  # a rotated token: a new client, with it
    rotated = Api("kubernetes_default").core
    assert rotated is not first
    assert rotated.api_client.configuration.api_key["BearerToken"] == "Bearer token-2"


def _counting_nvidia_smi(path: Path, calls_file: Path, devices: str) -> str:
    path.write_text(f"#!/bin/sh\necho x >> {calls_file}\nprintf '{devices}'\n")
    path.chmod(0o755)
    return str(path)


def test_nvidia_smi_is_asked_once_a_minute_per_host_not_once_per_launch(tmp_path: Path) -> None:
    """Each local launch used to run nvidia-smi before its job could start (tens of ms on a GPU machine):
    one reading now serves every task process of the host for a minute, unless the binary changes."""
    from gpu_provider.backends.local import LocalBackend, common, gpus

    calls_file, state = tmp_path / "smi-calls", tmp_path / "state"
    smi = _counting_nvidia_smi(tmp_path / "nvidia-smi", calls_file, "0\\n1\\n")

    def launch_in_a_new_task_process(i: int) -> list[int]:
        backend = LocalBackend(state_dir=str(state), gpus="auto", nvidia_smi=smi)  # a new object, as a task's
        request = dataclasses.replace(_request(f"gpus{i}", 1), resources=GpuResources(gpus=0.1))
        handle = backend.submit(request)
        record = json.loads((Path(handle.extra["job_dir"]) / common.REQUEST_FILE).read_text())
        return list(record["gpu_devices"])

    assert launch_in_a_new_task_process(0) == [0, 1]
    assert launch_in_a_new_task_process(1) == [0, 1]
    assert len(calls_file.read_text().splitlines()) == 1, "the second launch reads the host's kept answer"
    assert (state / f"gpus-{socket.gethostname()}.json").stat().st_mode & 0o077 == 0

    # a new binary (a driver upgrade) is asked again, at once
    _counting_nvidia_smi(tmp_path / "nvidia-smi", calls_file, "0\\n")
    assert launch_in_a_new_task_process(2) == [0]
    assert len(calls_file.read_text().splitlines()) == 2
    # and a reading older than the limit is not used
    assert gpus.detected_gpus(smi, state, max_age_s=0.0) == ([0], None)
    assert len(calls_file.read_text().splitlines()) == 3

    # a binary that fails (a timeout under load, a driver hiccup) is not kept: the next launch asks again
    failing = tmp_path / "failing-smi"
    failing.write_text(f"#!/bin/sh\necho x >> {calls_file}\necho 'NVML: driver not loaded' >&2\nexit 9\n")
    failing.chmod(0o755)
    for expected_calls in (4, 5):
        devices, problem = gpus.detected_gpus(str(failing), state)
        assert devices == [] and problem is not None and "code 9" in problem, problem
        assert len(calls_file.read_text().splitlines()) == expected_calls
    # no binary at all is kept (installing one changes what the reading was made with)
    assert gpus.detected_gpus(str(tmp_path / "absent-smi"), state)[0] == []
    kept = json.loads((state / f"gpus-{socket.gethostname()}.json").read_text())
    assert kept["binary"] is None and kept["nvidia_smi"] == str(tmp_path / "absent-smi")
