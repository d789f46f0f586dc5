"""Writing the end of an attempt that something outside the wait ended (a kill), with its GPU time and cost.

The sync wait and the trigger record every end they see. An attempt ended by a kill is not seen by
either: the worker's ``on_kill`` cancels the job and the try stops polling. Without a record of that
end the attempt stayed ``QUEUED``, with no start, no GPU time and no cost, on the GPU page, in
``/gpu/api/attempts``, in the metrics and in the team's totals, although it had run for minutes.

:func:`record_end` reads the job's status once, in bounded time (it may run in a signal handler),
and writes the end: ``CANCELLED`` with who stopped it, the start, GPU-seconds and the other figures
from the service's own times, priced and reported once by the same spend control as every other end
(cost line, metrics, the team's month). :func:`end_status` is the status it writes, for other callers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.backends.common import run_bounded

if TYPE_CHECKING:
    from gpu_provider.engine.runner import AttemptRunner
    from gpu_provider.records import AttemptRecord


def end_status(status: JobStatus | None, state: JobState, reason: str, *, now: float | None = None) -> JobStatus:
    """The end to record: ``state`` and ``reason``, with everything the service's ``status`` knows (its
    start, GPU-seconds, billable time, instance, end); where it has not ended yet, the end is ``now``.
    A job that had ended by itself keeps the service's own end. ``status=None`` (it could not be read):
    only the end time is known, and the reason says so."""
    now = time.time() if now is None else now
    if status is None:
        return JobStatus(state=state, reason=f"{reason} (its status could not be read: GPU time unknown)", ended_at=now)
    if status.state.terminal and status.state is not JobState.CANCELLED:
        return status  # it had ended by itself (succeeded, failed, interrupted) before the stop: that is its end
    data = status.to_dict()
    data.update(state=state.value, reason=reason, ended_at=status.ended_at or now)
    return JobStatus.from_dict(data)


def record_end(
    runner: AttemptRunner | None,
    handle: JobHandle,
    reason: str,
    *,
    timeout: float,
    state: JobState = JobState.CANCELLED,
) -> AttemptRecord | None:
    """Write the end of ``handle``'s attempt into this try's records, once, and save them.

    Reads the job's status once (at most ``timeout`` seconds, in another thread), prices and reports
    the attempt through the try's spend control (cost line, metrics, team month: once per attempt),
    and saves the records (at most ``timeout`` seconds more). ``None`` when this try has no record of
    the attempt (nothing submitted yet, or no runner).
    """
    if runner is None:
        return None
    record = runner.engine.record_for(handle.job_id)
    if record is None:
        return None
    if record.state.terminal and record.reported:
        return record  # its end is written already
    from gpu_provider.engine.runner import poll_one

    ended = end_status(poll_one(runner.backend, handle, timeout=timeout), state, reason)
    runner.engine.saw(record, ended)
    run_bounded("save-attempts", runner.persist, timeout=timeout)
    return record
