"""Fixtures for the in-job runtime tests: a real moto S3 server on loopback, and a child-process runner."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials only: no profile, config or real credentials can leak into a test."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def s3_client(aws_env: None, moto_endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    return name


def _child_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process that imports ``gpu_provider`` from this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_PROVIDER_", "AWS_BATCH_", "SM_"))}
    for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _run_python(args: list[str], *, env: dict[str, str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def child_env() -> Callable[..., dict[str, str]]:
    """Build the environment for a child Python process (no job variables inherited from the test runner)."""
    return _child_env


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python <args>`` from the repository root and capture its output."""
    return _run_python
