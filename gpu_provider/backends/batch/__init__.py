"""The AWS Batch backend: each attempt is one Batch job, spot attempts on one job queue and
on-demand attempts on another.

* :mod:`~gpu_provider.backends.batch.backend`: :class:`BatchBackend`, which orchestrates the modules below
  (create-or-adopt, poll, cancel, the contract's reads);
* :mod:`~gpu_provider.backends.batch.options`: the options that need more than a text check;
* :mod:`~gpu_provider.backends.batch.requests`: the job definition and the SubmitJob body of an attempt;
* :mod:`~gpu_provider.backends.batch.service`: the calls to AWS Batch, through the throttling backoff;
* :mod:`~gpu_provider.backends.batch.mapping`: what Batch's states and status reasons mean;
* :mod:`~gpu_provider.backends.batch.status`: a DescribeJobs entry read into a status, a handle, an owner;
* :mod:`~gpu_provider.backends.batch.ownership`: the owner read and ``mark`` (the job's tags);
* :mod:`~gpu_provider.backends.batch.lookups`: finding jobs again by name or id, and ``list_owned``;
* :mod:`~gpu_provider.backends.batch.logs`: the attempt's CloudWatch streams.

Clients, the throttling backoff, a job not returned, and CloudWatch log reading are shared with SageMaker
(:mod:`gpu_provider.backends.aws`).

Nothing here imports boto3 until a client is needed.
"""

from __future__ import annotations

from gpu_provider.backends.batch.backend import BatchBackend
from gpu_provider.backends.batch.mapping import (
    CANCEL_PREFIX,
    PREEMPTION_PATTERNS,
    STATE_TABLE,
    console_log_url,
    is_preemption,
    refine_failure,
)
from gpu_provider.backends.batch.requests import MULTI_NODE_ENTRY

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
