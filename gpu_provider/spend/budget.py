"""What a task's job costs, and the guards that stop it costing more than it may.

:class:`SpendControl` plugs into the attempt engine's hooks (see
:mod:`gpu_provider.engine.attempts`): before each submit it compares the worst case with the
task's ``max_cost_usd`` and the team's monthly budget; on each status sample it prices the
attempt; when an attempt ends it writes one cost line to the task log, sends the metrics and adds
the cost to the team's month. :meth:`SpendControl.cost_limit` gives the wait (worker or trigger)
the running budget of an attempt, so a job whose cost crosses it is stopped.

The worst case of a submit, in USD::

    spent by the earlier attempts of this run
    + price per GPU-hour (the dearest capacity the policy may use) x GPUs (all nodes)
      x max runtime in hours x attempts left (1 + max_interruptions + max_node_faults
      + spot_return.max_moves + retries, less those made)

Team monthly budgets (``[gpu_provider] team_monthly_budget_usd``, JSON ``{"team": USD}``, and the
``monthly_budget_usd`` of the teams in the ``[gpu_provider] quota_file``; the former wins for a team
in both) are summed over the attempts of the team's tasks that ended in the calendar month (UTC), kept in the
Airflow Variable ``gpu_provider_spend_<YYYY-MM>`` (JSON ``{"team": USD}``, updated as each attempt
ends). A submit is refused when that sum plus the submit's worst case (only what is bounded: an
attempt without a max runtime adds nothing) passes the budget. When that Variable cannot be read,
every submit warns and goes ahead as if nothing was spent, or, with ``[gpu_provider]
budget_fail_closed = True``, is refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpu_provider.backends.base import Backend, JobStatus
from gpu_provider.exceptions import GpuJobBudgetError, GpuJobError
from gpu_provider.job import GpuResources
from gpu_provider.spend.prices import Price, PriceBook, PriceNotFoundError, attempt_cost

if TYPE_CHECKING:
    from gpu_provider.capacity import CapacityPolicy
    from gpu_provider.engine.attempts import Submit
    from gpu_provider.records import AttemptRecord

#: Airflow Variable holding the month's spend per team (the month is appended: ``..._2026-12``)
SPEND_VARIABLE_PREFIX = "gpu_provider_spend_"
#: the largest ``max_cost_usd`` accepted
MAX_COST_USD = 10_000_000.0


def check_max_cost(value: Any) -> float | None:
    """``max_cost_usd=`` as a positive number of US dollars, or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_COST_USD:
        raise ValueError(f"max_cost_usd={value!r} must be a number of US dollars above 0 and at most {MAX_COST_USD:g}")
    return float(value)


def parse_team_budgets(text: str) -> dict[str, float]:
    """``[gpu_provider] team_monthly_budget_usd``: JSON ``{"team": USD per calendar month}``."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f'[gpu_provider] team_monthly_budget_usd must be JSON like {{"vision": 5000, "nlp": 20000}}: {err}'
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"[gpu_provider] team_monthly_budget_usd must be a JSON object of team to USD, not {data!r}")
    out = {}
    for team, usd in data.items():
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or usd < 0:
            raise ValueError(f"[gpu_provider] team_monthly_budget_usd[{team!r}]={usd!r} must be USD, 0 or more")
        out[str(team)] = float(usd)
    return out


def month_key(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else time.time(), tz=timezone.utc).strftime("%Y-%m")


class SpendLedgerError(GpuJobError):
    """The month's spend per team could not be read (see :meth:`SpendLedger.read`)."""


