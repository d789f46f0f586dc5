"""Fixture `batch`: the AWS Batch emulator with a spot queue, an on-demand queue and a fair-share queue, and
an Airflow AWS connection pointing at it. Registered for the whole suite by tests/conftest.py.

It is the ``gpu_batch`` fixture of gpu_provider.testing's pytest plugin (one emulator per session; each test
gets its request log reset, faults cleared, and every job it left active terminated), under this suite's name.
"""

from __future__ import annotations

import pytest

from gpu_provider.testing.emulators.aws_batch import BatchEmulator
from gpu_provider.testing.worlds import BatchWorld, aws_connection_env

__all__ = ["BatchWorld", "batch", "batch_emulator", "connection_env"]


def connection_env(emulator: BatchEmulator) -> dict[str, str]:
    """Environment that points Airflow's aws_default connection (and boto3) at the emulator."""
    return aws_connection_env(emulator.endpoint_url, emulator.region)


@pytest.fixture
def batch(gpu_batch: BatchWorld) -> BatchWorld:
    return gpu_batch


@pytest.fixture(scope="session")
def batch_emulator(gpu_batch_emulator: BatchWorld) -> BatchWorld:
    """The session's emulator under its old name (the plugin's ``gpu_batch_emulator``)."""
    return gpu_batch_emulator
