"""The AWS Batch backend: each attempt is one Batch job, spot attempts on one job queue and
on-demand attempts on another.

* :mod:`~gpu_provider.backends.batch.backend`: :class:`BatchBackend` (options, requests, the contract);
* :mod:`~gpu_provider.backends.batch.mapping`: what Batch's states and status reasons mean.

Clients, the throttling backoff and CloudWatch log reading are shared with SageMaker
(:mod:`gpu_provider.backends.aws`).

Nothing here imports boto3 until a client is needed.
"""

from __future__ import annotations

from gpu_provider.backends.batch.backend import MULTI_NODE_ENTRY, BatchBackend
from gpu_provider.backends.batch.mapping import (
    CANCEL_PREFIX,
    PREEMPTION_PATTERNS,
    STATE_TABLE,
    console_log_url,
    is_preemption,
    refine_failure,
)

__all__ = [
    "CANCEL_PREFIX",
    "MULTI_NODE_ENTRY",
    "PREEMPTION_PATTERNS",
    "STATE_TABLE",
    "BatchBackend",
    "console_log_url",
    "is_preemption",
    "refine_failure",
]
