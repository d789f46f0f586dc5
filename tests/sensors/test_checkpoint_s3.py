"""CheckpointSensor and CheckpointTrigger on s3:// checkpoints, read through an Airflow AWS connection (moto server)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.runtime import save_checkpoint
from gpu_provider.sensors import CheckpointSensor
from gpu_provider.triggers.checkpoint import CheckpointTrigger

REGION = "us-east-1"
CONN_ID = "ckpt_s3"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Any, str]:
    """A bucket on the moto server, an Airflow connection ``ckpt_s3`` pointing at it, and a client for the test."""
    import boto3

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    connection = {"conn_type": "aws", "extra": {"endpoint_url": moto_endpoint, "region_name": REGION}}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(connection))
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


def _save(uri: str, step: int, client: Any) -> None:
    with save_checkpoint(uri, step, keep=None, s3_client=client) as folder:
        (folder / "w.bin").write_bytes(str(step).encode())


def test_sensor_reads_s3_through_the_connection_and_ignores_an_unpublished_upload(s3: tuple[Any, str]) -> None:
    client, bucket = s3
    uri = f"s3://{bucket}/runs/1/checkpoints"
    sensor = CheckpointSensor(task_id="wait", uri=uri, aws_conn_id=CONN_ID, deferrable=False)
    assert sensor.poke({}) is False  # type: ignore[arg-type]
    # an upload in progress: the folder's objects are there, LATEST (written last) does not name it yet
    client.put_object(Bucket=bucket, Key="runs/1/checkpoints/ckpt-0000000020/w.bin", Body=b"half")
    assert sensor.poke({}) is False  # type: ignore[arg-type]
    _save(uri, 20, client)
    found = sensor.poke({})  # type: ignore[arg-type]
    assert found and found.xcom_value == {"checkpoint": f"{uri}/ckpt-0000000020", "step": 20}


def test_trigger_waits_on_s3_until_a_newer_checkpoint_is_published(s3: tuple[Any, str]) -> None:
    client, bucket = s3
    uri = f"s3://{bucket}/weekly"
    _save(uri, 10, client)
    trigger = CheckpointTrigger(uri=uri, newer_than=10, aws_conn_id=CONN_ID, poll_interval=0.1)

    async def scenario() -> dict[str, Any]:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.5)
        assert not waiting.done(), "step 10 is not newer than 10"
        await asyncio.to_thread(_save, uri, 11, client)
        event = await asyncio.wait_for(waiting, 30)
        return dict(event.payload)

    event = asyncio.run(scenario())
    assert (event["status"], event["checkpoint"], event["step"]) == ("success", f"{uri}/ckpt-0000000011", 11)
