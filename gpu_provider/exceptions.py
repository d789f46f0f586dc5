"""Runtime conditions of GPU jobs (bad input raises ``ValueError``/``TypeError`` instead)."""

from __future__ import annotations


class GpuJobError(Exception):
    """Base class of this provider's runtime errors."""


class GpuJobFailedError(GpuJobError):
    """The job itself failed (its own error): Airflow's retries apply, resuming from the checkpoint."""


class GpuJobStoppedError(GpuJobError):
    """A deliberate stop: Airflow does not retry it, whatever ``retries`` says.

    The operator raises it as (a subclass of) Airflow's ``AirflowFailException`` too, see
    :func:`as_final`; this class stays importable without Airflow (the job side never needs it).
    """


class GpuJobInterruptionBudgetError(GpuJobStoppedError):
    """The job was interrupted (spot reclaim, no spot capacity) more often than its policy allows."""


class GpuJobCancelledError(GpuJobStoppedError):
    """The job was cancelled on purpose: by a person, the reaper, another try that took it over, or a kill."""


class GpuJobDeadlineError(GpuJobStoppedError):
    """The attempt outlived its task's ``execution_timeout`` or queue deadline, and was cancelled."""


class GpuJobPollError(GpuJobError):
    """The job's status could not be read for too long."""


class GpuBackendThrottledError(GpuJobError):
    """The service throttled status reads; a waiting task keeps waiting and never fails for this."""


class GpuJobStatusError(GpuJobError):
    """One job's status could not be read or understood (an entry of ``Backend.poll``'s answer).

    Counted like a failed read for that job alone; the other jobs of the same poll are unaffected.
    """
