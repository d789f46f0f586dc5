"""A stop the task plans for a running attempt (its restart limit: :mod:`~gpu_provider.engine.restart_stops`; a
move back to spot: :mod:`~gpu_provider.engine.spot_moves`), carried through a crash.

The stop is written on the attempt's record as *planned* (``interruption`` set while the attempt runs,
``stop="planned"``, ``stop_reason``) before it is sent, and as *confirmed* once a fresh read shows the service
taking it (the job stopping, or ended, with the stop's reason: :func:`gpu_provider.records.stop_taken`). Only a
confirmed stop makes the job's end the planned one (:meth:`gpu_provider.records.AttemptRecord.update`): a job that
fails on its own while its stop is unconfirmed has failed, and is not resubmitted as a move.

A process that dies between the write and the send (or before it saw the stop taken) leaves a planned,
unconfirmed stop: the next process to wait on the attempt (a new try, a try resuming from its trigger) sends it
again with the same reason, once it has read that it owns the attempt, and reads whether it was taken
(:func:`resume_stop`). Every backend's stop is idempotent (AWS Batch TerminateJob and Kubernetes' delete of a
stopping job, SageMaker's StopTrainingJob of a job already Stopping, the local cancel request kept once). Until
then the restart limit stays armed (:func:`stop_sent`), so the wait's own rule sends it if the resend could not.
A 0.4.0 record (``interruption`` alone, no ``stop``) is read the same way: planned, not confirmed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_provider import names
from gpu_provider.engine.attempts import Step
from gpu_provider.engine.calls import poll_one
from gpu_provider.records import AttemptRecord, stop_taken

if TYPE_CHECKING:
    from gpu_provider.engine.runner import AttemptRunner


def stop_sent(runner: AttemptRunner, record: AttemptRecord) -> bool:
    """Whether ``record``'s planned stop needs nothing more than waiting for the job's end: the service was seen
    taking it, or this process sent it. A stop only planned (a crash before it was sent, or before it was seen
    taken) is not: the next wait sends it again (:func:`resume_stop`)."""
    return record.planned_stop is not None and (record.stop_confirmed or record.job_id in runner.stops_sent)


def send(runner: AttemptRunner, record: AttemptRecord, kind: str, reason: str) -> bool:
    """Plan the stop of kind ``kind`` (``names.STOP_MARKS``) with ``reason``, send it, and read whether the service
    takes it. ``False``: it could not be sent, and the plan is unwritten (the wait's rules decide again)."""
    record.interruption, record.stop, record.stop_reason = kind, names.STOP_PLANNED, reason
    runner.persist()  # before the stop: a process that dies after it knows the stop was planned, and sends it again
    return _send(runner, record, reason)


def _send(runner: AttemptRunner, record: AttemptRecord, reason: str) -> bool:
    if not runner.cancel(record, reason):
        unplan(record)
        runner.persist()
        return False
    runner.stops_sent.add(record.job_id)
    confirm(runner, record)
    return True


def confirm(runner: AttemptRunner, record: AttemptRecord) -> bool:
    """Read the attempt now: once the service shows its planned stop taken, the record says ``confirmed``. A read
    that fails, or shows nothing yet (AWS Batch shows a stop only by the job's end), leaves it planned: the end
    with the stop's reason confirms it then."""
    kind = record.planned_stop
    if kind is None:
        return False
    if not record.stop_confirmed:
        fresh = poll_one(runner.backend_for(record), record.handle)
        if fresh is None or not stop_taken(fresh, kind):
            return False
        record.stop = names.STOP_CONFIRMED
        runner.persist()
    return True


def unplan(record: AttemptRecord) -> None:
    """The planned stop was not sent: the record no longer says one is planned."""
    if record.interruption == names.MOVED_TO_SPOT:
        record.spot_return = None
    record.interruption, record.stop, record.stop_reason = None, None, None


def resume_stop(runner: AttemptRunner, record: AttemptRecord) -> Step | None:
    """Before a wait on ``record``: a stop an earlier process planned and was not seen taken is sent again, with
    its reason, and confirmed by a fresh read. Only by the owner, read now: a later try's attempt makes this try
    stand down; an owner that cannot be read sends nothing (the restart limit stays armed, so the wait's own rule
    tries again). Returns the step after the attempt when it has ended meanwhile (its end says whether by the
    stop), else ``None``: wait."""
    kind = record.planned_stop
    if kind is None or stop_sent(runner, record):
        return None
    where = runner.describe_attempt(record)
    owned = runner.owned_later(record)
    if owned:
        runner.stand_down(record)
    if owned is None:
        runner.log.warning(
            "%s has a planned stop (%s) that was not seen taken, but who owns it cannot be read now: not sending it "
            "on a guess.",
            where,
            kind,
        )
        return None
    fresh = poll_one(runner.backend_for(record), record.handle)
    if fresh is not None:
        runner.engine.saw(record, fresh)  # a stop seen taken is confirmed; an end says whose it was
        runner.persist()
        if record.state.terminal:
            return runner.engine.ended(record)
        if record.stop_confirmed:
            runner.log.info("%s is taking its planned stop (%s): waiting for its end.", where, kind)
            return None
    reason = record.stop_reason or _reason_of_old_record(runner, record, kind)
    record.stop_reason = reason
    if not _send(runner, record, reason):
        runner.log.warning(
            "%s: its planned stop (%s) could not be sent again; the record no longer says it is planned, and the "
            "wait's own rules decide again.",
            where,
            kind,
        )
        return None
    runner.log.warning(
        "%s: sent its planned stop (%s) again: it was written before an earlier process ended, but never seen "
        "taken; %s.",
        where,
        kind,
        "the service has taken it" if record.stop_confirmed else "the job's end with the stop's reason confirms it",
    )
    return None


def _reason_of_old_record(runner: AttemptRunner, record: AttemptRecord, kind: str) -> str:
    """The reason of a planned stop whose record did not keep it (written by 0.4.0)."""
    if kind == names.MOVED_TO_SPOT:
        why = str((record.spot_return or {}).get("summary") or "spot capacity returned")
        return (
            f"{names.SPOT_RETURN_MARK}{why}; the job checkpoints and stops, and its next attempt runs on spot; "
            f"stopped by {runner.label}"
        )
    return (
        f"{names.RESTART_LIMIT_MARK}the service restarted the job {record.restarts} time(s) inside this attempt "
        f"after spot interruptions; the capacity policy runs its next attempt instead; stopped by {runner.label}"
    )
