"""Fixture `ec2_spot`: the EC2 spot emulator (placement scores and spot prices the test chooses) and an
Airflow AWS connection pointing at it. Registered for the whole suite by tests/conftest.py.

It is the ``gpu_ec2_spot`` fixture of gpu_provider.testing's pytest plugin, under this suite's name.
"""

from __future__ import annotations

import pytest

from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
from gpu_provider.testing.worlds import aws_connection_env

__all__ = ["ec2_connection_env", "ec2_spot", "ec2_spot_emulator"]


def ec2_connection_env(emulator: Ec2SpotEmulator) -> dict[str, str]:
    """Environment that points Airflow's aws_default connection (and boto3) at the emulator."""
    return aws_connection_env(emulator.endpoint_url, emulator.region)


@pytest.fixture
def ec2_spot(gpu_ec2_spot: Ec2SpotEmulator) -> Ec2SpotEmulator:
    return gpu_ec2_spot


@pytest.fixture(scope="session")
def ec2_spot_emulator(gpu_ec2_emulator: Ec2SpotEmulator) -> Ec2SpotEmulator:
    """The session's emulator under its old name (the plugin's ``gpu_ec2_emulator``)."""
    return gpu_ec2_emulator
