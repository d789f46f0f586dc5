"""The Kubernetes backend: each attempt is a Pod (one node) or an Indexed Job with a headless Service
(several nodes) on Karpenter-provisioned GPU nodes, spot or on-demand.

* :mod:`~gpu_provider.backends.kubernetes.backend`: :class:`KubernetesBackend` (options, the contract);
* :mod:`~gpu_provider.backends.kubernetes.manifests`: the Pod, Job and Service, and the API server's checks;
* :mod:`~gpu_provider.backends.kubernetes.mapping`: what pod phases and Pod/Job conditions mean;
* :mod:`~gpu_provider.backends.kubernetes.calls`: the client (through the cncf ``KubernetesHook``) and retries.

Nothing here imports ``kubernetes`` until a client is needed.
"""

from __future__ import annotations

from gpu_provider.backends.kubernetes.backend import KubernetesBackend
from gpu_provider.backends.kubernetes.mapping import STATE_TABLE

__all__ = ["STATE_TABLE", "KubernetesBackend"]
