"""Runtime conditions of GPU jobs (bad input raises ``ValueError``/``TypeError`` instead)."""

from __future__ import annotations


class GpuJobError(Exception):
    """Base class of this provider's runtime errors."""


class GpuJobFailedError(GpuJobError):
    """The job itself failed (its own error): Airflow's retries apply, resuming from the checkpoint."""


class GpuJobInterruptionBudgetError(GpuJobError):
    """The job was interrupted (spot reclaim, no spot capacity) more often than its policy allows."""


class GpuJobCancelledError(GpuJobError):
    """The job was cancelled outside this task (by a person, the service, or the reaper)."""


class GpuJobPollError(GpuJobError):
    """The job's status could not be read for too long."""


class GpuBackendThrottledError(GpuJobError):
    """The service throttled status reads; a waiting task keeps waiting and never fails for this."""
