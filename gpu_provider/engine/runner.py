"""The service side of one try: recover earlier attempts, wait, act on a wait's outcome, collect.

:class:`AttemptRunner` carries out what :class:`~gpu_provider.engine.attempts.AttemptEngine`
decides, through the backend contract only. It knows nothing of Airflow: the operator hands it a
logger, a stop event (set by ``on_kill``), and callbacks that save the records and show a status's
log link.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gpu_provider import names
from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus
from gpu_provider.engine.attempts import AttemptEngine, Fail, Step, Submit, Wait, describe
from gpu_provider.engine.calls import cancel_within, poll_one, read_owner
from gpu_provider.engine.fresh import RECHECKED, still_holds
from gpu_provider.engine.logs import LogForwarder
from gpu_provider.engine.places import backend_of, poll_where_they_run, recover
from gpu_provider.engine.planned_stops import stop_sent
from gpu_provider.engine.restart_stops import restart_stop_end, stop_at_restart_limit
from gpu_provider.engine.spot_moves import move_to_spot, spot_watch
from gpu_provider.engine.wake import WaitWake
from gpu_provider.engine.watch import (
    BUDGET,
    CAPACITY_TIMEOUT,
    DEADLINE,
    ENDED,
    NEVER_STARTS,
    QUEUE_TIMEOUT,
    RESTART_LIMIT,
    SPOT_RETURNED,
    AttemptWatch,
    interrupted,
)
from gpu_provider.exceptions import (
    GpuJobBudgetError,
    GpuJobCancelledError,
    GpuJobDeadlineError,
    GpuJobError,
    GpuJobFailedError,
    GpuJobPollError,
    GpuJobStatusError,
)
from gpu_provider.records import AttemptRecord, compact

#: lines of a failed job's output quoted in the task's error
OUTPUT_TAIL_LINES = 20
#: after giving up on status reads with no retry left: the longest the owner read and the cancel may take
GIVE_UP_READ_S = 10.0
GIVE_UP_CANCEL_S = 60.0
#: once the job's log says it is ending (asked to stop, a node's end-of-log marker) but the service does not yet:
#: seconds between the sync wait's status reads instead of the poll interval, for at most ENDING_POLLS reads
ENDING_POLL_S = 1.0
ENDING_POLLS = 30

# imported from here by other modules (defined in engine/calls.py and engine/places.py)
__all__ = ["AttemptRunner", "backend_of", "cancel_within", "poll_one", "read_owner", "recover"]


class AttemptRunner:
    """Carries out one try's steps on a backend.

    :param label: names the task and run in reasons given to the service ("Airflow task d.t of run r")
    :param persist: saves the records (the task state store); called after every change
    :param on_status: sees every status sample of the sync wait (the operator updates its log link)
    :param capacity_wait: the policy's ``spot_wait_timeout`` (applies to spot attempts)
    :param queue_timeout: how long any other attempt may stay queued
    :param execution_timeout: the task's, for messages
    :param cancel_retry_s: pause before giving up a capacity wait again after its cancel failed
    :param cost_limit: the running budget of an attempt's wait (``None``: no budget), see
        :meth:`gpu_provider.spend.budget.SpendControl.cost_limit`
    :param max_records: the most attempt records kept; older history is folded into the engine's
        summary (:func:`gpu_provider.records.compact`). ``None``: no cap
    :param rungs: a capacity ladder's backends, by rung index: each attempt is submitted, watched, stopped
        and collected on its own backend (:meth:`backend_for`)
    """

    def __init__(
        self,
        backend: Backend,
        engine: AttemptEngine,
        *,
        log: Any,
        label: str,
        stop: threading.Event,
        persist: Callable[[list[AttemptRecord]], None],
        on_status: Callable[[JobStatus], None] = lambda status: None,
        capacity_wait: float | None = None,
        queue_timeout: float | None = None,
        execution_timeout: Any = None,
        cancel_retry_s: float = 5.0,
        cost_limit: Callable[[AttemptRecord], dict[str, float] | None] = lambda record: None,
        max_records: int | None = None,
        rungs: Sequence[Backend] = (),
    ) -> None:
        #: a capacity ladder's backends, by rung index (empty: every attempt runs on ``backend``)
        self.rungs = list(rungs)
        self.cost_limit = cost_limit
        self.max_records = max_records
        self.backend = backend
        self.engine = engine
        self.log = log
        self.label = label
        self.stop = stop
        self._persist = persist
        self.on_status = on_status
        self.capacity_wait_s = capacity_wait
        self.queue_timeout_s = queue_timeout
        self.execution_timeout = execution_timeout
        self.cancel_retry_s = cancel_retry_s
        #: why the last owner read failed (for messages)
        self.owner_error = ""
        #: the task's ``resources.instance_types`` (what a ``SpotReturn`` reads spot capacity for)
        self.spot_types: tuple[str, ...] = ()
        #: the reading that said "move back to spot" (the wait's, or the trigger event's)
        self.spot_decision: dict[str, Any] | None = None
        #: ends the sync wait's sleep when the backend's event source names the job (see engine/wake.py)
        self.wake = WaitWake(backend, log)
        #: an interrupted attempt's log, whose late lines are read once the next attempt is submitted
        self.unsettled: LogForwarder | None = None
        #: the log reader of the last wait: a wait on the same attempt again (after a stop it asked for) goes on
        self.followed: LogForwarder | None = None
        #: the attempts whose planned stop this process sent (a planned stop it did not send is sent again)
        self.stops_sent: set[str] = set()

    def persist(self) -> None:
        """Save the records, the oldest history folded into the engine's summary past ``max_records``."""
        if self.max_records is not None:
            self.engine.summary = compact(self.engine.records, self.engine.summary, self.max_records)
        self._persist(self.engine.records)

    def describe_attempt(self, record: AttemptRecord) -> str:
        """The attempt in words: its backend, name, id, attempt number and capacity."""
        return describe(self.backend.name, record)

    def backend_for(self, record: AttemptRecord) -> Backend:
        """The backend of ``record``'s attempt: its own (a ladder's rung), else the task's."""
        return backend_of(self.backend, record, self.rungs)

    def backend_for_rung(self, rung: int | None) -> Backend:
        """The backend a new attempt on ``rung`` is submitted to (the task's when there is no ladder)."""
        if rung is None or not 0 <= rung < len(self.rungs):
            return self.backend
        return self.rungs[rung]

    # --- limits of one attempt's wait ------------------------------------------------------------
    def capacity_wait(self, record: AttemptRecord) -> float | None:
        if record.instance_choice is not None:  # instance fallback: the policy's wait for this capacity and type
            return self.engine.capacity_wait(record)
        return self.capacity_wait_s if record.capacity == names.SPOT else None

    def queue_timeout(self, record: AttemptRecord) -> float | None:
        return self.queue_timeout_s if self.capacity_wait(record) is None else None

    def restart_limit(self, record: AttemptRecord) -> int | None:
        """Restarts inside the attempt after which it is stopped (only where the service restarts jobs)."""
        restarts_inside = self.backend_for(record).capabilities.restarts_inside_job
        if not restarts_inside or stop_sent(self, record):  # a stop taken or sent: its wait only waits for the end
            return None
        return self.engine.restart_limit(record)

    # --- at the start of a try -------------------------------------------------------------------
    def cancel_duplicates(self, stored: set[str]) -> None:
        """Two live attempts of one task instance (a re-sent submit, a zombie try): keep one, cancel the rest."""
        for extra in self.engine.duplicates(stored):
            if self.owned_later(extra):
                self.log.warning(
                    "Leaving %s alone: Airflow try %s owns it.", self.describe_attempt(extra), extra.owner_try
                )
                continue
            reason = f"duplicate attempt of {self.label}; another attempt of the task is kept"
            self.log.warning("Found a second live attempt, %s: cancelling it.", self.describe_attempt(extra))
            if self.cancel(extra, reason):
                extra.update(JobStatus(state=JobState.CANCELLED, reason=reason, ended_at=time.time()))
                extra.collected = True
        if self.engine.records or self.engine.summary is not None:  # a first try has nothing to save yet
            self.persist()

    # --- ownership, read fresh before anything destructive ----------------------------------------
    def owned_later(self, record: AttemptRecord) -> bool | None:
        """Whether a later Airflow try owns ``record``'s job, read from the service now
        (:meth:`Backend.read_owner`); ``None`` when that cannot be read. A later owner is kept in the record."""
        try:
            read = self.backend_for(record).read_owner(record.handle)
        except Exception as err:
            self.owner_error = f"{type(err).__name__}: {err}"
            self.log.warning("Could not read who owns %s now: %s", self.describe_attempt(record), self.owner_error)
            return None
        if read.later_than(self.engine.try_number):
            record.owner_try = read.owner_try
            return True
        return False

    def stand_down(self, record: AttemptRecord) -> NoReturn:
        """A later try owns ``record``: this try (a zombie Airflow replaced) stops, touching nothing
        (no cancel, no resubmission, no write to the task state store its successor uses)."""
        raise GpuJobCancelledError(
            f"{self.describe_attempt(record)} is now owned by Airflow try {record.owner_try}, which took it over; "
            f"this try ({self.engine.try_number}) stops without touching it."
        )

    def check_submit(self, step: Submit) -> None:
        """Before a resubmission (``step`` follows an attempt that ended): the attempt it replaces must
        not belong to a later try, read now. A later try owns it: stand down. Unreadable while this try
        owns that attempt (the case of a zombie): submit nothing on a guess. Unreadable while an earlier
        try owned it (a retry resuming, e.g. on a worker that cannot see another machine's local job):
        this try is the newest known, and goes on."""
        current = self.engine.current
        if not current:
            return
        previous = current[-1]
        owned = self.owned_later(previous)
        if owned:
            self.stand_down(previous)
        if owned is None and previous.owner_try is not None and previous.owner_try >= self.engine.try_number:
            raise GpuJobPollError(
                f"could not read who owns {self.describe_attempt(previous)} before submitting attempt {step.attempt} "
                f"({self.owner_error}); nothing was submitted on a guess. A retry of this task will look again."
            )

    def take_over(self, record: AttemptRecord) -> None:
        """This try owns ``record`` from now on: a zombie earlier try must not cancel it or resubmit.

        The owner is read fresh first: when a later try owns the job already, this try is the zombie
        and stands down; when it cannot be read, nothing is taken over on a guess (the try fails and
        a retry looks again)."""
        owned = self.owned_later(record)
        if owned:
            self.stand_down(record)
        if owned is None:
            raise GpuJobPollError(
                f"could not read who owns {self.describe_attempt(record)} ({self.owner_error}), so this try did not "
                "take it over. The job may still be running: a retry of this task will look again."
            )
        record.owner_try = self.engine.try_number
        try:
            self.backend_for(record).mark(record.handle, owner_try=self.engine.try_number)
        except Exception as err:  # the store keeps the owner too
            self.log.warning("Could not mark job %s as owned by try %d: %s", record.job_id, record.owner_try, err)
        self.persist()

    # --- waiting ---------------------------------------------------------------------------------
    def wait(self, record: AttemptRecord, poll_interval: float) -> tuple[JobStatus, str]:
        """Poll in the worker until the attempt ends or a wait limit passes; stream its log meanwhile.

        Between polls it sleeps ``poll_interval``, less when the backend's event source says the job changed
        (:class:`~gpu_provider.engine.wake.WaitWake`). An attempt that ended by an interruption returns at once:
        its late log lines are read after the next attempt is submitted (:meth:`settle_log`)."""
        self.settle_log()  # the attempt before this one, now that this one is submitted
        handle = record.handle
        backend = self.backend_for(record)
        # the task's backend's events end the sleep; a ladder's attempt on another service polls only
        wakes = backend is self.backend
        if wakes:
            self.wake.follow(handle)
        watch = AttemptWatch(
            backend,
            handle,
            capacity_wait=self.capacity_wait(record),
            queue_timeout=self.queue_timeout(record),
            log=self.log,
            restart_limit=self.restart_limit(record),
            cost_limit=self.cost_limit(record),
            settle_interrupted=False,
        )
        if self.followed is not None and self.followed.handle.job_id == handle.job_id:
            watch.logs = self.followed  # no line copied into the task log twice
        self.followed = watch.logs
        spot = spot_watch(self, record)
        ending_polls = 0
        while not self.stop.is_set():
            try:
                status = backend.poll([handle])[handle.job_id]
                if isinstance(status, GpuJobStatusError):
                    raise status
            except Exception as err:
                give_up = watch.failed_read(err)
                if give_up:
                    raise GpuJobPollError(give_up) from err  # the operator decides: gave_up_reading
                self.wake.sleep(poll_interval, self.stop)
                continue
            self.on_status(status)
            outcome = watch.read(status)
            if outcome is not None:
                if watch.unsettled:
                    self.unsettled = watch.logs
                status = watch.complete(status)
                declared_wins = not status.output_uri or backend.service_output
                if status.state is JobState.SUCCEEDED and watch.output_uri and declared_wins:
                    status = JobStatus.from_dict({**status.to_dict(), "output_uri": watch.output_uri})
                return status, outcome
            if spot is not None and spot.due():  # back to spot: a reading every check_every, on-demand only
                decision = spot.check(status, self.log)
                if decision is not None:
                    self.spot_decision = decision
                    return status, SPOT_RETURNED
            # the job's own log says its end is near: look again soon, not after a whole interval (bounded)
            soon = watch.logs.ending and ending_polls < ENDING_POLLS and poll_interval > ENDING_POLL_S
            ending_polls += soon
            pause = ENDING_POLL_S if soon else poll_interval
            if wakes:
                self.wake.sleep(pause, self.stop)
            else:
                self.stop.wait(pause)
        # killed: on_kill cancelled the job; stop polling at once
        raise GpuJobCancelledError(f"{self.describe_attempt(record)} was cancelled because this task was killed.")

    def settle_log(self) -> None:
        """Read the late log lines of an interrupted attempt whose wait ended without them (the next attempt
        was submitted first, so the wait for them no longer delays it)."""
        logs, self.unsettled = self.unsettled, None
        if logs is not None:
            logs.settle()

    def copy_ended_log(self, handle: JobHandle, status: JobStatus, backend: Backend | None = None) -> None:
        """After a deferred wait whose trigger did not copy the log: copy the ended attempt's log (read from
        ``backend``, the attempt's own; default the task's) into the task log now, or, when an interruption ended
        it, once the next attempt is submitted (:meth:`settle_log`)."""
        logs = LogForwarder(backend or self.backend, handle, self.log)
        if interrupted(status):
            self.unsettled = logs
        else:
            logs.settle()

    def close(self) -> None:
        """The try's steps are over (it succeeded, failed or deferred): read what is left of an interrupted
        attempt's log and stop listening to the backend's events."""
        try:
            self.settle_log()
        finally:
            self.wake.close()

    def after_wait(self, record: AttemptRecord, status: JobStatus, outcome: str) -> Step:
        """What a wait's outcome means: an ended job goes to the engine; a wait limit stops the job first, once
        this try owns it (read first) and a fresh read shows the condition still holds (:mod:`.fresh`)."""
        engine = self.engine
        if outcome != ENDED:  # each of these stops the job: only its owner may, read now (before all else)
            owned = self.owned_later(record)
            if owned:
                self.stand_down(record)
            if owned is None and outcome in (CAPACITY_TIMEOUT, RESTART_LIMIT, SPOT_RETURNED):
                # a new attempt would follow the stop: nothing on a guess; look again after a pause
                self.stop.wait(self.cancel_retry_s)
                return Wait(record)
            # unreadable before a stop that ends this try (queue timeout, deadline, budget): the try
            # stops it as its owner, as on_kill does, rather than leave it billing for nobody
        if outcome in RECHECKED:
            fresh = poll_one(self.backend_for(record), record.handle)
            if fresh is None:  # no fresh evidence: nothing on a guess; look again after a pause
                self.log.warning(
                    "Could not read %s now to confirm its %s: not stopping it.", self.describe_attempt(record), outcome
                )
                self.stop.wait(self.cancel_retry_s)
                return Wait(record)
            limit, budget = self.restart_limit(record), self.cost_limit(record)
            if not still_holds(outcome, fresh, restart_limit=limit, cost_limit=budget):
                self.log.info(
                    "%s is %s now (%s): its %s no longer holds, so it is not stopped.",
                    self.describe_attempt(record),
                    fresh.state.value,
                    fresh.reason or "read from the service now",
                    outcome,
                )
                if fresh.state.terminal:
                    return self.after_wait(record, fresh, ENDED)
                engine.saw(record, fresh)
                self.persist()
                return Wait(record)
            status = fresh
        if outcome == SPOT_RETURNED:
            return move_to_spot(self, record)
        if outcome == CAPACITY_TIMEOUT:
            what, option = record.capacity, "spot_wait_timeout"
            if record.instance_choice is not None:
                what = f"{record.capacity} {record.instance_choice}"
                option = "spot_wait_timeout" if record.capacity == names.SPOT else "capacity_wait"
            reason = (
                f"{names.CAPACITY_TIMEOUT_MARK}no {what} capacity after {self.capacity_wait(record) or 0:.0f}s "
                f"waiting ({option}); given up by {self.label}"
            )
            if not self.cancel(record, reason):
                # never leave a queued job nobody watches: keep waiting on it, and give the cancel another go
                self.stop.wait(self.cancel_retry_s)
                return Wait(record)
            engine.saw(record, JobStatus(state=JobState.CANCELLED, reason=reason, ended_at=time.time()))
            record.interruption = names.CAPACITY_TIMEOUT
        elif outcome == RESTART_LIMIT:
            return stop_at_restart_limit(self, record, status)  # then waits for the end, as a move to spot does
        elif outcome == BUDGET:
            return self._over_budget(record, status)
        elif outcome == NEVER_STARTS:
            return self._never_starts(record, status)
        elif outcome in (QUEUE_TIMEOUT, DEADLINE):
            what = (
                f"still queued after queue_timeout={self.queue_timeout_s or 0:.0f}s"
                if outcome == QUEUE_TIMEOUT
                else f"still running when the task's execution_timeout ({self.execution_timeout}) ran out"
            )
            cancelled = self.cancel(record, f"{what}; cancelled by {self.label}")
            engine.saw(record, JobStatus(state=JobState.CANCELLED, reason=what, ended_at=time.time()))
            self.persist()
            tail = "" if cancelled else " Cancelling it failed: stop it by hand."
            error = GpuJobDeadlineError(
                f"{self.describe_attempt(record)} was {what}; it was cancelled and this try fails.{tail}"
            )
            return Fail(error, record)
        else:
            if status.never_starts and status.state.terminal:
                self._remove_unstarted(record, status)
            engine.saw(record, restart_stop_end(record, status))  # a planned stop's end: see planned_stops.py
        self.persist()
        return engine.ended(record, stopped_by_kill=self.stop.is_set())

    # --- back to spot when spot returns (``SpotFallback(spot_return=SpotReturn(...))``) -----------------
    def _remove_unstarted(self, record: AttemptRecord, status: JobStatus) -> None:
        """The backend's verdict on an attempt that never started is final (it can never start, or it
        waited past the backend's own startup limit), but the service still holds it: this try, the
        owner (read fresh), removes it. Without fresh evidence it is left alone, and said so."""
        fresh = poll_one(self.backend_for(record), record.handle)
        if fresh is None or not fresh.never_starts:
            if fresh is None:
                self.log.warning(
                    "%s ended before it started (%s), but its owner could not be read now: left alone.",
                    self.describe_attempt(record),
                    status.never_starts,
                )
            return
        owned = self.owned_later(record)
        if owned is None or owned:
            self.log.warning(
                "%s ended before it started, but %s: left alone.",
                self.describe_attempt(record),
                f"Airflow try {record.owner_try} owns it" if owned else "its owner could not be read now",
            )
            return
        mark = names.UNRUNNABLE_MARK if status.state is JobState.FAILED else ""
        self.cancel(record, f"{mark}{fresh.never_starts}")

    def gave_up_reading(self, record: AttemptRecord, why: str, *, retry: str | None) -> Fail:
        """The wait gave up reading the attempt's status (``why``). With an Airflow retry to come (``retry``
        says which), the job is left running and the retry reattaches to it; with none, nobody would
        watch it again, so it is cancelled (in bounded time) unless a fresh read shows another try owns it."""
        where = self.describe_attempt(record)
        if retry is not None:
            return Fail(
                GpuJobPollError(
                    f"{where}: {why}. The job was left running: Airflow's retry ({retry}) reattaches to it, reads "
                    "its status again and waits for it; it does not submit a second job while this one lives."
                )
            )
        owner = read_owner(self.backend_for(record), record.handle, timeout=GIVE_UP_READ_S)
        if owner is not None and owner.later_than(self.engine.try_number):
            return Fail(
                GpuJobPollError(
                    f"{where}: {why}. Airflow try {owner.owner_try} owns the job now, so this try leaves it running."
                )
            )
        reason = f"{why}; no Airflow retry left to watch it; cancelled by {self.label}"
        cancelled = cancel_within(self.backend_for(record), record.handle, reason, GIVE_UP_CANCEL_S)
        if cancelled is None:
            self.engine.saw(record, JobStatus(state=JobState.CANCELLED, reason=reason, ended_at=time.time()))
            self.persist()
            done = "it was cancelled, so that it does not keep running (and billing) with nobody watching it"
        else:
            self.log.warning("Could not cancel %s: %s", where, cancelled)
            done = f"cancelling it failed too ({cancelled}): it may still be running, so stop it by hand" + (
                f" ({url})" if (url := self.backend_for(record).console_url(record.handle)) else ""
            )
        return Fail(
            GpuJobPollError(f"{where}: {why}. No Airflow retry is left to watch the job, so {done}."),
            record if cancelled is None else None,
        )

    def _never_starts(self, record: AttemptRecord, fresh: JobStatus) -> Step:
        """The service says (read fresh by :meth:`after_wait`) the queued attempt can never start as submitted:
        if this try still owns it, stop it and fail (it would hold its queue forever)."""
        engine = self.engine
        if fresh.owner_try is not None and fresh.owner_try > engine.try_number:
            engine.saw(record, fresh)
            self.persist()
            return Fail(
                GpuJobCancelledError(
                    f"{self.describe_attempt(record)} can never start ({fresh.never_starts}), but Airflow try "
                    f"{fresh.owner_try} owns it, not this try ({engine.try_number}): it is left to its owner."
                )
            )
        reason = f"{names.UNRUNNABLE_MARK}{fresh.never_starts}; stopped by {self.label}"
        if not self.cancel(record, reason):
            self.stop.wait(self.cancel_retry_s)
            return Wait(record)
        ended = {"state": JobState.FAILED.value, "reason": fresh.never_starts, "ended_at": time.time()}
        engine.saw(record, JobStatus.from_dict({**fresh.to_dict(), **ended}))
        self.persist()
        error = GpuJobFailedError(
            f"{self.describe_attempt(record)} can never start: the service says {fresh.never_starts}. This try, "
            "which owns the job, cancelled it instead of letting it wait in the queue forever, and fails. Fix the "
            "job's resources (gpus, cpu, memory) or the compute environments behind its queue, then clear the task."
        )
        return Fail(error, record)

    def _over_budget(self, record: AttemptRecord, status: JobStatus) -> Step:
        """The attempt's running cost crossed the task's budget: stop the job, and the try (not retried)."""
        engine = self.engine
        limit = self.cost_limit(record) or {}
        max_cost = float(limit.get("max_cost_usd") or 0.0)
        reason = f"its running cost crossed max_cost_usd=${max_cost:.2f}; stopped by {self.label}"
        cancelled = self.cancel(record, reason)
        engine.saw(record, status)  # prices the attempt at the sample that crossed the budget
        engine.saw(record, JobStatus(state=JobState.CANCELLED, reason="max_cost_usd reached", ended_at=time.time()))
        self.persist()
        spent = float(limit.get("spent_usd") or 0.0)
        tail = "" if cancelled else " Cancelling it failed: stop it by hand."
        error = GpuJobBudgetError(
            f"{self.describe_attempt(record)} was stopped because its running cost crossed the task's budget: "
            f"${record.cost_usd or 0.0:.4f} for this attempt ({record.gpu_hours:.4f} GPU-hours at "
            f"${float(limit.get('usd_per_gpu_second') or 0.0) * 3600:.4f}/GPU-hour) + ${spent:.4f} spent by earlier "
            f"attempts >= max_cost_usd=${max_cost:.2f}. Airflow does not retry this; raise max_cost_usd and clear "
            f"the task to run it again.{tail}"
        )
        return Fail(error, record)

    # --- the end of a try ------------------------------------------------------------------------
    def explain(self, step: Fail) -> GpuJobError:
        """The error a failing try raises: a job's own failure quotes the last lines of its output, so
        the cause (``No module named ...``) is in the task's error, not only an exit code."""
        record = step.record
        if not isinstance(step.error, GpuJobFailedError) or record is None or record.state is not JobState.FAILED:
            return step.error
        try:
            tail = self.backend_for(record).output_tail(record.handle, OUTPUT_TAIL_LINES)
        except Exception as err:  # the error stands without them
            self.log.warning("Could not read the end of %s's output: %s", self.describe_attempt(record), err)
            return step.error
        if not tail:
            return step.error
        quoted = "\n".join(f"    {line}" for line in tail)
        return GpuJobFailedError(f"{step.error}\nThe last {len(tail)} lines of the job's output:\n{quoted}")

    def succeed(self, record: AttemptRecord, checkpoint_uri: str | None) -> dict[str, Any]:
        """Collect a succeeded attempt: its declared output (read from its log if not seen yet), the result."""
        backend = self.backend_for(record)
        if not record.output_uri or backend.service_output:
            reader = LogForwarder(backend, record.handle, self.log, copy=False)
            reader.pump(drain=True)
            record.output_uri = reader.output_uri or record.output_uri
        self.settle_earlier(record)
        self.collect(record)
        result = self.engine.result(record, checkpoint_uri)
        self.log.info(
            "%s SUCCEEDED after %d attempt(s); %.1f GPU-seconds in all.",
            self.describe_attempt(record),
            len(result["attempts"]),
            result["gpu_seconds"],
        )
        return result

    def settle_earlier(self, record: AttemptRecord) -> None:
        """Read once more the earlier attempts of this run whose end this try caused but did not see
        (one stopped after restarts inside the job): the service reports their billable time only
        once they have stopped. One status call; a failure leaves the records as they are."""
        pending = [
            r for r in self.engine.current if r is not record and r.state.terminal and r.billable_seconds is None
        ]
        pending = [r for r in pending if self.backend_for(r).capabilities.restarts_inside_job]
        if not pending:
            return
        try:
            statuses = poll_where_they_run(pending, self.backend_for)  # each from its own backend
        except Exception as err:
            self.log.info("Could not read the final figures of earlier attempts: %s", err)
            return
        for r in pending:
            status = statuses.get(r.job_id)
            if isinstance(status, JobStatus) and status.state.terminal:
                r.billable_seconds = status.billable_seconds
                r.training_seconds = status.training_seconds
                r.gpu_seconds = round(max(r.gpu_seconds, status.gpu_seconds), 3)

    def collect(self, record: AttemptRecord | None) -> None:
        """The task instance's run of the job ended with ``record`` (it succeeded, or the try failed for
        good): mark it collected, so a cleared task runs the job anew; ``None`` only saves the records."""
        if record is not None and record.state.terminal and record.owner_try in (None, self.engine.try_number):
            record.collected = True
            try:
                self.backend_for(record).mark(record.handle, collected=True)
            except Exception as err:  # the store keeps the mark too
                self.log.warning("Could not mark job %s as collected on the service: %s", record.job_id, err)
        self.persist()

    def cancel(self, record: AttemptRecord, reason: str) -> bool:
        try:
            self.backend_for(record).cancel(record.handle, reason)
            return True
        except Exception as err:
            self.log.warning("Could not cancel %s: %s", self.describe_attempt(record), err)
            return False