class SpendLedger:
    """The month's spend per team, in an Airflow Variable (through the Task SDK: no metadata DB access).

    Read-modify-write without a lock: two attempts ending in the same instant may lose one update,
    so the sum can run a little low under heavy concurrency (documented in docs/explanations/known-limits.md).
    """

    def __init__(self, month: str | None = None) -> None:
        self.key = SPEND_VARIABLE_PREFIX + (month or month_key())

    def read(self) -> dict[str, float]:
        """The month's spend per team; ``{}`` when nothing was recorded yet.

        :raises SpendLedgerError: the Variable cannot be read, or is not a JSON object of team to USD
            (the caller decides: warn and go on, or refuse; see ``[gpu_provider] budget_fail_closed``)
        """
        from airflow.sdk import Variable

        try:
            raw = Variable.get(self.key, default=None)
        except Exception as err:
            raise SpendLedgerError(
                f"the Airflow Variable {self.key} could not be read: {type(err).__name__}: {err}"
            ) from err
        if raw is None or raw == "":
            return {}
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
            return {str(k): float(v) for k, v in data.items()}
        except (TypeError, ValueError) as err:
            raise SpendLedgerError(
                f'the Airflow Variable {self.key} is not a JSON object of team to USD (like {{"vision": 120.5}}): {err}'
            ) from err

    def add(self, team: str, usd: float) -> None:
        """Add ``usd`` to ``team``'s month; an unreadable ledger raises :class:`SpendLedgerError` and is
        left as it is (never overwritten with this one team's figure)."""
        from airflow.sdk import Variable

        data = self.read()
        data[team] = round(data.get(team, 0.0) + usd, 6)
        Variable.set(self.key, json.dumps(data, sort_keys=True))


def configured_budgets() -> dict[str, float]:
    """The teams' monthly budgets: the quota file's ``monthly_budget_usd``, with ``[gpu_provider]
    team_monthly_budget_usd`` taking precedence per team."""
    from gpu_provider.backends.base import provider_config

    quotas = None
    if provider_config("quota_file"):  # its module is imported where a quota file is configured, not by every task
        from gpu_provider.quotas.file import configured_quotas

        quotas = configured_quotas()
    return {**(quotas.budgets() if quotas else {}), **parse_team_budgets(provider_config("team_monthly_budget_usd"))}


def configured_ledger() -> SpendLedger | None:
    """The month's ledger where team budgets are configured (else nothing keeps a month's spend)."""
    return SpendLedger() if configured_budgets() else None


