"""Fixture `ec2_spot`: the EC2 spot emulator (placement scores and spot prices the test chooses) and an
Airflow AWS connection pointing at it. Registered for the whole suite by tests/conftest.py.

One emulator serves the session (its own moto server); each test starts with no scores, no prices,
an empty request log and no faults.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator


@pytest.fixture(scope="session")
def ec2_spot_emulator() -> Iterator[Ec2SpotEmulator]:
    running = Ec2SpotEmulator.running()
    if running is not None:
        yield running
        return
    with Ec2SpotEmulator() as emulator:
        yield emulator


def ec2_connection_env(emulator: Ec2SpotEmulator) -> dict[str, str]:
    """Environment that points Airflow's aws_default connection (and boto3) at the emulator."""
    extra = {"endpoint_url": emulator.endpoint_url, "region_name": emulator.region}
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra}),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": emulator.region,
    }


@pytest.fixture
def ec2_spot(ec2_spot_emulator: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ec2SpotEmulator]:
    for key, value in ec2_connection_env(ec2_spot_emulator).items():
        monkeypatch.setenv(key, value)
    ec2_spot_emulator.reset()
    yield ec2_spot_emulator
    ec2_spot_emulator.reset()
