"""The attempt loop's decisions, apart from Airflow: submit, wait, succeed or fail.

Given the attempt records of a task instance (refreshed with their current status), the latest
outcome and the capacity policy, :class:`AttemptEngine` says what happens next. It does no I/O:
the operator (worker or ``execute_complete``) carries the steps out. Hooks run before each submit
and on each status sample; a budget guard or a cost meter plugs in there.

The rules, in one place:

- a try starts by adopting what an earlier try left: an attempt still queued or running is
  reattached (the new try takes it over); a succeeded attempt whose result nobody collected is
  returned; an interrupted one goes to the policy; otherwise a new attempt is submitted;
- an attempt whose outcome a try already collected (it returned the result, or failed on it) is
  history: clearing a finished task runs the job again;
- an interruption (spot reclaim, capacity timeout, a job the service forgot) is absorbed by the
  policy until its budget is spent; a restart the service made inside an attempt (SageMaker managed
  spot) counts as a spot reclaim too, and once the policy would move on (``restart_limit``) the
  attempt is stopped and the policy's next attempt runs; a job's own failure goes to Airflow's retries; a deliberate
  stop (cancelled, budget spent) is final, Airflow does not retry it;
- only the try that owns an attempt may cancel it or submit its successor; the runner reads the
  owner from the service at that moment (``Backend.read_owner``), never from a poll's cache, and a
  try that finds a later owner stands down (``docs/explanations/ownership.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_provider.backends.base import JobState, JobStatus
from gpu_provider.backends.common import try_in_name
from gpu_provider.capacity import CapacityPolicy, Interruption
from gpu_provider.exceptions import (
    GpuJobCancelledError,
    GpuJobError,
    GpuJobFailedError,
    GpuJobInterruptionBudgetError,
)
from gpu_provider.names import CAPACITY_TIMEOUT, LOST, MOVED_TO_SPOT, NODE_FAULT, PREEMPTED, SPOT
from gpu_provider.records import AttemptRecord, AttemptSummary


@dataclass(frozen=True)
class Submit:
    """Submit attempt ``attempt`` on ``capacity`` after ``delay`` seconds (backoff after an interruption);
    ``instance_type``: the one the policy's instance fallback chose (``None``: the backend's choice)."""

    attempt: int
    capacity: str
    delay: float = 0.0
    instance_type: str | None = None
    rung: int | None = None
    """Under a capacity ladder: the rung (backend, options, overrides) the attempt runs on; ``None``: the task's."""


@dataclass(frozen=True)
class Wait:
    """Wait for this attempt to end."""

    record: AttemptRecord


@dataclass(frozen=True)
class Succeed:
    """The job succeeded with this attempt: collect its result."""

    record: AttemptRecord


@dataclass(frozen=True)
class Fail:
    """Stop this try with ``error`` (a :class:`GpuJobStoppedError` is final; others go to Airflow's retries).

    ``record`` is the attempt whose outcome this try consumed by failing on it (it is marked collected).
    """

    error: GpuJobError
    record: AttemptRecord | None = None


Step = Submit | Wait | Succeed | Fail

#: ``before_submit(step, records)``: may raise to stop the submission (a budget guard)
BeforeSubmit = Callable[[Submit, Sequence[AttemptRecord]], None]
#: ``on_status(record, status)``: sees every status sample the try takes (a cost meter)
OnStatus = Callable[[AttemptRecord, JobStatus], None]


def interruptions_of(records: Sequence[AttemptRecord]) -> list[Interruption]:
    """The interruptions of these attempts, oldest first: each restart the service made inside an attempt
    (a spot reclaim it absorbed), then the interruption that ended the attempt, unless that was the stop
    of an attempt restarted too often (:meth:`AttemptEngine.restart_limit`), which its restarts count already.
    A planned move back to spot (``moved_to_spot``) is no interruption: it is left out."""
    out = []
    for r in records:
        if r.interruption == MOVED_TO_SPOT:
            continue
        chosen = r.instance_choice
        out += [
            Interruption(attempt=r.attempt, capacity=r.capacity, kind=PREEMPTED, instance_type=chosen, rung=r.rung)
        ] * r.restarts
        stopped_for_restarts = r.restarts > 0 and r.state is JobState.CANCELLED and r.interruption == PREEMPTED
        if r.interruption and not stopped_for_restarts:
            out.append(
                Interruption(
                    attempt=r.attempt, capacity=r.capacity, kind=r.interruption, instance_type=chosen, rung=r.rung
                )
            )
    return out


