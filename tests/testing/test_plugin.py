"""gpu_provider.testing's pytest plugin as this suite loads it: cheap to import, and its fixtures do what
they say (the sample project of tests/integration/test_wheel_install.py uses them from the installed wheel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from gpu_provider.testing.dagrun import Interrupter
from gpu_provider.testing.worlds import AwsWorld, BatchWorld, KubernetesWorld

HEAVY = ("moto", "boto3", "botocore", "flask", "airflow", "kubernetes", "gpu_provider.testing.emulators")


def test_the_plugin_imports_nothing_heavy() -> None:
    """pytest loads the plugin in every session of an environment that has the package: it must cost nothing
    until a fixture is used (no moto, boto3, Airflow or emulator)."""
    code = (
        "import json, sys\n"
        "import gpu_provider.testing.plugin, gpu_provider.testing.worlds, gpu_provider.testing.check\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_plugin_is_loaded_once_with_its_fixtures(pytestconfig: pytest.Config) -> None:
    manager = pytestconfig.pluginmanager
    loaded = [manager.get_plugin(name) for name in ("gpu_provider", "gpu_provider.testing.plugin")]
    assert len([p for p in loaded if p is not None]) == 1, "the plugin must be registered exactly once"


def test_an_interruption_plan_is_checked() -> None:
    with pytest.raises(ValueError, match=r"interrupt\['train'\]=30 must be a list of seconds"):
        Interrupter(Path("/nonexistent"), {"train": 30})  # type: ignore[dict-item]


def test_gpu_aws_points_airflow_at_both_emulators_and_its_helpers_act_on_them(gpu_aws: AwsWorld) -> None:
    batch, sagemaker = gpu_aws.batch, gpu_aws.sagemaker

    def endpoint(conn_id: str) -> str:
        return str(json.loads(os.environ[f"AIRFLOW_CONN_{conn_id}"])["extra"]["endpoint_url"])

    assert endpoint("AWS_DEFAULT") == sagemaker.emulator.endpoint_url
    assert endpoint("AWS_BATCH") == batch.emulator.endpoint_url
    assert os.environ["AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE"] == batch.setup.spot_queue
    client = boto3.client("batch", endpoint_url=batch.emulator.endpoint_url, config=Config(retries={"max_attempts": 1}))
    queues = {q["jobQueueName"] for q in client.describe_job_queues()["jobQueues"]}
    assert {batch.setup.spot_queue, batch.setup.on_demand_queue} <= queues
    s3 = boto3.client("s3", endpoint_url=sagemaker.emulator.endpoint_url)
    assert gpu_aws.checkpoint_bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    gpu_aws.throttle("DescribeJobQueues", every=1)
    with pytest.raises(ClientError, match="TooManyRequests"):
        client.describe_job_queues()
    batch.emulator.reset_faults()

    definition = client.register_job_definition(
        jobDefinitionName="plugin-hold",
        type="container",
        containerProperties={"image": "busybox", "command": ["sleep", "30"], "vcpus": 1, "memory": 128},
    )["jobDefinitionArn"]
    gpu_aws.hold_spot()
    held = client.submit_job(jobName="plugin-hold", jobQueue=batch.setup.spot_queue, jobDefinition=definition)
    from gpu_provider.testing.dagrun import wait_for

    wait_for(lambda: batch.describe(held["jobId"])["status"] == "RUNNABLE", 20, "the held job to wait in RUNNABLE")
    gpu_aws.release_spot()
    wait_for(lambda: batch.describe(held["jobId"])["status"] == "RUNNING", 30, "the released job to run")
    gpu_aws.reclaim_spot(held["jobId"])
    ended = wait_for(
        lambda: (job := batch.describe(held["jobId"]))["status"] in ("FAILED", "SUCCEEDED") and job, 30, "its end"
    )
    assert ended["status"] == "FAILED" and "terminated" in ended["statusReason"], ended


def test_the_batch_emulator_makes_its_queues_again_after_moto_was_reset(gpu_batch: BatchWorld) -> None:
    """A test using moto's own ``mock_aws`` resets moto's state in the whole process, the emulator's queues
    with it; the next test's ``gpu_batch`` (which calls ``create_environment``) finds them there again."""
    from moto import mock_aws

    client = gpu_batch.emulator.client("batch")
    with mock_aws():
        pass
    assert client.describe_job_queues(jobQueues=[gpu_batch.setup.spot_queue])["jobQueues"] == []
    setup = gpu_batch.emulator.create_environment(fair_share=True)
    assert setup == gpu_batch.setup
    queues = {q["jobQueueName"]: q["state"] for q in client.describe_job_queues()["jobQueues"]}
    assert queues == {setup.spot_queue: "ENABLED", setup.on_demand_queue: "ENABLED", setup.fair_share_queue: "ENABLED"}


def test_gpu_kubernetes_writes_a_kubeconfig_for_its_api_server(gpu_kubernetes: KubernetesWorld) -> None:
    config = json.loads(Path(os.environ["KUBECONFIG"]).read_text())
    assert config["clusters"][0]["cluster"]["server"] == gpu_kubernetes.emulator.url
    extra = json.loads(os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"])["extra"]
    assert extra["kube_config_path"] == os.environ["KUBECONFIG"]
    gpu_kubernetes.hold_spot()
    assert "spot" in gpu_kubernetes.emulator._shortage
