"""Fixture `kubernetes`: the fake Kubernetes API server (``gpu_provider/testing/emulators/kubernetes.py``; pods run
as local
processes on emulated Karpenter nodes), a kubeconfig pointing at it and the Airflow connection
``kubernetes_default`` reading that kubeconfig. Registered for the whole suite by tests/conftest.py.

One emulator serves a session (per xdist worker); each test gets its request log reset, faults and
shortages cleared, and every pod, job and service it left deleted (processes stopped).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator
from tests.harness import REPO


@dataclass
class KubernetesWorld:
    emulator: KubernetesEmulator
    kubeconfig: Path

    def connection_env(self) -> dict[str, str]:
        """Environment that points Airflow's kubernetes_default connection at the emulator."""
        extra = {"kube_config_path": str(self.kubeconfig)}
        return {"AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps({"conn_type": "kubernetes", "extra": extra})}

    def count(self, action: str) -> int:
        return sum(1 for r in self.emulator.requests(action) if not r["throttled"])

    def bodies(self, action: str) -> list[dict[str, Any]]:
        return [r["body"]["body"] for r in self.emulator.requests(action) if not r["throttled"]]


@pytest.fixture(scope="session")
def kubernetes_emulator() -> Iterator[KubernetesWorld]:
    with (
        tempfile.TemporaryDirectory(prefix="gpu-provider-k8s-") as folder,
        KubernetesEmulator(job_cwd=REPO, node_delay=0.3, start_delay=0.3, grace_period=2.0) as emulator,
    ):
        yield KubernetesWorld(emulator, emulator.kubeconfig(Path(folder) / "kubeconfig"))


@pytest.fixture
def kubernetes(kubernetes_emulator: KubernetesWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubernetesWorld]:
    for key, value in kubernetes_emulator.connection_env().items():
        monkeypatch.setenv(key, value)
    kubernetes_emulator.emulator.reset()
    yield kubernetes_emulator
    kubernetes_emulator.emulator.reset()
