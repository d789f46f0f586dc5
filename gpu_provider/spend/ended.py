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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.backends.common import run_bounded
from gpu_provider.spend.prices import Price, attempt_cost

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

    ended = end_status(poll_one(runner.backend_for(record), handle, timeout=timeout), state, reason)
    runner.engine.saw(record, ended)
    run_bounded("save-attempts", runner.persist, timeout=timeout)
    return record


def price_from_dict(data: Mapping[str, Any] | None) -> Price | None:
    """A :class:`~gpu_provider.spend.prices.Price` back from its :meth:`~Price.to_dict` form (an attempt
    record's ``price``); ``None`` when ``data`` holds no usable figure."""
    if not data:
        return None
    try:
        per_hour = float(data["usd_per_hour"])
        per_gpu = float(data.get("usd_per_gpu_hour") or per_hour)
    except (KeyError, TypeError, ValueError):
        return None
    return Price(
        usd_per_hour=per_hour,
        instance_type=str(data.get("instance_type") or "-"),
        accelerators=max(1, round(per_hour / per_gpu)) if per_gpu > 0 else 1,
        capacity=str(data.get("capacity") or ""),
        region=data.get("region"),
        source=str(data.get("source") or "-"),
    )


def priced(record: AttemptRecord, price: Price | None) -> AttemptRecord:
    """``record`` with its ``price`` and ``cost_usd`` from ``price`` (the same arithmetic as every other end,
    :func:`gpu_provider.spend.prices.attempt_cost`); unchanged without a price."""
    if price is not None:
        record.price = price.to_dict()
        record.cost_usd = round(
            attempt_cost(
                price, gpu_seconds=record.gpu_seconds, nodes=record.nodes, billable_seconds=record.billable_seconds
            ),
            6,
        )
    return record


def report_stopped(
    handle: JobHandle,
    status: JobStatus | None,
    reason: str,
    *,
    team: str | None,
    backend: str,
    price: Price | None,
    nodes: int = 1,
    log: Any = None,
) -> AttemptRecord:
    """Report, once, the end of an attempt stopped by something that cannot write its task's records (the
    reaper stopping an orphan, a deferred task's trigger killed with it): ``CANCELLED`` with ``reason``, the
    start and GPU-seconds of the service's ``status`` read after the stop, priced at ``price``; its metrics
    (:func:`~gpu_provider.spend.metrics.emit_attempt`) and the team's month
    (:func:`~gpu_provider.spend.budget.configured_ledger`). The GPU page reads the same end from the service
    (:mod:`gpu_provider.plugins.ui.queries`). A metrics or ledger failure is logged, never raised."""
    from gpu_provider.records import AttemptRecord
    from gpu_provider.spend.budget import configured_ledger
    from gpu_provider.spend.metrics import emit_attempt

    record = AttemptRecord.new(handle)
    record.nodes = max(1, nodes)
    record.update(end_status(status, JobState.CANCELLED, reason))
    priced(record, price)
    if status is not None and status.started_at is not None:
        record.queue_wait_s = round(max(0.0, status.started_at - handle.submitted_at), 3)
    record.reported = True
    emit_attempt(record, team=team, backend=backend)
    if team and record.cost_usd:
        try:
            ledger = configured_ledger()
            if ledger is not None:
                ledger.add(team, record.cost_usd)
        except Exception as err:  # the budget is a guard: never fail the stop for it
            if log is not None:
                log.warning("Could not add $%.4f to team %s's monthly spend: %s", record.cost_usd, team, err)
    return record
