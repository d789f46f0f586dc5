"""The [gpu_provider] config section reaches the operator and the local backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_provider.backends.local import LocalBackend
from gpu_provider.operators import GpuJobOperator
from gpu_provider.operators._fields import configured_poll_interval
from gpu_provider.operators.gpu_job import MAX_POLL_INTERVAL_S


def test_default_backend_comes_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__DEFAULT_BACKEND", "local")
    assert GpuJobOperator(task_id="a", command=["true"]).backend == "local"
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__DEFAULT_BACKEND", "nomad")
    with pytest.raises(ValueError, match=r"backend='nomad' is not a known backend; valid names: .*\blocal\b"):
        GpuJobOperator(task_id="b", command=["true"])


def test_poll_interval_comes_from_config_else_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LocalBackend(state_dir="/tmp/unused")
    monkeypatch.delenv("AIRFLOW__GPU_PROVIDER__POLL_INTERVAL", raising=False)
    assert configured_poll_interval(backend, MAX_POLL_INTERVAL_S) == LocalBackend.default_poll_interval == 2.0
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__POLL_INTERVAL", "7.5")
    assert configured_poll_interval(backend, MAX_POLL_INTERVAL_S) == 7.5
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__POLL_INTERVAL", "soon")
    with pytest.raises(ValueError, match=r"\[gpu_provider\] poll_interval='soon'"):
        configured_poll_interval(backend, MAX_POLL_INTERVAL_S)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__POLL_INTERVAL", "86400")
    with pytest.raises(ValueError, match=r"\[gpu_provider\] poll_interval='86400' is out of range.*0 to 3600"):
        configured_poll_interval(backend, MAX_POLL_INTERVAL_S)


def test_local_state_dir_comes_from_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR", str(tmp_path / "jobs-here"))
    assert LocalBackend().state_dir == tmp_path / "jobs-here"


def test_default_deferrable_comes_from_airflow_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert GpuJobOperator(task_id="d", command=["true"]).deferrable is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert GpuJobOperator(task_id="s", command=["true"]).deferrable is False
    assert GpuJobOperator(task_id="x", command=["true"], deferrable=True).deferrable is True
