"""Deadlines act on fresh state: before a wait limit stops a job, the job's state is read from the service now.

A wait limit that leads to a stop (queue timeout, capacity wait, never-starts, restart limit, budget) fires on a
status sample; with event sources on, the trigger's last sample can be up to the event backstop old (a lost or
late RUNNING event). A cached or event-fed status only decides *when* to look: what the stop acts on is one
status read of that one job at that moment (:func:`still_holds` on :func:`~gpu_provider.engine.calls.poll_one`).
The trigger reads so before it fires (a stale sample does not even wake the task), and the task, which stops
the job, reads again (:meth:`~gpu_provider.engine.runner.AttemptRunner.after_wait`). The task's own
``execution_timeout`` (``DEADLINE``) is not one of these: it stops the job whatever its state.
"""

from __future__ import annotations

from gpu_provider.backends.base import JobState, JobStatus
from gpu_provider.names import (
    CAPACITY_TIMEOUT,
    EVENT_BUDGET,
    EVENT_NEVER_STARTS,
    EVENT_QUEUE_TIMEOUT,
    EVENT_RESTART_LIMIT,
)

#: the wait outcomes whose stop needs the condition to hold in a fresh read of the job
RECHECKED = frozenset({CAPACITY_TIMEOUT, EVENT_QUEUE_TIMEOUT, EVENT_NEVER_STARTS, EVENT_RESTART_LIMIT, EVENT_BUDGET})


def over_budget(status: JobStatus, cost_limit: dict[str, float] | None) -> bool:
    """Whether ``status``'s GPU-seconds cost the attempt's remaining budget (``cost_limit``; ``None``: no budget)."""
    if not cost_limit:
        return False
    return status.gpu_seconds * float(cost_limit["usd_per_gpu_second"]) >= float(cost_limit["remaining_usd"])


def still_holds(
    outcome: str,
    fresh: JobStatus,
    *,
    restart_limit: int | None = None,
    cost_limit: dict[str, float] | None = None,
) -> bool:
    """Whether ``fresh`` (read from the service now) still says what ``outcome`` stops the job for: still queued
    (a queue or capacity wait), still unable to start, restarted at least ``restart_limit`` times and still live,
    or still live at a cost over ``cost_limit``. An ended job never holds: its end is collected instead."""
    if fresh.state.terminal:
        return False
    if outcome in (CAPACITY_TIMEOUT, EVENT_QUEUE_TIMEOUT):
        return fresh.state is JobState.QUEUED
    if outcome == EVENT_NEVER_STARTS:
        return fresh.state is JobState.QUEUED and bool(fresh.never_starts)
    if outcome == EVENT_RESTART_LIMIT:
        return restart_limit is not None and fresh.restarts >= restart_limit
    if outcome == EVENT_BUDGET:
        return over_budget(fresh, cost_limit)
    return True  # not a rechecked outcome: nothing to confirm
