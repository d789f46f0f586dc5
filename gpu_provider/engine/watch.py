"""Watching one attempt: the decisions the worker's wait loop and the trigger share.

Both paths receive status samples (the worker polls itself; the trigger gets them from the shared
poller) and must decide the same things: when failed status reads mean giving up, when the job's
new log lines are copied into the task log, and when the wait is over — the job ended, a spot
attempt waited for capacity past its ``spot_wait_timeout``, an on-demand attempt stayed queued past
its ``queue_timeout``, or the task's ``execution_timeout`` came.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus
from gpu_provider.engine.fresh import over_budget
from gpu_provider.engine.logs import LogForwarder
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobElsewhereError
from gpu_provider.names import (
    CAPACITY_TIMEOUT,
    EVENT_BUDGET,
    EVENT_DEADLINE,
    EVENT_NEVER_STARTS,
    EVENT_QUEUE_TIMEOUT,
    EVENT_RESTART_LIMIT,
    EVENT_SPOT_RETURNED,
)

#: failed status reads in a row before the wait gives up (the owning task then leaves the job to its Airflow
#: retry, or cancels it when no retry is left: see AttemptRunner.gave_up_reading)
MAX_POLL_ERRORS = 20

#: outcomes of :meth:`AttemptWatch.read` besides ``None`` (keep waiting)
ENDED = "ended"
QUEUE_TIMEOUT = EVENT_QUEUE_TIMEOUT
DEADLINE = EVENT_DEADLINE
RESTART_LIMIT = EVENT_RESTART_LIMIT
BUDGET = EVENT_BUDGET
NEVER_STARTS = EVENT_NEVER_STARTS
#: not decided by :meth:`AttemptWatch.read`: the wait's spot reading (``SpotReturn``) says move back to spot
SPOT_RETURNED = EVENT_SPOT_RETURNED

__all__ = [
    "BUDGET",
    "CAPACITY_TIMEOUT",
    "DEADLINE",
    "ENDED",
    "MAX_POLL_ERRORS",
    "NEVER_STARTS",
    "QUEUE_TIMEOUT",
    "RESTART_LIMIT",
    "SPOT_RETURNED",
    "AttemptWatch",
    "interrupted",
]


def interrupted(status: JobStatus) -> bool:
    """Whether an ended attempt's status says an interruption ended it (a next attempt may follow)."""
    return status.interruption is not None or status.state is JobState.PREEMPTED


