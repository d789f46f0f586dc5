"""Watching one attempt: the decisions the worker's wait loop and the trigger share.

Both paths receive status samples (the worker polls itself; the trigger gets them from the shared
poller) and must decide the same things: when failed status reads mean giving up, when the job's
new log lines are copied into the task log, and when the attempt's wait is over — the job ended, or
a spot attempt is still queued past its ``spot_wait_timeout``.
"""

from __future__ import annotations

import time
from typing import Any

from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus
from gpu_provider.exceptions import GpuBackendThrottledError
from gpu_provider.recovery import CAPACITY_TIMEOUT

#: failed status reads in a row before the wait gives up (the job may still run; a retry reattaches)
MAX_POLL_ERRORS = 20

#: outcomes of :meth:`AttemptWatch.read`: ``ENDED`` or the interruption kind ``CAPACITY_TIMEOUT``
ENDED = "ended"

__all__ = ["CAPACITY_TIMEOUT", "ENDED", "MAX_POLL_ERRORS", "AttemptWatch", "declared_output"]


def declared_output(lines: list[str]) -> str | None:
    """The last output URI declared among log lines (``declare_output`` prints a marked line)."""
    from gpu_provider.runtime.output import OUTPUT_LINE_PREFIX

    found = None
    for line in lines:
        if OUTPUT_LINE_PREFIX in line:
            found = line.rpartition(OUTPUT_LINE_PREFIX)[2].strip() or found
    return found


class AttemptWatch:
    """Per-attempt bookkeeping of a wait: consecutive read errors and the log position.

    :param spot_wait_timeout: seconds from submission after which a still-queued attempt is given up
        (``None``: wait forever)
    :param log: where the job's log lines and the warnings go (the task's or the trigger's logger)
    :param stream_logs: copy the job's new log lines into ``log`` with every status read
    """

    def __init__(
        self,
        backend: Backend,
        handle: JobHandle,
        *,
        spot_wait_timeout: float | None,
        log: Any,
        stream_logs: bool = True,
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.spot_wait_timeout = spot_wait_timeout
        self.log = log
        self.stream_logs = stream_logs
        self.errors = 0
        self._log_pos = 0
        #: the output URI the job declared in the log lines forwarded so far
        self.output_uri: str | None = None

    def waited(self) -> float:
        """Seconds since the attempt was submitted."""
        return time.time() - self.handle.submitted_at

    def failed_read(self, err: BaseException) -> str | None:
        """Count a failed status read; return the message to give up with once there were too many in a row.

        Throttling is not counted: the service answered, it only asked us to slow down.
        """
        if isinstance(err, GpuBackendThrottledError):
            self.log.warning("%s; still waiting for job %s.", err, self.handle.job_id)
            return None
        self.errors += 1
        if self.errors >= MAX_POLL_ERRORS:
            return (
                f"could not read the status of {self.backend.name} job {self.handle.job_id} "
                f"{self.errors} times in a row; last error: {err}"
            )
        self.log.warning("Polling %s job %s failed (%s); trying again.", self.backend.name, self.handle.job_id, err)
        return None

    def read(self, status: JobStatus) -> str | None:
        """Take one status sample (does I/O: reads the job's new log lines).

        :return: ``ENDED``, ``CAPACITY_TIMEOUT``, or ``None`` to keep waiting
        """
        self.errors = 0
        if self.stream_logs:
            self._forward_logs()
        if status.state.terminal:
            if self.stream_logs:
                self._settle_logs()
            return ENDED
        if (
            self.spot_wait_timeout is not None
            and status.state is JobState.QUEUED
            and self.waited() > self.spot_wait_timeout
        ):
            return CAPACITY_TIMEOUT
        return None

    def _forward_logs(self) -> int:
        """Copy the job's new log lines into ``log``; returns how many there were."""
        try:
            lines, self._log_pos = self.backend.logs(self.handle, self._log_pos)
        except Exception as err:  # logs are a convenience; they never fail the wait
            self.log.debug("Could not read logs of %s: %s", self.handle.job_id, err)
            return 0
        for line in lines:
            self.log.info("[job] %s", line)
        self.output_uri = declared_output(lines) or self.output_uri
        return len(lines)

    def _settle_logs(self) -> None:
        """After the end: keep reading for up to ``log_settle_s``, until two reads in a row bring nothing new."""
        deadline = time.monotonic() + self.backend.log_settle_s
        quiet = 0
        while time.monotonic() < deadline and quiet < 2:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            quiet = 0 if self._forward_logs() else quiet + 1
            if not self._log_pos:
                quiet = 0  # nothing at all yet: wait for the first lines until the deadline