def _run_cost(run: Sequence[AttemptRecord]) -> float | None:
    """USD of a run's attempts (the sum of their estimates), ``None`` when none has a price."""
    costs = [r.cost_usd for r in run if r.cost_usd is not None]
    return round(sum(costs), 6) if costs else None


def _move_saving(run: Sequence[AttemptRecord]) -> float | None:
    """USD the run's moves back to spot are estimated to save (``spot_return.saving_usd``); ``None``: none known."""
    savings = [
        float(r.spot_return["saving_usd"])
        for r in run
        if r.interruption == MOVED_TO_SPOT and r.spot_return and r.spot_return.get("saving_usd") is not None
    ]
    return round(sum(savings), 6) if savings else None


def describe(backend_name: str, record: AttemptRecord) -> str:
    # the attempt's own backend (a ladder's rung on another service), else the task's
    backend_name = record.handle.backend or backend_name
    return f"{backend_name} job {record.name} (id {record.job_id}, attempt {record.attempt}, {record.capacity})"


def started_by(record: AttemptRecord) -> int | None:
    """The Airflow try that submitted ``record``'s attempt: the record's, else the one in the job's name
    (:attr:`~gpu_provider.backends.base.JobIdentity.name`, for a job found by the backend's lookup)."""
    return record.try_number if record.try_number is not None else try_in_name(record.name)


def reattached(backend_name: str, record: AttemptRecord, found: str) -> str:
    """What the task log says when a try adopts a job it did not submit itself, in one wording on every
    backend and path (``found``: how it was found): ``Reattached to <backend> job <name> (started by try N;
    ...)``. A trigger rebuilt after a triggerer restart adopts nothing: it does not say it."""
    by = started_by(record)
    return (
        f"Reattached to {record.handle.backend or backend_name} job {record.name} (started by "
        f"{f'try {by}' if by is not None else 'an earlier try'}; id {record.job_id}, attempt {record.attempt}, "
        f"{record.capacity}), found {found}"
    )


def reason_clause(record: AttemptRecord) -> str:
    """The attempt's reason as a clause of a sentence, to be followed by a full stop: a reason that ends a
    sentence itself (Batch's ``Host EC2 (instance i-0abc) terminated.``) does not get a second one, and an
    ellipsis stays three dots."""
    reason = (record.reason or "no reason given").rstrip()
    return reason.removesuffix(".")


