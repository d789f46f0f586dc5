"""The Kubernetes backend: each attempt is a Pod (one node) or an Indexed Job with a headless Service
(several nodes) on Karpenter-provisioned GPU nodes, spot or on-demand.

* :mod:`~gpu_provider.backends.kubernetes.backend`: :class:`KubernetesBackend`, which orchestrates the rest;
* :mod:`~gpu_provider.backends.kubernetes.options`: the options, their defaults and checks;
* :mod:`~gpu_provider.backends.kubernetes.manifests`: the Pod, Job and Service, and the API server's checks;
* :mod:`~gpu_provider.backends.kubernetes.mapping`: what pod phases and Pod/Job conditions mean (the state table);
* :mod:`~gpu_provider.backends.kubernetes.calls`: the client (through the cncf ``KubernetesHook``) and retries;
* :mod:`~gpu_provider.backends.kubernetes.objects`: get, list, create-or-adopt, patch and delete in the namespace;
* :mod:`~gpu_provider.backends.kubernetes.status`: what a poll lists, and an attempt's objects as a ``JobStatus``;
* :mod:`~gpu_provider.backends.kubernetes.ownership`: the task and owner try of an object, ``mark``, the cancel;
* :mod:`~gpu_provider.backends.kubernetes.lookups`: attempts found by labels or name, ``list_owned``;
* :mod:`~gpu_provider.backends.kubernetes.logs`: log reads from a cursor, and the end of a log;
* :mod:`~gpu_provider.backends.kubernetes.events`: the watch of the provider's pods.

Nothing here imports ``kubernetes`` until a client is needed.
"""

from __future__ import annotations

from gpu_provider.backends.kubernetes.backend import KubernetesBackend
from gpu_provider.backends.kubernetes.mapping import STATE_TABLE

__all__ = ["STATE_TABLE", "KubernetesBackend"]
