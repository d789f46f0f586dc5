"""Fixture `sagemaker`: the SageMaker emulator (training jobs whose hosts run as local processes, S3 and
CloudWatch Logs on moto) with an output bucket and a checkpoint bucket, and an Airflow AWS connection
pointing at it. Registered for the whole suite by tests/conftest.py.

It is the ``gpu_sagemaker`` fixture of gpu_provider.testing's pytest plugin, under this suite's name.
"""

from __future__ import annotations

import pytest

from gpu_provider.testing.emulators.aws_sagemaker import SageMakerEmulator
from gpu_provider.testing.worlds import CHECKPOINT_BUCKET, OUTPUT_BUCKET, SageMakerWorld, aws_connection_env

__all__ = ["CHECKPOINT_BUCKET", "OUTPUT_BUCKET", "SageMakerWorld", "connection_env", "sagemaker", "sagemaker_emulator"]


@pytest.fixture
def sagemaker(gpu_sagemaker: SageMakerWorld) -> SageMakerWorld:
    return gpu_sagemaker


def connection_env(emulator: SageMakerEmulator) -> dict[str, str]:
    """Environment that points Airflow's aws_default connection (and boto3) at the emulator."""
    return aws_connection_env(emulator.endpoint_url, emulator.region)


@pytest.fixture(scope="session")
def sagemaker_emulator(gpu_sagemaker_emulator: SageMakerWorld) -> SageMakerWorld:
    """The session's emulator under its old name (the plugin's ``gpu_sagemaker_emulator``)."""
    return gpu_sagemaker_emulator