class SpendControl:
    """Prices one task's attempts and guards its budgets (see the module docstring).

    :param log: the task's logger (the cost line of each attempt goes there)
    """

    def __init__(
        self,
        backend: Backend,
        resources: GpuResources,
        policy: CapacityPolicy,
        *,
        log: Any,
        team: str | None = None,
        max_cost_usd: float | None = None,
        max_runtime_s: float | None = None,
        retries: int = 0,
        book: PriceBook | None = None,
        team_budgets: Mapping[str, float] | None = None,
        ledger: SpendLedger | None = None,
        emit_metrics: bool = True,
        budget_fail_closed: bool = False,
    ) -> None:
        self.backend = backend
        self.resources = resources
        self.policy = policy
        self.log = log
        self.team = team
        self.max_cost_usd = max_cost_usd
        self.max_runtime_s = max_runtime_s
        self.retries = retries
        self.book = book or PriceBook.from_config()
        self.team_budgets = dict(team_budgets or {})
        self.ledger = ledger
        self.emit_metrics = emit_metrics
        #: refuse a submit when the team's spend cannot be read (else warn and go on as if $0 was spent)
        self.budget_fail_closed = budget_fail_closed
        try:
            self._region = backend.price_region()
        except Exception:  # no region configured anywhere: priced in the default region, and said so
            self._region = None
        self._warned: set[str] = set()
        #: a capacity ladder's rungs: the backend and resources an attempt is priced with, ``None`` for the
        #: task's own (set by the operator; every attempt is priced on the service and region it ran in)
        self.rung_of: Callable[[AttemptRecord], tuple[Backend, GpuResources] | None] = lambda record: None
        #: a capacity ladder's rungs, in order: the backend, resources and capacity of each (the worst case of a
        #: submit is the dearest rung's price; a step is priced on its own rung)
        self.rung_places: list[tuple[Backend, GpuResources, str]] = []
        self._rung_regions: dict[str, str | None] = {}

    @classmethod
    def from_config(
        cls, backend: Backend, resources: GpuResources, policy: CapacityPolicy, **kwargs: Any
    ) -> SpendControl:
        from gpu_provider.backends.base import provider_config
        from gpu_provider.job import to_bool

        budgets = configured_budgets()
        fail_closed = provider_config("budget_fail_closed")
        kwargs.setdefault(
            "budget_fail_closed",
            to_bool("[gpu_provider] budget_fail_closed", fail_closed) if fail_closed else False,
        )
        return cls(
            backend, resources, policy, team_budgets=budgets, ledger=SpendLedger() if budgets else None, **kwargs
        )

    # --- prices ---------------------------------------------------------------------------------
    def price(self, capacity: str, instance_type: str | None = None) -> Price:
        return self.book.job_price(
            self.resources, capacity, self._region, self.backend.price_catalog, instance_type=instance_type
        )

    def _price_or_none(self, capacity: str, instance_type: str | None = None) -> Price | None:
        try:
            return self.price(capacity, instance_type)
        except PriceNotFoundError as err:
            if str(err) not in self._warned:
                self._warned.add(str(err))
                self.log.warning("No cost estimate: %s", err)
            return None

    def place_price(
        self, backend: Backend, resources: GpuResources, capacity: str, instance_type: str | None = None
    ) -> Price:
        """The price of an attempt on ``backend`` (a capacity ladder's rung: its catalog and region)."""
        key = repr(sorted(backend.spec().items()))
        if key not in self._rung_regions:
            try:
                self._rung_regions[key] = backend.price_region()
            except Exception:  # no region configured: the default region's price, as for the task's backend
                self._rung_regions[key] = None
        region = self._rung_regions[key]
        return self.book.job_price(resources, capacity, region, backend.price_catalog, instance_type=instance_type)

    def attempt_price(self, record: AttemptRecord) -> Price | None:
        """The price of ``record``'s attempt: on its own rung's backend and region under a capacity ladder."""
        place = self.rung_of(record)
        if place is None:
            return self._price_or_none(record.capacity, record.instance_type)
        try:
            return self.place_price(*place, record.capacity, record.instance_type)
        except PriceNotFoundError as err:
            if str(err) not in self._warned:
                self._warned.add(str(err))
                self.log.warning("No cost estimate: %s", err)
            return None

    def attempt_terms(self) -> list[tuple[str, int]]:
        """What bounds a run's attempts: every interruption, GPU hardware fault and planned move back to spot
        the policy absorbs is one more attempt, each Airflow retry another."""
        terms = [("max_interruptions", self.policy.max_interruptions), ("max_node_faults", self.policy.max_node_faults)]
        if self.policy.spot_return is not None:
            terms.append(("spot_return.max_moves", self.policy.spot_return.max_moves))
        return [*terms, ("retries", self.retries)]

    def attempts_allowed(self) -> int:
        return 1 + sum(count for _, count in self.attempt_terms())

    def worst_case(self, step: Submit, records: Sequence[AttemptRecord]) -> tuple[float, str]:
        """USD the run may cost at most if this submit goes ahead, and the arithmetic in words
        (only with a max runtime: without one the worst case has no bound)."""
        prices = [self.price(capacity) for capacity in sorted(self.policy.may_use)]
        if self.rung_places:  # a capacity ladder: every rung at its own service's price
            prices = [
                self.place_price(backend, resources, capacity) for backend, resources, capacity in self.rung_places
            ]
        dearest = max(prices, key=lambda p: p.usd_per_gpu_hour)
        spent = sum(r.cost_usd or 0.0 for r in records)
        left = max(1, self.attempts_allowed() - len(records))
        hours = (self.max_runtime_s or 0.0) / 3600.0
        gpus = self.resources.total_gpus
        per_attempt = dearest.usd_per_gpu_hour * gpus * hours
        total = spent + per_attempt * left
        bounds = " + ".join(f"{name} {count}" for name, count in self.attempt_terms())
        text = (
            f"${dearest.usd_per_gpu_hour:.4f}/GPU-hour ({dearest.instance_type} {dearest.capacity}"
            f"{' in ' + dearest.region if dearest.region else ''}, {dearest.source}) x {gpus:g} GPU(s) x "
            f"{hours:.2f} h max runtime x {left} attempt(s) left of {self.attempts_allowed()} (1 + "
            f"{bounds}) + ${spent:.2f} spent by earlier attempts "
            f"= ${total:.2f}"
        )
        return total, text

    # --- hooks ----------------------------------------------------------------------------------
    def before_submit(self, step: Submit, records: Sequence[AttemptRecord]) -> None:
        """Refuse a submit whose worst case passes ``max_cost_usd`` or the team's monthly budget."""
        last_collected = max((i for i, r in enumerate(records) if r.collected), default=-1)
        current = list(records[last_collected + 1 :])
        if self.max_cost_usd is not None and not self.max_runtime_s:
            spent = sum(r.cost_usd or 0.0 for r in current)
            if spent >= self.max_cost_usd:
                raise GpuJobBudgetError(
                    f"Not submitting attempt {step.attempt}: earlier attempts of this run already cost ${spent:.2f}, "
                    f"max_cost_usd=${self.max_cost_usd:.2f}. Airflow does not retry this."
                )
            self.log.info(
                "No max_runtime: the worst case of attempt %d has no bound; it is stopped if its cost crosses "
                "the $%.2f left of max_cost_usd=$%.2f.",
                step.attempt,
                self.max_cost_usd - spent,
                self.max_cost_usd,
            )
        elif self.max_cost_usd is not None:
            try:
                total, text = self.worst_case(step, current)
            except PriceNotFoundError as err:
                raise GpuJobBudgetError(
                    f"max_cost_usd={self.max_cost_usd:g} cannot be checked: {err}. Not submitting attempt "
                    f"{step.attempt}."
                ) from err
            if total > self.max_cost_usd:
                raise GpuJobBudgetError(
                    f"Not submitting attempt {step.attempt}: its worst case passes "
                    f"max_cost_usd=${self.max_cost_usd:.2f}: "
                    f"{text}. Lower max_runtime, GPUs or max_interruptions, or raise max_cost_usd; Airflow does not "
                    "retry this."
                )
            self.log.info("Budget check passed: worst case %s <= max_cost_usd=$%.2f.", text, self.max_cost_usd)
        self._check_team(step, current)

    def _check_team(self, step: Submit, current: Sequence[AttemptRecord]) -> None:
        if not self.team or self.team not in self.team_budgets or self.ledger is None:
            return
        budget = self.team_budgets[self.team]
        try:
            spent = self.ledger.read().get(self.team, 0.0)
        except SpendLedgerError as err:
            if self.budget_fail_closed:
                raise GpuJobBudgetError(
                    f"Not submitting attempt {step.attempt}: team {self.team!r}'s monthly budget of ${budget:.2f} "
                    f"cannot be checked: {err}. [gpu_provider] budget_fail_closed = True refuses a submit whose "
                    f"team budget cannot be checked: fix or delete the Variable {self.ledger.key}, or set "
                    "budget_fail_closed = False to submit with a warning instead."
                ) from err
            # fail open, but never silently: every submit says so
            self.log.warning(
                "Team %r's monthly budget of $%.2f is NOT checked for attempt %d: %s. Submitting as if the team "
                "had spent $0 this month ([gpu_provider] budget_fail_closed = False; set it to True to refuse "
                "instead).",
                self.team,
                budget,
                step.attempt,
                err,
            )
            spent = 0.0
        bounded = 0.0
        if self.max_runtime_s:
            price = self._price_or_none(step.capacity, step.instance_type)  # the type chosen, if one was
            if step.rung is not None and 0 <= step.rung < len(self.rung_places):  # a ladder's rung: its own price
                try:
                    price = self.place_price(*self.rung_places[step.rung][:2], step.capacity, step.instance_type)
                except PriceNotFoundError:
                    price = None
            if price is not None:
                bounded = price.usd_per_gpu_hour * self.resources.total_gpus * self.max_runtime_s / 3600.0
        if spent + bounded > budget:
            raise GpuJobBudgetError(
                f"Not submitting attempt {step.attempt}: team {self.team!r} has spent ${spent:.2f} of its monthly "
                f"budget of ${budget:.2f} this month ({self.ledger.key}), and this attempt may cost up to "
                f"${bounded:.2f} more. Raise [gpu_provider] team_monthly_budget_usd or wait for next month."
            )

    def on_status(self, record: AttemptRecord, status: JobStatus) -> None:
        """Price the attempt from its latest sample; when it has ended, report it once."""
        record.nodes = self.resources.nodes
        price = self.attempt_price(record)
        if price is not None:
            record.price = price.to_dict()
            record.cost_usd = round(
                attempt_cost(
                    price,
                    gpu_seconds=record.gpu_seconds,
                    nodes=record.nodes,
                    billable_seconds=record.billable_seconds,
                ),
                6,
            )
        if status.started_at is not None:
            record.queue_wait_s = round(max(0.0, status.started_at - record.handle.submitted_at), 3)
        elif status.state.terminal and status.ended_at is not None and record.queue_wait_s is None:
            record.queue_wait_s = round(max(0.0, status.ended_at - record.handle.submitted_at), 3)
        if status.state.terminal and not record.reported:
            record.reported = True
            self.report(record)

    def report(self, record: AttemptRecord) -> None:
        """The attempt's cost line in the task log, its metrics, and the team's month."""
        backend_name = record.handle.backend or self.backend.name  # the attempt's own (a ladder's rung)
        self.log.info("%s", cost_line(backend_name, record))
        if self.emit_metrics:
            from gpu_provider.spend.metrics import emit_attempt

            emit_attempt(record, team=self.team, backend=backend_name)
        if self.ledger is not None and self.team and record.cost_usd:
            try:
                self.ledger.add(self.team, record.cost_usd)
            except Exception as err:  # the budget is a guard, not the job: never fail the task for it
                self.log.warning("Could not add $%.4f to team %s's monthly spend: %s", record.cost_usd, self.team, err)

    def kill_report(self, record: AttemptRecord) -> dict[str, Any]:
        """What a deferred attempt's trigger needs to report the attempt's end when a kill stops it
        (:func:`gpu_provider.spend.ended.report_stopped`): the team, the nodes and the price."""
        price = self._price_or_none(record.capacity, record.instance_type)
        return {"team": self.team, "nodes": self.resources.nodes, "price": price.to_dict() if price else None}

    def cost_limit(self, record: AttemptRecord, records: Sequence[AttemptRecord]) -> dict[str, float] | None:
        """The running budget of ``record``'s attempt, for the wait: ``None`` without ``max_cost_usd``."""
        if self.max_cost_usd is None:
            return None
        price = self._price_or_none(record.capacity, record.instance_type)
        if price is None:
            return None
        last_collected = max((i for i, r in enumerate(records) if r.collected), default=-1)
        spent = sum(r.cost_usd or 0.0 for r in records[last_collected + 1 :] if r is not record)
        return {
            "usd_per_gpu_second": price.usd_per_gpu_hour / 3600.0,
            "remaining_usd": max(0.0, self.max_cost_usd - spent),
            "max_cost_usd": self.max_cost_usd,
            "spent_usd": round(spent, 6),
        }


def cost_line(backend: str, record: AttemptRecord) -> str:
    """One attempt's figures, one line: what the task log shows for every attempt."""
    price = record.price or {}
    cost = f"${record.cost_usd:.4f}" if record.cost_usd is not None else "cost unknown (no price)"
    rate = f" at ${price['usd_per_gpu_hour']:.4f}/GPU-hour ({price.get('source')})" if price else ""
    instance = record.instance_type or price.get("instance_type") or "-"
    return (
        f"Attempt {record.attempt} cost: {backend} job {record.name} on {instance} {record.capacity} x "
        f"{record.nodes} node(s), {record.started_at or 'never started'} -> {record.ended_at or '-'}, "
        f"{record.state.value}; {record.gpu_hours:.4f} GPU-hours, {cost}{rate}; queued "
        f"{record.queue_wait_s if record.queue_wait_s is not None else '-'}s."
    )


__all__ = [
    "SpendControl",
    "SpendLedger",
    "SpendLedgerError",
    "check_max_cost",
    "cost_line",
    "parse_team_budgets",
]
