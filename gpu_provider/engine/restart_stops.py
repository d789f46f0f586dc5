"""The stop of an attempt the service restarted too often inside itself (its restart limit: SageMaker managed spot
restarting a reclaimed job), so that the capacity policy's next attempt runs. The same mechanism as a move back to
spot (:mod:`gpu_provider.engine.spot_moves`), a planned stop (:mod:`gpu_provider.engine.planned_stops`): written on
the record as planned before it is sent, confirmed once the service is seen taking it, then the usual wait, in the
worker or in the triggerer, waits for the job to end: it checkpoints as it stops, and the next attempt, every node
of it, must resume from that checkpoint, not run beside the old job. A try that resumes the wait with the stop
confirmed (or sent by its own process) neither fires the restart limit again nor stops again; one that finds it
only planned (the process that planned it died before it was sent, or seen taken) sends it again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpu_provider import names
from gpu_provider.backends.base import JobState, JobStatus
from gpu_provider.engine import planned_stops
from gpu_provider.engine.attempts import Step, Wait
from gpu_provider.records import AttemptRecord, stop_taken

if TYPE_CHECKING:
    from gpu_provider.engine.runner import AttemptRunner


def stop_at_restart_limit(runner: AttemptRunner, record: AttemptRecord, status: JobStatus) -> Step:
    """The service restarted the attempt ``status.restarts`` times, as many as the policy tolerates: ask the job to
    checkpoint and stop, and wait for its end (the engine then submits the policy's next attempt). The owner was
    read fresh by :meth:`AttemptRunner.after_wait`. A stop that cannot be sent is tried again after
    ``cancel_retry_s``."""
    reason = (
        f"{names.RESTART_LIMIT_MARK}the service restarted the job {status.restarts} time(s) inside this "
        f"attempt after spot interruptions ({status.reason or 'no reason given'}); the capacity policy runs "
        f"its next attempt instead; stopped by {runner.label}"
    )
    runner.engine.saw(record, status)  # its restarts, which the policy counts
    if not planned_stops.send(runner, record, names.PREEMPTED, reason):
        runner.stop.wait(runner.cancel_retry_s)
        return Wait(record)
    runner.log.warning(
        "%s was restarted %d time(s) by the service inside its attempt: asked it to checkpoint and stop; the "
        "capacity policy's next attempt is submitted once it has ended.",
        runner.describe_attempt(record),
        status.restarts,
    )
    return Wait(record)  # until the job has saved its checkpoint and ended


def restart_stop_end(record: AttemptRecord, status: JobStatus) -> JobStatus:
    """How the end of an attempt stopped at its restart limit is recorded (``record`` not yet updated with
    ``status``): a preemption the policy counted already in the restarts (``CANCELLED``, ``preempted``), whatever
    the service says, once the stop was confirmed (or the end carries its reason), unless the job succeeded before
    the stop took hold. Any other end (one of the job's own while its stop was never seen taken): ``status``."""
    if record.planned_stop != names.PREEMPTED or not status.state.terminal or status.state is JobState.SUCCEEDED:
        return status
    if not record.stop_confirmed and not stop_taken(status, names.PREEMPTED):
        return status
    reason = status.reason
    if not reason.startswith(names.RESTART_LIMIT_MARK):  # the service did not keep our words
        reason = (
            f"{names.RESTART_LIMIT_MARK}stopped after the service restarted the job "
            f"{max(record.restarts, status.restarts)} time(s) inside this attempt; it ended {status.state.value}: "
            f"{status.reason or 'no reason given'}"
        )
    ended = {
        "state": JobState.CANCELLED.value,
        "reason": reason,
        "interruption": names.PREEMPTED,
        "ended_at": status.ended_at or time.time(),
    }
    return JobStatus.from_dict({**status.to_dict(), **ended})
