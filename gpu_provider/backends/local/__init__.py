"""The local backend: runs a job's command as processes on this machine, one process per node.

This is the embedded default: a fresh clone runs the whole pipeline with no cloud. Each job gets a
small supervisor process (:mod:`~gpu_provider.backends.local.supervisor`) started in its own
session, so the job survives a crash of the Airflow worker that submitted it, and a restarted
worker finds it again through the state directory (layout in
:mod:`~gpu_provider.backends.local.common`).

What the job sees (besides its own ``env=`` and the ``GPU_PROVIDER_*`` contract):

* ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` (free port, same for all nodes)
* ``CUDA_VISIBLE_DEVICES``: GPUs allocated to that node; ``""`` on a machine without NVIDIA GPUs
* ``GPU_PROVIDER_OUTPUT_FILE``: a file the job may write its output URI to
* ``PYTHONUNBUFFERED=1`` and only an allow-listed part of the worker's environment (``PATH``,
  ``HOME``, locale, ``TZ``, ``TMPDIR``, ``USER``, ``LOGNAME``, ``PYTHONPATH``): never Airflow
  connections or cloud credentials.

Isolation (docs/how-to/local.md states it for users): the job's environment values are
never written to disk (``request.json`` names the variables only; the supervisor gets the values on
its stdin and keeps them in memory). Every node runs in its own session and process group. State
folders are 0700 and files 0600. Without ``run_as_user`` a job runs as the worker's user and can
read whatever that user can, including ``/proc/<pid>/environ`` of the worker and of other jobs'
processes; with ``run_as_user`` (the worker must run as root) the nodes run as that user, with its
groups, and reach neither the worker's processes nor the state directory.

Spot capacity is simulated: with ``simulate_preemptions=[8, 5]`` the first spot attempt of a task
instance is interrupted 8 s after its processes start (SIGTERM, ``grace_period``, SIGKILL) and ends
``PREEMPTED``, the second after 5 s; later spot attempts and on-demand attempts run undisturbed.

* :mod:`~gpu_provider.backends.local.backend`: :class:`LocalBackend` (options, the contract);
* :mod:`~gpu_provider.backends.local.options`: its options, parsed and checked;
* :mod:`~gpu_provider.backends.local.folders`: job folders, which host a job runs on, create-or-adopt;
* :mod:`~gpu_provider.backends.local.launch`: the ``request.json`` record and starting the supervisor;
* :mod:`~gpu_provider.backends.local.status`: the state table, ``status.json`` read, orphaned jobs ended;
* :mod:`~gpu_provider.backends.local.control`: cancel, simulated interruptions, owner marks;
* :mod:`~gpu_provider.backends.local.lookups`: a task's attempts, a job by id or name, ``list_owned``;
* :mod:`~gpu_provider.backends.local.prune`: deleting the folders of jobs that ended long ago;
* :mod:`~gpu_provider.backends.local.logs`: ``job.log`` read in bounded chunks;
* :mod:`~gpu_provider.backends.local.gpus`: GPU discovery and the allocation ledger;
* :mod:`~gpu_provider.backends.local.supervisor`: the per-job supervisor process;
* :mod:`~gpu_provider.backends.local.common`: what the backend and the supervisor share (layout, states, files).

Unlike the other backend packages, this one loads :class:`LocalBackend` on first use, not on import:
``python -m gpu_provider.backends.local.supervisor`` imports this package first, and the class pulls in
Airflow (through :mod:`gpu_provider.backends.base`), which would cost every job seconds and ~100 MB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_provider.backends.local.backend import LocalBackend
    from gpu_provider.backends.local.folders import this_host
    from gpu_provider.backends.local.status import STATE_TABLE

__all__ = ["STATE_TABLE", "LocalBackend", "this_host"]

_WHERE = {
    "LocalBackend": "gpu_provider.backends.local.backend",
    "STATE_TABLE": "gpu_provider.backends.local.status",
    "this_host": "gpu_provider.backends.local.folders",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
