"""Fixture `sagemaker`: the SageMaker emulator (training jobs whose hosts run as local processes, S3 and
CloudWatch Logs on moto) with an output bucket and a checkpoint bucket, and an Airflow AWS connection
pointing at it. Registered for the whole suite by tests/conftest.py.

It is the ``gpu_sagemaker`` fixture of gpu_provider.testing's pytest plugin, under this suite's name.
"""

from __future__ import annotations

import pytest

from gpu_provider.testing.worlds import CHECKPOINT_BUCKET, OUTPUT_BUCKET, SageMakerWorld

__all__ = ["CHECKPOINT_BUCKET", "OUTPUT_BUCKET", "SageMakerWorld", "sagemaker"]


@pytest.fixture
def sagemaker(gpu_sagemaker: SageMakerWorld) -> SageMakerWorld:
    return gpu_sagemaker
