"""Back to spot when spot returns (``SpotFallback(spot_return=SpotReturn(...))``, or a ``Ladder``'s), the sync
wait's side: what the wait reads (under a ladder, spot of the rung a move goes to: ``Ladder.spot_watch``), and the
planned stop of an on-demand attempt at a checkpoint (see :mod:`gpu_provider.capacity.spot_return` for the policy,
the trigger for the deferred wait's readings). The stop is a planned one (:mod:`gpu_provider.engine.planned_stops`):
only once the service was seen taking it is the attempt's end the move; a job that fails on its own before that
has failed, and is not resubmitted on spot."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_provider import names
from gpu_provider.backends.base import JobState
from gpu_provider.engine import planned_stops
from gpu_provider.engine.attempts import Step, Wait
from gpu_provider.engine.calls import poll_one
from gpu_provider.records import AttemptRecord

if TYPE_CHECKING:
    from gpu_provider.engine.runner import AttemptRunner


def spot_watch(runner: AttemptRunner, record: AttemptRecord) -> Any:
    """The spot readings of ``record``'s wait (a :class:`~gpu_provider.capacity.spot_return.SpotReturnWatch`),
    or ``None`` when nothing is to be read (no ``spot_return``, not on on-demand, ``max_moves`` spent)."""
    watch = runner.engine.spot_return_watch(record, runner.spot_types)
    if watch is None:
        return None
    from gpu_provider.capacity.spot_return import SpotReturnWatch

    return SpotReturnWatch(watch)


def move_to_spot(runner: AttemptRunner, record: AttemptRecord) -> Step:
    """Spot returned and pays (:attr:`AttemptRunner.spot_decision`): ask the attempt to checkpoint and stop, through the
    backend's stop (the path of a spot interruption: SIGTERM, grace period, SIGKILL), then wait for it to end;
    the engine then submits the next attempt on spot. Only on fresh evidence: this try owns the attempt
    (read by :meth:`AttemptRunner.after_wait`) and it is running now; otherwise nothing is stopped."""
    engine = runner.engine
    fresh = poll_one(runner.backend_for(record), record.handle)
    if fresh is None or fresh.state is not JobState.RUNNING:
        if fresh is not None:
            engine.saw(record, fresh)
            runner.persist()
            if fresh.state.terminal:
                return engine.ended(record)
        runner.log.info(
            "Spot returned, but %s is %s now: not moving it.",
            runner.describe_attempt(record),
            "unreadable" if fresh is None else fresh.state.value,
        )
        return Wait(record)
    if fresh.owner_try is not None and fresh.owner_try > engine.try_number:  # the status says so too
        record.owner_try = fresh.owner_try
        runner.stand_down(record)
    engine.saw(record, fresh)  # the record knows it runs (a try that finds the move planned reads it so)
    decision = dict(runner.spot_decision or {})
    record.spot_return = decision
    reason = (
        f"{names.SPOT_RETURN_MARK}{decision.get('summary') or 'spot capacity returned'}; the job checkpoints and "
        f"stops, and its next attempt runs on spot; stopped by {runner.label}"
    )
    # planned before it is sent (a process that dies in between leaves it to be sent again), confirmed once taken
    if not planned_stops.send(runner, record, names.MOVED_TO_SPOT, reason):
        return Wait(record)
    runner.log.warning(
        "Spot capacity returned: asked %s to checkpoint and stop (%s); the next attempt runs on spot.",
        runner.describe_attempt(record),
        decision.get("summary") or "no details",
    )
    return Wait(record)  # until the job has saved its checkpoint and ended