class AttemptEngine:
    """Decides the next step of one try of a task instance.

    :param records: every attempt record of the task instance, oldest first (the engine keeps and
        extends this list; the caller persists it)
    :param try_number: this Airflow try
    :param retries: the task's ``retries`` (for the message of a job's own failure)
    :param resumes: whether a new attempt resumes from a checkpoint (for messages)
    :param summary: the attempts already folded out of ``records`` (their numbers are not used again)
    :param instance_types: the task's ``resources.instance_types``, in order (for the policy's instance fallback)
    """

    def __init__(
        self,
        policy: CapacityPolicy,
        records: list[AttemptRecord],
        *,
        try_number: int,
        backend_name: str,
        retries: int = 0,
        resumes: bool = False,
        before_submit: Sequence[BeforeSubmit] = (),
        on_status: Sequence[OnStatus] = (),
        summary: AttemptSummary | None = None,
        instance_types: Sequence[str] = (),
    ) -> None:
        self.policy = policy
        self.instance_types = tuple(instance_types)
        self.records = records
        #: the attempts folded out of ``records`` (:func:`gpu_provider.records.compact`)
        self.summary = summary
        self.try_number = try_number
        self.backend_name = backend_name
        self.retries = retries
        self.resumes = resumes
        self.before_submit_hooks = list(before_submit)
        self.on_status_hooks = list(on_status)
        #: what the last interruption decision said (the operator logs it)
        self.note = ""

    # --- what the records say ------------------------------------------------------------------
    @property
    def current(self) -> list[AttemptRecord]:
        """The attempts of the job's current run: those after the last collected one."""
        last_collected = max((i for i, r in enumerate(self.records) if r.collected), default=-1)
        return self.records[last_collected + 1 :]

    def interruptions(self) -> list[Interruption]:
        """The interruptions ``max_interruptions`` counts and the capacity policy reads (node faults have
        their own budget: :meth:`after_node_fault`)."""
        return [i for i in interruptions_of(self.current) if i.kind != NODE_FAULT]

    def restart_limit(self, record: AttemptRecord) -> int | None:
        """How many restarts inside ``record``'s attempt the policy tolerates before its next attempt
        should run instead: the first count at which the policy would choose another capacity, or at
        which the interruption budget is spent. Each restart is a spot reclaim the service absorbed."""
        prior = [i for i in self.interruptions() if i.attempt != record.attempt]
        budget = self.policy.max_interruptions
        for restarts in range(1, budget + 2):
            restart = Interruption(attempt=record.attempt, capacity=record.capacity, kind=PREEMPTED, rung=record.rung)
            seen = prior + [restart] * restarts
            if len(seen) > budget or self.policy.capacity_after(seen) != record.capacity:
                return restarts
            if record.rung is not None and self.policy.rung_after(seen).rung != record.rung:  # a ladder moves on
                return restarts
        return None

    def record_for(self, job_id: str) -> AttemptRecord | None:
        return next((r for r in self.records if r.job_id == job_id), None)

    def duplicates(self, stored: set[str]) -> list[AttemptRecord]:
        """Live attempts beyond the one to keep (a re-sent submit, a zombie try's successor).

        One attempt of a task instance may be live: the newest live one the task state store
        knows, else the newest live one; and none when a later attempt already ended (a live
        attempt it superseded only bills).
        """
        current = self.current
        live = [r for r in current if r.state.active]
        if not live or (len(live) == 1 and live[0] is current[-1]):
            return []
        if not current[-1].state.active:
            return live
        known = [r for r in live if r.job_id in stored]
        keep = max(known or live, key=lambda r: (r.attempt, r.handle.submitted_at))
        return [r for r in live if r is not keep]

    # --- decisions -----------------------------------------------------------------------------
    def resume(self) -> Step:
        """The first step of a try, from the records refreshed with each attempt's current status."""
        current = self.current
        if not current:
            return self.next_submit()
        last = current[-1]
        if last.state.active:
            return Wait(last)
        if last.state is JobState.SUCCEEDED:
            return Succeed(last)
        if last.interruption:
            # interrupted while no worker watched: the policy and its budget decide, as if we had seen it
            return self.after_interruption(last)
        return self.next_submit()

    def ended(self, record: AttemptRecord, *, stopped_by_kill: bool = False) -> Step:
        """The step after ``record``'s attempt ended (its record already holds the final status)."""
        where = describe(self.backend_name, record)
        if record.state is JobState.SUCCEEDED:
            return Succeed(record)
        if record.owner_try is not None and record.owner_try > self.try_number:
            return Fail(
                GpuJobCancelledError(
                    f"{where} is now owned by Airflow try {record.owner_try}, which took it over; this try "
                    f"({self.try_number}) stops without touching it."
                )
            )
        if record.interruption:
            return self.after_interruption(record)
        if record.state is JobState.CANCELLED:
            if stopped_by_kill:
                return Fail(GpuJobCancelledError(f"{where} was cancelled because this task was killed."), record)
            return Fail(
                GpuJobCancelledError(
                    f"{where} was CANCELLED: {reason_clause(record)}. It was stopped outside this "
                    "task, on purpose, so Airflow does not retry it; clear the task to run it again."
                ),
                record,
            )
        if self.try_number <= self.retries:
            next_step = f"Airflow will retry it (retry {self.try_number} of {self.retries})" + (
                ", resuming from the latest checkpoint." if self.resumes else ", starting it again."
            )
        else:
            next_step = f"No Airflow retries are left (retries={self.retries})."
        exit_code = f" (exit code {record.exit_code})" if record.exit_code is not None else ""
        return Fail(
            GpuJobFailedError(
                f"{where} ended FAILED: {reason_clause(record)}{exit_code}. This is the job's own "
                f"error, not an interruption. {next_step}"
            ),
            record,
        )

    def after_interruption(self, record: AttemptRecord) -> Step:
        if record.interruption == NODE_FAULT:  # GPU hardware faults: their own budget and rule
            return self.after_node_fault(record)
        if record.interruption == MOVED_TO_SPOT:  # a planned move, not an interruption
            return self.after_move(record)
        where = describe(self.backend_name, record)
        interruptions = self.interruptions()
        budget = self.policy.max_interruptions
        what = {
            CAPACITY_TIMEOUT: f"{record.capacity} capacity did not come",
            LOST: "the service lost the job; treated as an interruption",
        }.get(str(record.interruption), "treated as a spot interruption")
        if len(interruptions) > budget:
            return Fail(
                GpuJobInterruptionBudgetError(
                    f"{where} ended {record.state.value}: {reason_clause(record)}. {what.capitalize()}, "
                    f"but this task has now been interrupted {len(interruptions)} times and its interruption budget "
                    f"(max_interruptions={budget}) is spent; not resubmitting, and Airflow does not retry this. "
                    "Raise max_interruptions or use capacity='on_demand', then clear the task."
                ),
                record,
            )
        step = self.next_submit(delay=self.policy.backoff_delay(len(interruptions)))
        on = self._where(step)
        if record.instance_choice and str(record.interruption) == CAPACITY_TIMEOUT:
            what = f"{record.capacity} capacity for {record.instance_choice} did not come"
        self.note = (
            f"{where} ended {record.state.value}: {reason_clause(record)}. {what.capitalize()}; "
            f"resubmitting on {on} (attempt {step.attempt}, interruption {len(interruptions)} of at "
            f"most {budget})" + (f" in {step.delay:.1f}s" if step.delay else "") + "."
        )
        return step

    # --- node faults (GPU hardware): their own budget, ``max_node_faults`` ----------------------
    def after_node_fault(self, record: AttemptRecord) -> Step:
        """A GPU hardware fault ended ``record``'s attempt: resubmit on fresh hardware and resume, within
        ``max_node_faults``; but the same fault on the attempt before too (fresh hardware already) makes
        it the job's own error after all, for Airflow's retries."""
        where = describe(self.backend_name, record)
        fault = record.fault or "unknown"
        faults = [r for r in self.current if r.interruption == NODE_FAULT]
        budget = self.policy.max_node_faults
        before = [r for r in self.current if r.attempt < record.attempt]
        if before and before[-1].interruption == NODE_FAULT and (before[-1].fault or "unknown") == fault:
            retry = (
                f"Airflow will retry it (retry {self.try_number} of {self.retries})."
                if self.try_number <= self.retries
                else f"No Airflow retries are left (retries={self.retries})."
            )
            return Fail(
                GpuJobFailedError(
                    f"{where} ended {record.state.value}: {reason_clause(record)}. The same GPU hardware fault "
                    f"({fault}) ended attempt {before[-1].attempt} too, on other hardware: treated as the job's own "
                    f"error, not a node fault. {retry}"
                ),
                record,
            )
        if len(faults) > budget:
            return Fail(
                GpuJobInterruptionBudgetError(
                    f"{where} ended {record.state.value}: {reason_clause(record)}. A GPU hardware fault ({fault}), "
                    f"but this task has now had {len(faults)} node faults and its budget (max_node_faults={budget}) is "
                    "spent; not resubmitting, and Airflow does not retry this. Raise max_node_faults, then clear "
                    "the task."
                ),
                record,
            )
        step = self.next_submit(delay=self.policy.backoff_delay(len(faults)))
        away = f" away from node {record.node}" if record.node else " on fresh hardware"
        self.note = (
            f"{where} ended {record.state.value}: {reason_clause(record)}. A GPU hardware fault ({fault}), not the "
            f"job's error; resubmitting{away} on {step.capacity} (attempt {step.attempt}, node fault {len(faults)} of "
            f"at most {budget})" + (f" in {step.delay:.1f}s" if step.delay else "") + "."
        )
        return step

    def next_submit(self, *, delay: float = 0.0) -> Submit:
        rung = self.policy.rung_after(self.interruptions(), self.instance_types)
        folded = (self.summary.last_attempt or 0) if self.summary else 0
        attempt = max((r.attempt for r in self.records), default=folded) + 1
        current = self.current
        if current and current[-1].interruption == MOVED_TO_SPOT and current[-1].state.terminal:
            # moved back to spot at a checkpoint: the next attempt runs on spot (the preferred type first; on a
            # ladder, on the spot rung the job was last on)
            moved = self.policy.rung_after_move([r.rung for r in current], self.instance_types)
            return Submit(
                attempt=attempt, capacity=SPOT, delay=delay, instance_type=moved.instance_type, rung=moved.rung
            )
        return Submit(
            attempt=attempt, capacity=rung.capacity, delay=delay, instance_type=rung.instance_type, rung=rung.rung
        )

    # --- back to spot when spot returns (``SpotFallback(spot_return=...)``): planned moves ------------
    def moves(self) -> list[AttemptRecord]:
        """The attempts of the current run the task moved back to spot (not interruptions)."""
        return [r for r in self.current if r.interruption == MOVED_TO_SPOT]

    def spot_return_watch(self, record: AttemptRecord, instance_types: Sequence[str] = ()) -> dict[str, Any] | None:
        """What ``record``'s wait needs to watch spot capacity (``None``: nothing to watch; see
        :meth:`gpu_provider.capacity.SpotReturn.watch_for`)."""
        # on a ladder: the spot rung a move would go to (its types, connection, region)
        return self.policy.spot_watch(record, self.current, instance_types or self.instance_types)

    def after_move(self, record: AttemptRecord) -> Step:
        """``record``'s attempt checkpointed and stopped because spot returned: the next attempt runs on spot."""
        step = self.next_submit()
        moves = len(self.moves())
        limit = self.policy.spot_return.max_moves if self.policy.spot_return is not None else moves
        decision = record.spot_return or {}
        saving = decision.get("saving_usd")
        why = str(decision.get("summary") or "spot capacity returned")
        worth = f"; estimated saving ${saving:.4f}" if isinstance(saving, (int, float)) else ""
        on = self._where(step)
        self.note = (
            f"{describe(self.backend_name, record)} checkpointed and stopped: {why}{worth}. Moving back to spot: "
            f"resubmitting on {on} (attempt {step.attempt}, planned move {moves} of at most {limit}; "
            "not an interruption)."
        )
        return step

    def capacity_wait(self, record: AttemptRecord) -> float | None:
        """How long ``record``'s attempt may wait for capacity (the policy's, per capacity and instance type)."""
        types = self.policy.types_for(record.rung, self.instance_types)  # the types of the attempt's own rung
        return self.policy.capacity_wait_for(record.capacity, record.instance_choice, types)

    def _where(self, step: Submit) -> str:
        """Where ``step``'s attempt runs, for a note: its capacity and type, or its ladder rung."""
        rung = self.policy.rung(step.rung)
        if rung is not None:
            return f"{rung.describe()} (ladder rung {step.rung})"
        return f"{step.capacity}, {step.instance_type}" if step.instance_type else step.capacity

    # --- hooks ---------------------------------------------------------------------------------
    def before_submit(self, step: Submit) -> None:
        for hook in self.before_submit_hooks:
            hook(step, self.records)

    def saw(self, record: AttemptRecord, status: JobStatus) -> None:
        """Take a status sample into the record and show it to the hooks."""
        record.update(status)
        for hook in self.on_status_hooks:
            hook(record, status)

    # --- the result ----------------------------------------------------------------------------
    def result(self, record: AttemptRecord, checkpoint_uri: str | None) -> dict[str, Any]:
        """What the task returns (XCom): the job's outcome over the attempts of its run that ``record`` ended."""
        end = self.records.index(record)
        start = max((i for i, r in enumerate(self.records[:end]) if r.collected), default=-1) + 1
        run = self.records[start : end + 1]
        return {
            "backend": record.handle.backend or self.backend_name,
            # every backend the run's attempts ran on, in order (several under a capacity ladder)
            "backends": list(dict.fromkeys(r.handle.backend or self.backend_name for r in run)),
            "job_id": record.job_id,
            "job_name": record.name,
            "state": record.state.value,
            "capacity": record.capacity,
            "attempts": [r.public() for r in run],
            "interruptions": len(interruptions_of(run)),
            "moves_to_spot": sum(1 for r in run if r.interruption == MOVED_TO_SPOT),
            "spot_return_saving_usd": _move_saving(run),
            "gpu_seconds": round(sum(r.gpu_seconds for r in run), 3),
            "gpu_hours": round(sum(r.gpu_seconds for r in run) / 3600.0, 6),
            "cost_usd": _run_cost(run),
            "checkpoint_uri": checkpoint_uri,
            "output_uri": record.output_uri,
        }
