"""Runtime conditions of GPU jobs (bad input raises ``ValueError``/``TypeError`` instead)."""

from __future__ import annotations

try:  # a deliberate stop must not be retried: Airflow's exception for that, where Airflow is installed
    from airflow.sdk.exceptions import AirflowFailException as _NotRetried
except ImportError:  # pragma: no cover - job-side code without Airflow
    _NotRetried = Exception  # type: ignore[misc,assignment]


class GpuJobError(Exception):
    """Base class of this provider's runtime errors."""


class GpuJobFailedError(GpuJobError):
    """The job itself failed (its own error): Airflow's retries apply, resuming from the checkpoint."""


class GpuJobStoppedError(GpuJobError, _NotRetried):
    """A deliberate stop: Airflow does not retry it, whatever ``retries`` says (it is an
    ``AirflowFailException``). Clearing the task runs the job again."""


class GpuJobInterruptionBudgetError(GpuJobStoppedError):
    """The job was interrupted (spot reclaim, no spot capacity) more often than its policy allows."""


class GpuJobCancelledError(GpuJobStoppedError):
    """The job was cancelled on purpose: by a person, the reaper, another try that took it over, or a kill."""


class GpuJobBudgetError(GpuJobStoppedError):
    """The job would cost, or came to cost, more than its budget (``max_cost_usd=``, or the team's
    monthly budget): not submitted, or stopped. Airflow does not retry it."""


class GpuJobDeadlineError(GpuJobError):
    """The attempt outlived its task's ``execution_timeout`` or ``queue_timeout`` and was cancelled;
    Airflow's retries apply, as they do to ``execution_timeout``."""


class GpuJobPollError(GpuJobError):
    """The job's status could not be read for too long."""


class GpuBackendThrottledError(GpuJobError):
    """The service throttled status reads; a waiting task keeps waiting and never fails for this."""


class GpuJobStatusError(GpuJobError):
    """One job's status could not be read or understood (an entry of ``Backend.poll``'s answer).

    Counted like a failed read for that job alone; the other jobs of the same poll are unaffected.
    """


class GpuJobElsewhereError(GpuJobStatusError):
    """The job runs on another machine whose state this one cannot read (the local backend without a
    shared state directory). Reading again will not help: the waiting try gives up at once, saying why,
    and the job is left alone (it is not declared failed)."""


class SpotCapacityError(GpuJobError):
    """Spot capacity could not be read (EC2 refused the call, e.g. missing permissions): unlike a
    timeout, ``soft_fail`` does not turn this into a skip."""


class CheckpointReadError(GpuJobError):
    """The checkpoint storage could not be read: by ``CheckpointTrigger`` several times in a row, or
    once by ``CheckpointSensor`` in poke mode."""
