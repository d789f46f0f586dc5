"""``gpu-provider emulator KIND``: one command starts each emulator and prints settings that work: a client
configured only from them reaches the emulator; SIGINT (Ctrl-C) stops it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.config import Config

from tests.harness import wait_for

GPU_PROVIDER = str(Path(sys.executable).with_name("gpu-provider"))


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[str]] = []

    def run(kind: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
        settings = tmp_path / f"{kind}.env"
        proc = subprocess.Popen(
            [GPU_PROVIDER, "emulator", kind, "--dir", str(tmp_path / kind), "--settings-file", str(settings)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            start_new_session=True,
        )
        started.append(proc)
        wait_for(lambda: settings.exists() or proc.poll() is not None, 120, f"the {kind} emulator to be ready")
        assert settings.exists(), proc.communicate(timeout=10)[0]
        values: dict[str, str] = {}
        for line in settings.read_text().splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                (values[name],) = shlex.split(value)
        return proc, values

    yield run
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C: the emulator stops and says so; what it printed."""
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    return out


def aws(settings: dict[str, str], service: str) -> object:
    extra = json.loads(settings["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]
    return boto3.client(
        service,
        endpoint_url=extra["endpoint_url"],
        region_name=extra["region_name"],
        aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"],
        config=Config(retries={"max_attempts": 1}),
    )


def test_the_batch_emulator_prints_its_connection_and_queues(start: object) -> None:
    proc, settings = start("batch")  # type: ignore[operator]
    queues = aws(settings, "batch").describe_job_queues()["jobQueues"]  # type: ignore[attr-defined]
    names = {q["jobQueueName"]: q["state"] for q in queues}
    assert names[settings["AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE"]] == "ENABLED"
    assert names[settings["AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE"]] == "ENABLED"
    out = stop(proc)
    assert "export AIRFLOW_CONN_AWS_DEFAULT=" in out and "airflow connections add aws_default" in out
    assert out.rstrip().endswith("batch emulator stopped")


def test_the_sagemaker_emulator_prints_its_connection_role_and_buckets(start: object) -> None:
    proc, settings = start("sagemaker")  # type: ignore[operator]
    assert aws(settings, "sagemaker").list_training_jobs()["TrainingJobSummaries"] == []  # type: ignore[attr-defined]
    s3 = aws(settings, "s3")
    for uri in (settings["AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH"], settings["GPU_PIPELINE_CHECKPOINT_ROOT"]):
        s3.head_bucket(Bucket=uri.removeprefix("s3://").split("/")[0])  # type: ignore[attr-defined]
    assert settings["AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN"].startswith("arn:aws:iam::")
    assert stop(proc).rstrip().endswith("sagemaker emulator stopped")


def test_the_kubernetes_emulator_prints_a_kubeconfig_that_works(start: object) -> None:
    proc, settings = start("kubernetes")  # type: ignore[operator]
    kubeconfig = json.loads(settings["AIRFLOW_CONN_KUBERNETES_DEFAULT"])["extra"]["kube_config_path"]
    assert kubeconfig == settings["KUBECONFIG"]
    config = yaml.safe_load(Path(kubeconfig).read_text())
    server = config["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(f"{server}/api/v1/namespaces/default/pods", timeout=30) as answer:
        assert json.loads(answer.read())["kind"] == "PodList"
    assert stop(proc).rstrip().endswith("kubernetes emulator stopped")


def test_the_ec2_emulator_answers_spot_placement_scores(start: object) -> None:
    proc, settings = start("ec2")  # type: ignore[operator]
    scores = aws(settings, "ec2").get_spot_placement_scores(  # type: ignore[attr-defined]
        InstanceTypes=["g5.xlarge"], TargetCapacity=1, RegionNames=["us-east-1"]
    )["SpotPlacementScores"]
    assert scores == [{"Region": "us-east-1", "Score": 1}]
    assert stop(proc).rstrip().endswith("ec2 emulator stopped")


def test_an_unknown_emulator_is_refused_with_the_choices() -> None:
    done = subprocess.run([GPU_PROVIDER, "emulator", "gke"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "invalid choice: 'gke'" in done.stderr
    assert all(kind in done.stderr.rsplit("choose from", 1)[1] for kind in ("batch", "sagemaker", "kubernetes", "ec2"))
