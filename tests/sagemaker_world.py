"""Fixture `sagemaker`: the SageMaker emulator (training jobs whose hosts run as local processes, S3
and CloudWatch Logs on moto) with an output bucket and a checkpoint bucket, and an Airflow AWS
connection pointing at it. Registered for the whole suite by tests/conftest.py.

One emulator serves the whole session; each test gets its request log reset, faults cleared, its
buckets (re)created (another emulator starting in this process resets moto), and every training
job it left in progress stopped.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.testing.emulators.aws_sagemaker import ROLE_ARN, SageMakerEmulator
from tests.harness import REPO

OUTPUT_BUCKET = "gpu-sagemaker-output"
CHECKPOINT_BUCKET = "gpu-sagemaker-checkpoints"


@dataclass
class SageMakerWorld:
    emulator: SageMakerEmulator

    @property
    def options(self) -> dict[str, Any]:
        return {"role_arn": ROLE_ARN, "output_path": f"s3://{OUTPUT_BUCKET}/models"}

    def backend_source(self, **options: Any) -> str:
        """Python source of a SageMakerBackend for a DAG file."""
        args = ", ".join(f"{k}={v!r}" for k, v in {**self.options, **options}.items())
        return f"SageMakerBackend({args})"

    def bodies(self, action: str) -> list[dict[str, Any]]:
        """Bodies of the requests of one action the server accepted (throttled ones left out)."""
        return [r["body"] for r in self.emulator.requests(action) if not r["throttled"]]

    def describe(self, name: str) -> dict[str, Any]:
        return dict(self.emulator.client("sagemaker").describe_training_job(TrainingJobName=name))

    def ensure_buckets(self) -> None:
        for bucket in (OUTPUT_BUCKET, CHECKPOINT_BUCKET):
            self.emulator.create_bucket(bucket)


def connection_env(emulator: SageMakerEmulator) -> dict[str, str]:
    extra = {"endpoint_url": emulator.endpoint_url, "region_name": emulator.region}
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra}),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": emulator.region,
    }


@pytest.fixture(scope="session")
def sagemaker_emulator() -> Iterator[SageMakerWorld]:
    running = SageMakerEmulator.running()
    if running is not None:
        yield SageMakerWorld(running)
        return
    with (
        tempfile.TemporaryDirectory(prefix="gpu-sagemaker-jobs-") as root,
        SageMakerEmulator(job_root=Path(root), job_cwd=REPO, step_seconds=0.2, grace_period=2.0) as emulator,
    ):
        yield SageMakerWorld(emulator)


@pytest.fixture
def sagemaker(sagemaker_emulator: SageMakerWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[SageMakerWorld]:
    emulator = sagemaker_emulator.emulator
    for key, value in connection_env(emulator).items():
        monkeypatch.setenv(key, value)
    emulator.reset_requests()
    sagemaker_emulator.ensure_buckets()
    yield sagemaker_emulator
    emulator.reset_faults()
    emulator.stop_all()
