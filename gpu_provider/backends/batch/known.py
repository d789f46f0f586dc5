"""What a worker process learned about its AWS Batch resources, shared by every backend object of the process.

A worker builds a new backend object for each task, so facts kept on the object were looked up again at every
launch: the job definition (DescribeJobDefinitions, and RegisterJobDefinition when that found none) and the
queue's scheduling policy (DescribeJobQueues). Kept here for the process instead, per
:meth:`~gpu_provider.backends.aws.calls.Clients.scope` (connection, region, environment), a warm launch sends
only the create-or-adopt lookup (ListJobs) and SubmitJob.

What keeps that safe: a job definition is named by a hash of its content (:mod:`.requests`), so a name never
stands for other content; and a SubmitJob that Batch refuses (a definite refusal: nothing was created) forgets
the facts it was built from and is built again from fresh lookups, once (``BatchBackend.submit``): a
definition deregistered behind our back (INACTIVE, which Batch refuses new jobs on) is registered again, and a
queue deleted or disabled meanwhile gets its own clear error. These facts serve submissions only: nothing
destructive reads them.

Plain dict reads and writes, no lock: ``cancel()`` runs in a signal handler and must never wait.
"""

from __future__ import annotations

from typing import TypeVar

from gpu_provider.backends.common import keep_bounded

V = TypeVar("V")

#: scopes (connections, regions) remembered; each scope's own entries are bounded by the backend
SCOPES_KEPT = 16

_DEFINITIONS: dict[str, dict[str, str]] = {}
_FAIR_SHARE: dict[str, dict[str, bool]] = {}


def _of(table: dict[str, dict[str, V]], scope: str) -> dict[str, V]:
    found = table.get(scope)
    if found is None:
        found = {}
        keep_bounded(table, scope, found, limit=SCOPES_KEPT)
    return found


def definitions(scope: str) -> dict[str, str]:
    """The ARN of each job definition (by its content-hash name) registered or found under ``scope``."""
    return _of(_DEFINITIONS, scope)


def fair_share(scope: str) -> dict[str, bool]:
    """Whether each job queue under ``scope`` has a scheduling policy (existing, not DISABLED when looked up)."""
    return _of(_FAIR_SHARE, scope)


def forget(scope: str | None = None) -> None:
    """Forget what was learned under ``scope`` (every scope: ``None``)."""
    for table in (_DEFINITIONS, _FAIR_SHARE):
        if scope is None:
            table.clear()
        else:
            table.pop(scope, None)