class AttemptWatch:
    """Per-attempt bookkeeping of a wait: consecutive read errors, queue reasons, the log.

    :param capacity_wait: seconds a *spot* attempt may wait for capacity before it is given up
        (``CAPACITY_TIMEOUT``: an interruption the policy absorbs); ``None``: wait forever
    :param queue_timeout: seconds an attempt that is not covered by ``capacity_wait`` may stay
        queued (``QUEUE_TIMEOUT``: fails the try); ``None``: wait forever
    :param deadline: Unix time at which the task's ``execution_timeout`` ends (``DEADLINE``)
    :param restart_limit: restarts inside the job (``JobStatus.restarts``) after which the attempt is
        given up (``RESTART_LIMIT``: the capacity policy wants its next attempt); ``None``: never
    :param log: where the job's log lines and the warnings go (the task's or the trigger's logger)
    :param stream_logs: copy the job's new log lines into ``log`` with every status read
    :param owner: the wait is the owning task's (``NEVER_STARTS`` ends it so the task can stop the job);
        ``False`` for a task that only watches someone else's job: it waits on, and changes nothing
    :param cost_limit: the attempt's running budget (:meth:`gpu_provider.spend.budget.SpendControl.cost_limit`):
        ``BUDGET`` once its GPU-seconds x ``usd_per_gpu_second`` reach ``remaining_usd``
    :param settle_interrupted: wait for an interrupted attempt's late log lines before the wait ends; ``False``
        leaves that to the caller (:attr:`unsettled`), which reads them after it has submitted the next attempt
    """

    def __init__(
        self,
        backend: Backend,
        handle: JobHandle,
        *,
        capacity_wait: float | None,
        log: Any,
        queue_timeout: float | None = None,
        deadline: float | None = None,
        stream_logs: bool = True,
        restart_limit: int | None = None,
        cost_limit: dict[str, float] | None = None,
        owner: bool = True,
        settle_interrupted: bool = True,
    ) -> None:
        self.backend = backend
        self.settle_interrupted = settle_interrupted
        #: the attempt ended by an interruption and its late log lines are still to be read (``logs.settle``)
        self.unsettled = False
        self.owner = owner
        self.cost_limit = cost_limit
        self.handle = handle
        self.capacity_wait = capacity_wait
        self.queue_timeout = queue_timeout
        self.deadline = deadline
        self.log = log
        self.stream_logs = stream_logs
        self.restart_limit = restart_limit
        self._restarts_seen = 0
        self.errors = 0
        self.logs = LogForwarder(backend, handle, log)
        #: the latest sample that saw the job started: what a later sample of a lost job no longer says
        self._ran: JobStatus | None = None
        self._queued_since: float | None = None
        self._queue_reason = ""
        self._left_queue = False

    @property
    def output_uri(self) -> str | None:
        return self.logs.output_uri

    def waited(self) -> float:
        """Seconds the attempt has been waiting for capacity (since submission, or since the service
        last put it back in the queue after a restart inside the job)."""
        return time.time() - (self._queued_since or self.handle.submitted_at)

    def failed_read(self, err: BaseException) -> str | None:
        """Count a failed status read; return the message to give up with once there were too many in a row.

        Throttling is not counted: the service answered, it only asked us to slow down.
        """
        if isinstance(err, GpuBackendThrottledError):
            self.log.warning("%s; still waiting for job %s.", err, self.handle.job_id)
            return None
        if isinstance(err, GpuJobElsewhereError):  # another machine's job: asking again cannot help
            return str(err)
        self.errors += 1
        if self.errors >= MAX_POLL_ERRORS:
            return (
                f"could not read the status of {self.backend.name} job {self.handle.job_id} "
                f"{self.errors} times in a row; last error: {err}"
            )
        self.log.warning("Polling %s job %s failed (%s); trying again.", self.backend.name, self.handle.job_id, err)
        return None

    def complete(self, status: JobStatus) -> JobStatus:
        """``status`` with what earlier samples of this wait saw and it no longer says: a job the service
        lost (expired, garbage-collected) keeps its start and the GPU time it was seen running."""
        ran = self._ran
        if ran is None or (status.started_at is not None and status.gpu_seconds >= ran.gpu_seconds):
            return status
        return replace(
            status,
            started_at=status.started_at or ran.started_at,
            gpu_seconds=max(status.gpu_seconds, ran.gpu_seconds),
            instance_type=status.instance_type or ran.instance_type,
        )

    def over_budget(self, status: JobStatus) -> bool:
        return over_budget(status, self.cost_limit)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def read(self, status: JobStatus) -> str | None:
        """Take one status sample (does I/O: reads the job's new log lines).

        :return: ``ENDED``, ``CAPACITY_TIMEOUT``, ``QUEUE_TIMEOUT``, ``DEADLINE``, ``RESTART_LIMIT``,
            ``BUDGET``, ``NEVER_STARTS`` (the service says the queued job can never start; the owning
            task decides what to do, the read changed nothing) or ``None`` to keep waiting
        """
        self.errors = 0
        if status.started_at is not None:
            self._ran = status
        if self.stream_logs:
            self.logs.pump()
        if status.state.terminal:
            if self.stream_logs and interrupted(status) and not self.settle_interrupted:
                self.unsettled = True  # no wait for late lines before the next attempt: the caller reads them after
            elif self.stream_logs:
                self.logs.settle()
            return ENDED
        if self.past_deadline():
            return DEADLINE
        if status.restarts > self._restarts_seen:
            self._restarts_seen = status.restarts
            self.log.warning(
                "%s job %s was interrupted and restarted by the service (restart %d inside the attempt): %s",
                self.backend.name,
                self.handle.job_id,
                status.restarts,
                status.reason or "no reason given",
            )
        if self.restart_limit is not None and status.restarts >= self.restart_limit:
            return RESTART_LIMIT
        if self.over_budget(status):
            return BUDGET
        if status.state is not JobState.QUEUED:
            self._queued_since, self._queue_reason, self._left_queue = None, "", True
            return None
        # back in the queue after it ran (a restart inside the job): the wait starts again now,
        # unless the service says when it started
        self._queued_since = status.queued_since or self._queued_since or (time.time() if self._left_queue else None)
        if status.reason and status.reason != self._queue_reason:
            self._queue_reason = status.reason
            self.log.info("%s job %s is queued: %s", self.backend.name, self.handle.job_id, status.reason)
        if status.never_starts and self.owner:
            return NEVER_STARTS
        if self.capacity_wait is not None and self.waited() > self.capacity_wait:
            return CAPACITY_TIMEOUT
        if self.queue_timeout is not None and self.waited() > self.queue_timeout:
            return QUEUE_TIMEOUT
        return None
