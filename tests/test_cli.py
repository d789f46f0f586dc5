"""The ``gpu-provider`` command line as a person runs it: connections made with ``airflow connections add``,
the quota file as a positional argument, and one line (no traceback) for a user's mistake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

GPU_PROVIDER = str(Path(sys.executable).with_name("gpu-provider"))
QUOTAS = "teams:\n  research:\n    gpus: 4\n  vision:\n    gpus: 2\n"


class PoolsApi(ThreadingHTTPServer):
    """Airflow's REST API as ``pools sync --dry-run`` reads it: no pools yet, no waiting task."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: PoolsApi

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.path.startswith("/api/v2/pools"):
            body: dict[str, Any] = {"pools": [], "total_entries": 0}
        elif "/taskInstances" in self.path:
            body = {"task_instances": [], "total_entries": 0}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def pools_api() -> Iterator[PoolsApi]:
    server = PoolsApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPU_PROVIDER, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_pools_sync_reads_a_connection_made_with_airflow_connections_add(
    airflow_home: Path, pools_api: PoolsApi, tmp_path: Path
) -> None:
    """The default connection (``[gpu_provider] reaper_airflow_conn_id``) lives in the metadata DB only."""
    conn_id = f"gpu_cli_{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "add", conn_id, "--conn-uri", pools_api.url],
        check=True,
        capture_output=True,
        env=dict(os.environ),
    )
    quota_file = tmp_path / "quotas.yaml"
    quota_file.write_text(QUOTAS)
    env = {"AIRFLOW__GPU_PROVIDER__REAPER_AIRFLOW_CONN_ID": conn_id}
    done = run("pools", "sync", "--dry-run", "--quota-file", str(quota_file), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(p.startswith("/api/v2/pools") for p in pools_api.paths), pools_api.paths
    assert "gpu_research" in done.stdout and "gpu_vision" in done.stdout, done.stdout


def test_a_connection_that_does_not_exist_is_one_line_saying_what_to_do(airflow_home: Path, tmp_path: Path) -> None:
    quota_file = tmp_path / "quotas.yaml"
    quota_file.write_text(QUOTAS)
    done = run("pools", "sync", "--quota-file", str(quota_file), "--conn-id", "gpu_cli_missing")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("gpu-provider: error:")]
    assert "Airflow connection 'gpu_cli_missing' is not defined" in line
    assert "airflow connections add gpu_cli_missing" in line and "AIRFLOW_CONN_GPU_CLI_MISSING" in line


def test_a_server_that_cannot_be_reached_is_one_line(airflow_home: Path, tmp_path: Path) -> None:
    quota_file = tmp_path / "quotas.yaml"
    quota_file.write_text(QUOTAS)
    with PoolsApi() as closed:  # a port that was just free: nothing listens once it is closed
        url = closed.url
    done = run("pools", "sync", "--dry-run", "--quota-file", str(quota_file), "--api-url", url)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("gpu-provider: error: Airflow API GET /pools"), done.stderr


@pytest.mark.parametrize("form", ["positional", "option"])
def test_quotas_validate_takes_the_file_as_typed(form: str, tmp_path: Path) -> None:
    quota_file = tmp_path / "quotas.yaml"
    quota_file.write_text(QUOTAS)
    args = [str(quota_file)] if form == "positional" else ["--quota-file", str(quota_file)]
    done = run("quotas", "validate", *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("research: 4 GPUs, pool gpu_research")


def test_quotas_render_takes_the_file_as_typed_too(tmp_path: Path) -> None:
    quota_file = tmp_path / "quotas.yaml"
    quota_file.write_text(QUOTAS)
    done = run("quotas", "render", str(quota_file), "--kubernetes")
    assert done.returncode == 0, done.stderr
    assert "kind: ResourceQuota" in done.stdout


def test_two_different_quota_files_are_refused_in_one_line(tmp_path: Path) -> None:
    done = run("quotas", "validate", str(tmp_path / "a.yaml"), "--quota-file", str(tmp_path / "b.yaml"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "two quota files given" in done.stderr


def test_a_quota_file_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    done = run("quotas", "validate", str(tmp_path / "nope.yaml"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("gpu-provider: error:") and "nope.yaml" in done.stderr
