"""Fixture `kubernetes`: the fake Kubernetes API server (pods run as local processes on emulated Karpenter
nodes), a kubeconfig pointing at it and the Airflow connection ``kubernetes_default`` reading that
kubeconfig. Registered for the whole suite by tests/conftest.py.

It is the ``gpu_kubernetes`` fixture of gpu_provider.testing's pytest plugin, under this suite's name.
"""

from __future__ import annotations

import pytest

from gpu_provider.testing.worlds import KubernetesWorld

__all__ = ["KubernetesWorld", "kubernetes", "kubernetes_emulator"]


@pytest.fixture
def kubernetes(gpu_kubernetes: KubernetesWorld) -> KubernetesWorld:
    return gpu_kubernetes


@pytest.fixture(scope="session")
def kubernetes_emulator(gpu_kubernetes_emulator: KubernetesWorld) -> KubernetesWorld:
    """The session's emulator under its old name (the plugin's ``gpu_kubernetes_emulator``)."""
    return gpu_kubernetes_emulator
