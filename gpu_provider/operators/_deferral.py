"""How a ``GpuJobOperator`` waits in the triggerer: the triggers it defers to, and the events it resumes with."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_provider import names
from gpu_provider.engine.watch import (
    BUDGET,
    CAPACITY_TIMEOUT,
    DEADLINE,
    ENDED,
    NEVER_STARTS,
    QUEUE_TIMEOUT,
    RESTART_LIMIT,
    SPOT_RETURNED,
)
from gpu_provider.exceptions import GpuJobPollError
from gpu_provider.names import DEFER_TIMEOUT_SLACK_S

if TYPE_CHECKING:
    from gpu_provider.engine.attempts import Submit
    from gpu_provider.engine.runner import AttemptRunner
    from gpu_provider.operators._plan import Plan
    from gpu_provider.records import AttemptRecord
    from gpu_provider.triggers.gpu_job import GpuBackoffTrigger, GpuJobTrigger

#: the trigger's event statuses that end a wait other than by the job's own end, and the watch's outcome of each
_OUTCOMES = {
    names.EVENT_CAPACITY_TIMEOUT: CAPACITY_TIMEOUT,
    names.EVENT_QUEUE_TIMEOUT: QUEUE_TIMEOUT,
    names.EVENT_DEADLINE: DEADLINE,
    names.EVENT_RESTART_LIMIT: RESTART_LIMIT,
    names.EVENT_BUDGET: BUDGET,
    names.EVENT_NEVER_STARTS: NEVER_STARTS,
    names.EVENT_SPOT_RETURNED: SPOT_RETURNED,
}


def check_event(event: Any) -> None:
    """Refuse an event that is not one of the trigger's (``execute_complete`` checks before it reads)."""
    if not isinstance(event, dict) or event.get("status") not in names.EVENT_STATUSES:
        raise GpuJobPollError(f"GPU job trigger returned an unexpected event: {event!r}")


def outcome_of(event: dict[str, Any]) -> str:
    """The watch's outcome (:mod:`gpu_provider.engine.watch`) a checked event stands for."""
    return _OUTCOMES.get(event["status"], ENDED)


def job_trigger(
    plan: Plan,
    runner: AttemptRunner,
    record: AttemptRecord,
    deadline: float | None,
    *,
    task_label: str,
    spend: dict[str, Any] | None,
) -> tuple[GpuJobTrigger, timedelta | None]:
    """The trigger that watches ``record``'s attempt, and Airflow's deferral timeout (a backstop past ``deadline``)."""
    from gpu_provider.triggers.gpu_job import GpuJobTrigger

    timeout = None
    if deadline is not None:  # a backstop: the trigger fires at the deadline itself and the job is cancelled
        timeout = timedelta(seconds=max(0.0, deadline - time.time()) + DEFER_TIMEOUT_SLACK_S)
    trigger = GpuJobTrigger(
        backend=plan.backend.spec(),
        handle=record.handle.to_dict(),
        poll_interval=plan.poll_interval,
        spot_wait_timeout=runner.capacity_wait(record),
        queue_timeout=runner.queue_timeout(record),
        deadline=deadline,
        stream_logs=plan.backend.stream_logs_when_deferred,
        task_label=task_label,
        restart_limit=runner.restart_limit(record),
        cost_limit=runner.cost_limit(record),
        try_number=plan.try_number,
        spend=spend,
        spot_return=runner.engine.spot_return_watch(record, runner.spot_types),
    )
    return trigger, timeout


def backoff_trigger(step: Submit, *, task_label: str) -> tuple[GpuBackoffTrigger, timedelta]:
    """The trigger that waits out the backoff before ``step``, and Airflow's deferral timeout for it."""
    from gpu_provider.triggers.gpu_job import GpuBackoffTrigger

    moment = time.time() + step.delay
    trigger = GpuBackoffTrigger(moment=moment, note=f"attempt {step.attempt} on {step.capacity} of {task_label}")
    return trigger, timedelta(seconds=step.delay + DEFER_TIMEOUT_SLACK_S)
