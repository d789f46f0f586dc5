"""Issue 28: a week of spot interruptions and capacity gaps, replayed for one training task under each capacity setup.

Two parts, both seeded and fast (a week replays in milliseconds):

1. **A trace generator** (:func:`generate`). For every *pool* (a service, a capacity type and an instance type,
   e.g. ``batch/spot/p5.48xlarge``) it draws, over :data:`HOURS` hours from Monday 00:00 UTC:

   - *capacity gaps*: alternating available and unavailable periods, available ~ Exponential(mean A),
     unavailable ~ LogNormal(median U, sigma :data:`GAP_SIGMA`), first period available with probability
     A / (A + mean unavailable) (:data:`GAPS`);
   - *spot interruptions* (spot pools only): a Poisson process of reclaims per running instance, at
     :data:`SPOT_RECLAIMS_PER_HOUR` times a factor of the hour of day, ``1 + 0.5 cos(2 pi (h - 18) / 24)``
     (x1.5 at 18:00 UTC, US working hours; x0.5 at 06:00 UTC), drawn by thinning.

   The start of a spot gap reclaims a spot instance running in that pool too (its capacity went away);
   on-demand instances are never taken back (on-demand pools have gaps, no interruptions). Each pool draws
   from its own generator, seeded by ``"<seed>/<pool>"``, so adding a pool does not change the others.
   Prices come from the provider's price book (``gpu_provider.spend.prices.PriceBook``: the shipped table,
   us-east-1; spot = on-demand x ``spot_price_ratio`` 0.4), the EC2 catalog for Batch and SageMaker's
   ``ml.`` catalog for SageMaker. The trace (seed, distributions, prices, every gap and reclaim) is JSON:
   :func:`write_trace` / :func:`read_trace`, so a run can be replayed exactly (``--trace FILE``).

2. **A discrete-event replay** (:func:`replay`) of one training task (:class:`Task`: ``work_h`` hours of
   work on one p5.48xlarge, a checkpoint every ``checkpoint_every_h`` of an attempt's running time, a
   start-up per service, a speed per instance type). Every decision comes from the provider's own objects:
   the next attempt's capacity and instance type from the attempt engine (``AttemptEngine.next_submit``,
   which asks the policy's ``CapacityPolicy.rung_after`` and sends the attempt after a planned move to spot),
   a ladder's rung from ``Ladder.rung_after``, how long it may wait for capacity from ``capacity_wait_for``,
   the backoff from ``backoff_delay`` (seeded) and the budget from ``budget_left``; while an attempt runs on
   on-demand, the spot-return watch (``SpotReturn.watch_for``, ``SpotReturnWatch.check``) reads spot capacity
   every ``check_every`` from the trace (:class:`TraceEc2`: EC2's two answers, a placement score and a
   price) and decides whether to move it. The replay only plays the trace: an attempt starts when its pool
   has capacity (or times out after its wait), is billed per second from its start, works after its
   start-up, and ends at the task's end, at the first reclaim, or at a move. Work since the last
   checkpoint is redone (``--checkpoint-at-notice``: the job saves at the notice, as the runtime helper
   does when the notice leaves it the time; a move goes through the same notice path).

Configurations (:data:`CONFIGS`), every one with ``max_interruptions=20`` (a week of reclaims must not spend
the budget) and spot waits of 10 minutes, as the example pipeline has them: **on-demand only** (``OnDemand``);
**spot, then on-demand on one service** (``SpotFallback(after_preemptions=1)`` on Batch: today);
**the same + instance fallback** (composed with ``InstanceFallback``, p5 -> p4d -> g6e, on-demand waiting 15
minutes per type but the last); both again **+ back to spot** (``spot_return=SpotReturn(...)``, its
defaults, the task's 40 hours as ``expected_runtime``), and once more with ``max_moves=10``; and
**ladders** across services (``Ladder`` of ``LadderRung``: Batch spot -> SageMaker managed spot ->
SageMaker or Batch on-demand, and one whose rungs also step through instance types); and **instance fallback +
ladder + back to spot as one policy**: ``Ladder(Batch spot, SageMaker spot, Batch on-demand,
instances=InstanceFallback(...), spot_return=SpotReturn(...))``, each rung trying p5, p4d, g6e in order (and the
same ladder on p5 alone with back to spot, to tell the pieces' shares apart).

Usage: ``python benchmarks/capacity_trace.py [--quick] [--seeds N] [--trace-dir DIR] [--trace FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpu_provider.backends.base import JobHandle, JobState, JobStatus  # noqa: E402
from gpu_provider.capacity import (  # noqa: E402
    CapacityPolicy,
    InstanceFallback,
    Ladder,
    LadderRung,
    OnDemand,
    SpotFallback,
    SpotReturn,
)
from gpu_provider.capacity.spot_return import SpotReturnWatch  # noqa: E402
from gpu_provider.engine.attempts import AttemptEngine, Submit, interruptions_of  # noqa: E402
from gpu_provider.names import CAPACITY_TIMEOUT, MOVED_TO_SPOT, ON_DEMAND, PREEMPTED, SPOT  # noqa: E402
from gpu_provider.records import AttemptRecord  # noqa: E402
from gpu_provider.spend.prices import EC2, SAGEMAKER, PriceBook  # noqa: E402

TRACE_FORMAT = "gpu_provider capacity trace 1"
#: a week, from Monday 00:00 UTC
HOURS = 168.0
#: the price book's region for every pool
REGION = "us-east-1"
#: the services a pool may belong to, and the price catalog of each
SERVICES: dict[str, str] = {"batch": EC2, "sagemaker": SAGEMAKER}
#: the instance types, in the order of preference instance fallback uses
INSTANCE_TYPES = ("p5.48xlarge", "p4d.24xlarge", "g6e.48xlarge")
P5, P4D, G6E = INSTANCE_TYPES
#: spot reclaims per running instance-hour at the daily mean (x the hour-of-day factor)
SPOT_RECLAIMS_PER_HOUR = {"p5.48xlarge": 0.08, "p4d.24xlarge": 0.05, "g6e.48xlarge": 0.03}
#: the hour-of-day factor: 1 + DIURNAL_AMPLITUDE * cos(2 pi (h - DIURNAL_PEAK_H) / 24)
DIURNAL_AMPLITUDE = 0.5
DIURNAL_PEAK_H = 18.0
#: capacity gaps per (capacity, instance type): (mean available hours, median unavailable hours)
GAPS: dict[str, dict[str, tuple[float, float]]] = {
    SPOT: {"p5.48xlarge": (10.0, 3.0), "p4d.24xlarge": (16.0, 2.0), "g6e.48xlarge": (30.0, 1.0)},
    ON_DEMAND: {"p5.48xlarge": (48.0, 2.0), "p4d.24xlarge": (72.0, 1.0), "g6e.48xlarge": (200.0, 0.5)},
}
#: the spread of an unavailable period (sigma of its logarithm)
GAP_SIGMA = 0.8


def diurnal_factor(hour: float) -> float:
    """The hour-of-day factor of the spot reclaim rate at ``hour`` (hours since Monday 00:00 UTC)."""
    return 1.0 + DIURNAL_AMPLITUDE * math.cos(2.0 * math.pi * ((hour % 24.0) - DIURNAL_PEAK_H) / 24.0)


def pool_key(service: str, capacity: str, instance_type: str) -> str:
    return f"{service}/{capacity}/{instance_type}"


def model() -> dict[str, Any]:
    """The distributions a trace is drawn from, as written into it."""
    return {
        "hours": HOURS,
        "hour_0": "Monday 00:00 UTC",
        "spot_reclaims": {
            "process": "Poisson per running instance, rate = base x hour-of-day factor (thinning)",
            "base_per_hour": SPOT_RECLAIMS_PER_HOUR,
            "hour_of_day_factor": f"1 + {DIURNAL_AMPLITUDE} cos(2 pi (h - {DIURNAL_PEAK_H:g}) / 24)",
            "also": "the start of a spot gap reclaims a running spot instance of that pool",
        },
        "gaps": {
            "process": "alternating periods; available ~ Exponential(mean A h), "
            f"unavailable ~ LogNormal(median U h, sigma {GAP_SIGMA}); first period available with "
            "probability A / (A + mean unavailable)",
            "A_U_hours": {capacity: {t: list(v) for t, v in by_type.items()} for capacity, by_type in GAPS.items()},
        },
        "services": "batch and sagemaker pools draw independently from the same distributions",
        "prices": f"gpu_provider PriceBook(), shipped table, {REGION}; spot = on-demand x spot_price_ratio",
    }


def _gaps(rng: random.Random, mean_up: float, median_down: float, hours: float) -> list[list[float]]:
    mean_down = median_down * math.exp(GAP_SIGMA**2 / 2.0)
    up = rng.random() < mean_up / (mean_up + mean_down)
    t, out = 0.0, []
    while t < hours:
        if up:
            t += rng.expovariate(1.0 / mean_up)
        else:
            end = t + rng.lognormvariate(math.log(median_down), GAP_SIGMA)
            out.append([round(t, 6), round(min(end, hours), 6)])
            t = end
        up = not up
    return out


def _reclaims(rng: random.Random, base: float, hours: float) -> list[float]:
    peak = base * (1.0 + DIURNAL_AMPLITUDE)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(peak)
        if t >= hours:
            return out
        if rng.random() * peak < base * diurnal_factor(t):
            out.append(round(t, 6))


def generate(seed: int, *, hours: float = HOURS, prices: PriceBook | None = None) -> dict[str, Any]:
    """A trace of ``hours`` for every pool, drawn from :func:`model`'s distributions with ``seed``."""
    book = prices or PriceBook()
    pools: dict[str, Any] = {}
    for service, catalog in SERVICES.items():
        for capacity in (SPOT, ON_DEMAND):
            for itype in INSTANCE_TYPES:
                key = pool_key(service, capacity, itype)
                rng = random.Random(f"{seed}/{key}")
                mean_up, median_down = GAPS[capacity][itype]
                price = book.instance_price(itype, capacity, REGION, catalog)
                pools[key] = {
                    "usd_per_hour": round(price.usd_per_hour, 6),
                    "price_source": price.source,
                    "unavailable": _gaps(rng, mean_up, median_down, hours),
                    "reclaims": _reclaims(rng, SPOT_RECLAIMS_PER_HOUR[itype], hours) if capacity == SPOT else [],
                }
    return {"format": TRACE_FORMAT, "seed": seed, "model": model(), "hours": hours, "pools": pools}


def write_trace(trace: Mapping[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(trace, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_trace(path: Path) -> dict[str, Any]:
    trace = dict(json.loads(path.read_text(encoding="utf-8")))
    if trace.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path}: format={trace.get('format')!r} is not a capacity trace; expected {TRACE_FORMAT!r}")
    return trace


# --- the replay -------------------------------------------------------------------------------------


class Pool:
    """One pool of a trace: when it has capacity, when it takes a running instance back, and its price."""

    def __init__(self, key: str, data: Mapping[str, Any], hours: float) -> None:
        self.key = key
        self.hours = hours
        self.usd_per_hour = float(data["usd_per_hour"])
        self.gaps = [(float(s), float(e)) for s, e in data["unavailable"]]
        self._gap_starts = [s for s, _ in self.gaps]
        # a spot instance is taken back at a reclaim, or when its pool's capacity goes (a gap starts)
        self.spot = key.split("/")[1] == SPOT
        self.ends = sorted([float(t) for t in data["reclaims"]] + (self._gap_starts if self.spot else []))

    def next_available(self, t: float) -> float | None:
        """The first time from ``t`` with capacity; ``None``: none within the trace."""
        k = bisect_right(self._gap_starts, t) - 1
        if k >= 0 and self.gaps[k][0] <= t < self.gaps[k][1]:
            t = self.gaps[k][1]
        return t if t < self.hours else None

    def next_reclaim(self, t: float) -> float | None:
        """The first time after ``t`` at which an instance of this pool running since ``t`` is taken back."""
        k = bisect_right(self.ends, t)
        return self.ends[k] if k < len(self.ends) else None


@dataclass(frozen=True)
class Task:
    """The training task: ``work_h`` hours of work on one p5.48xlarge (8 H100), checkpointed as it goes.

    :param work_h: the work, in hours on the reference type (p5.48xlarge, speed 1)
    :param checkpoint_every_h: a checkpoint every this much of an attempt's running time (after start-up)
    :param startup_h: per service: from the instance's start (billed) to the job's first step, restore included
    :param speed: per instance type: work-hours per hour, relative to p5.48xlarge
    :param checkpoint_at_notice: the job saves a checkpoint when told it is being reclaimed (nothing redone)
    """

    work_h: float = 40.0
    checkpoint_every_h: float = 0.5
    startup_h: Mapping[str, float] = field(default_factory=lambda: {"batch": 5 / 60, "sagemaker": 8 / 60})
    speed: Mapping[str, float] = field(
        default_factory=lambda: {"p5.48xlarge": 1.0, "p4d.24xlarge": 0.45, "g6e.48xlarge": 0.35}
    )
    checkpoint_at_notice: bool = False


@dataclass(frozen=True)
class Config:
    """A capacity setup: the policy the task gives (made fresh per replay), its service and instance types."""

    name: str
    policy: Callable[[], CapacityPolicy]
    service: str = "batch"
    instance_types: tuple[str, ...] = (INSTANCE_TYPES[0],)


@dataclass
class Attempt:
    number: int
    service: str
    capacity: str
    instance_type: str
    submitted_h: float
    ended_h: float
    outcome: str  # "succeeded" | PREEMPTED | CAPACITY_TIMEOUT | MOVED_TO_SPOT | "waiting", "running" (trace ended)
    started_h: float | None = None
    usd_per_hour: float = 0.0
    work_done_h: float = 0.0
    work_kept_h: float = 0.0
    choice: str | None = None
    """The instance type the policy chose (instance fallback); ``None``: the task's or the rung's only one."""
    rung: int | None = None
    """Under a :class:`Ladder`: the rung the attempt ran on."""
    move: dict[str, Any] | None = None
    """For ``outcome="moved_to_spot"``: the decision of the spot-return watch (its reading and saving)."""

    @property
    def billed_h(self) -> float:
        return self.ended_h - self.started_h if self.started_h is not None else 0.0

    @property
    def cost_usd(self) -> float:
        return self.billed_h * self.usd_per_hour

    @property
    def work_redone_h(self) -> float:
        return self.work_done_h - self.work_kept_h


@dataclass
class Outcome:
    config: str
    seed: int
    start_h: float
    finished: bool
    end_h: float
    attempts: list[Attempt]
    why: str = ""

    @property
    def completion_h(self) -> float:
        return self.end_h - self.start_h

    @property
    def cost_usd(self) -> float:
        return sum(a.cost_usd for a in self.attempts)

    @property
    def work_redone_h(self) -> float:
        return sum(a.work_redone_h for a in self.attempts)

    @property
    def moves(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == MOVED_TO_SPOT)

    @property
    def started(self) -> int:
        return sum(1 for a in self.attempts if a.started_h is not None)

    @property
    def reclaims(self) -> int:
        return sum(1 for a in self.attempts if a.outcome == PREEMPTED)

    @property
    def spot_share(self) -> float:
        """The share of the work kept that ran on spot."""
        kept = sum(a.work_kept_h for a in self.attempts)
        return sum(a.work_kept_h for a in self.attempts if a.capacity == SPOT) / kept if kept else 0.0


_STATES = {
    "succeeded": JobState.SUCCEEDED,
    PREEMPTED: JobState.PREEMPTED,
    CAPACITY_TIMEOUT: JobState.CANCELLED,
    MOVED_TO_SPOT: JobState.CANCELLED,
}


def records_of(attempts: Sequence[Attempt], now_h: float) -> tuple[list[AttemptRecord], float]:
    """The attempts as the engine's records, and the Unix time of hour 0 they are stamped from: chosen so that
    ``now_h`` is the wall clock's now, since the spot-return decisions read ``time.time()`` (cooldown, work left)."""
    base = time.time() - now_h * 3600.0

    def stamp(h: float | None) -> str | None:
        return None if h is None else datetime.fromtimestamp(base + h * 3600.0, tz=timezone.utc).isoformat()

    out = []
    for a in attempts:
        handle = JobHandle(a.service, f"replay-{a.number}", f"replay-{a.number}", a.number, a.capacity, base)
        record = AttemptRecord.new(handle, try_number=1)
        record.instance_choice, record.instance_type, record.rung = a.choice, a.instance_type, a.rung
        record.started_at = stamp(a.started_h)
        if a.outcome in _STATES:
            record.state, record.ended_at = _STATES[a.outcome], stamp(a.ended_h)
            record.interruption = a.outcome if a.outcome != "succeeded" else None
            record.spot_return = a.move
        else:
            record.state = JobState.RUNNING if a.started_h is not None else JobState.QUEUED
        out.append(record)
    return out, base


def where(policy: CapacityPolicy, step: Submit, config: Config) -> tuple[str, str]:
    """The service and instance type of the next attempt: under a :class:`Ladder`, the backend of the rung the
    engine chose (``Submit.rung``) and the type its instance fallback chose, else the rung's one type; without a
    ladder, the configuration's service and the policy's choice (or the task's first type)."""
    if not isinstance(policy, Ladder):
        return config.service, step.instance_type or config.instance_types[0]
    ladder_rung = policy.rung(step.rung)
    assert ladder_rung is not None, step.rung
    types = policy.types_for(step.rung, config.instance_types)
    if ladder_rung.backend_name not in SERVICES or (step.instance_type is None and len(types) != 1):
        raise ValueError(
            f"{config.name}: ladder rung {step.rung} ({ladder_rung.backend_name}, {list(types)}): the replay plays "
            f"rungs on {', '.join(SERVICES)} with one instance type each, or several under instances="
        )
    return ladder_rung.backend_name, (step.instance_type or types[0]).removeprefix("ml.")


class TraceEc2:
    """EC2's spot readings as the trace has them at one moment, for the spot-return watch (the two calls
    ``SpotCapacitySensor`` makes): a placement score of :data:`SCORE_AVAILABLE` in the region while one of the
    asked types' spot pools has capacity, :data:`SCORE_SCARCE` while none has; the pool's spot price."""

    SCORE_AVAILABLE = 9
    SCORE_SCARCE = 2

    def __init__(self, pools: Mapping[str, Pool], service: str, now_h: float) -> None:
        self.pools, self.service, self.now_h = pools, service, now_h

    def _pool(self, instance_type: str) -> Pool:
        return self.pools[pool_key(self.service, SPOT, instance_type)]

    def get_spot_placement_scores(self, **request: Any) -> dict[str, Any]:
        up = any(self._pool(t).next_available(self.now_h) == self.now_h for t in request["InstanceTypes"])
        score = self.SCORE_AVAILABLE if up else self.SCORE_SCARCE
        return {"SpotPlacementScores": [{"Region": r, "Score": score} for r in request["RegionNames"]]}

    def describe_spot_price_history(self, **request: Any) -> dict[str, Any]:
        now = datetime.now(timezone.utc)
        return {
            "SpotPriceHistory": [
                {
                    "InstanceType": t,
                    "AvailabilityZone": f"{REGION}a",
                    "SpotPrice": str(self._pool(t).usd_per_hour),
                    "Timestamp": now,
                }
                for t in request["InstanceTypes"]
            ]
        }


def moved_at(
    policy: CapacityPolicy,
    attempts: list[Attempt],
    pools: Mapping[str, Pool],
    types: Sequence[str],
    until_h: float,
) -> tuple[float, dict[str, Any]] | None:
    """When the running on-demand attempt (the last of ``attempts``) is moved back to spot before ``until_h``, and
    the decision; ``None``: never. Each ``check_every`` the policy's own watch (``AttemptEngine.spot_return_watch``:
    ``SpotReturn.watch_for``, under a ladder ``Ladder.spot_watch`` for the spot rung a move goes to;
    ``SpotReturnWatch.check``) reads the trace's EC2 (of that rung's service) and decides; the first reading comes
    ``check_every`` after the attempt's submission, as the wait's does."""
    spot_return = policy.spot_return
    attempt = attempts[-1]
    if spot_return is None or attempt.capacity != ON_DEMAND or attempt.started_h is None:
        return None
    every = spot_return.check_every_s / 3600.0
    check = attempt.submitted_h + every * max(1, math.ceil((attempt.started_h - attempt.submitted_h) / every))
    on_demand = {t: pools[pool_key(attempt.service, ON_DEMAND, t)].usd_per_hour for t in INSTANCE_TYPES}
    while check < until_h:
        records, base = records_of(attempts, check)
        engine = AttemptEngine(policy, records, try_number=1, backend_name=attempt.service, instance_types=types)
        watch = engine.spot_return_watch(records[-1])
        if watch is None:  # nothing to watch: max_moves spent
            return None
        target = policy.rung(watch.get("rung")) if isinstance(policy, Ladder) else None
        spot_service = target.backend_name if target is not None else attempt.service
        # the watch's EC2 clients, built from the AWS connection on a deployment: here, the trace's
        reader = SpotReturnWatch(
            watch,
            on_demand_price=lambda t, _region: on_demand[t],
            clock=lambda: 0.0,
            clients=lambda _region, now=check, service=spot_service: TraceEc2(pools, service, now),
        )
        decision = reader.check(JobStatus(state=JobState.RUNNING, started_at=base + attempt.started_h * 3600.0))
        if decision is not None:
            return check, decision
        check += every
    return None


def replay(trace: Mapping[str, Any], config: Config, task: Task | None = None, *, start_h: float = 0.0) -> Outcome:
    """Play ``task`` through ``trace`` from hour ``start_h`` under ``config``'s capacity policy.

    The next attempt is the attempt engine's (``AttemptEngine.next_submit``: the policy's ``rung_after``, and spot
    after a move back to spot); its wait the policy's ``capacity_wait_for``; after an interruption, the budget is
    the policy's ``budget_left`` and the delay its ``backoff_delay`` (seeded); a planned move has neither, as in
    ``AttemptEngine.after_move``."""
    task = task or Task()
    hours = float(trace["hours"])
    pools = {key: Pool(key, data, hours) for key, data in trace["pools"].items()}
    policy = config.policy()
    types = config.instance_types
    rng = random.Random(f"{trace['seed']}/{start_h}/{config.name}/backoff")
    seed = int(trace["seed"])
    attempts: list[Attempt] = []
    kept, t = 0.0, start_h
    while True:
        records, _ = records_of(attempts, t)
        step = AttemptEngine(
            policy, records, try_number=1, backend_name=config.service, instance_types=types
        ).next_submit()
        service, itype = where(policy, step, config)
        pool = pools[pool_key(service, step.capacity, itype)]
        rung_types = policy.types_for(step.rung, types) if isinstance(policy, Ladder) else types
        wait_s = policy.capacity_wait_for(step.capacity, step.instance_type, rung_types)
        deadline = t + wait_s / 3600.0 if wait_s is not None else math.inf
        attempt = Attempt(
            len(attempts) + 1,
            service,
            step.capacity,
            itype,
            t,
            t,
            "",
            usd_per_hour=pool.usd_per_hour,
            choice=step.instance_type,
            rung=step.rung,
        )
        attempts.append(attempt)
        start = pool.next_available(t)
        if start is None and deadline >= hours:
            attempt.ended_h, attempt.outcome = hours, "waiting"
            return Outcome(config.name, seed, start_h, False, hours, attempts, f"no {pool.key} by hour {hours:g}")
        if start is None or start > deadline:
            attempt.ended_h, attempt.outcome = deadline, CAPACITY_TIMEOUT
            t = deadline
        else:
            attempt.started_h = start
            speed = task.speed[itype]
            working = start + task.startup_h[service]
            finish = working + (task.work_h - kept) / speed
            stop = pool.next_reclaim(start) if pool.spot else None
            if pool.spot and stop is None and finish > hours:  # past the trace, a spot attempt's end is unknown
                attempt.ended_h, attempt.outcome = hours, "running"
                attempt.work_done_h = attempt.work_kept_h = max(0.0, hours - working) * speed
                return Outcome(config.name, seed, start_h, False, hours, attempts, f"trace ended at hour {hours:g}")
            moved = moved_at(policy, attempts, pools, types, min(finish, hours))
            if moved is not None:
                stop, attempt.move = moved
            if stop is None or stop >= finish:
                attempt.ended_h, attempt.outcome = finish, "succeeded"
                attempt.work_done_h = attempt.work_kept_h = task.work_h - kept
                return Outcome(config.name, seed, start_h, True, finish, attempts)
            ran = max(0.0, stop - working)
            saved = (
                ran
                if task.checkpoint_at_notice
                else math.floor(ran / task.checkpoint_every_h) * task.checkpoint_every_h
            )
            attempt.ended_h, attempt.outcome = stop, MOVED_TO_SPOT if moved is not None else PREEMPTED
            attempt.work_done_h, attempt.work_kept_h = ran * speed, saved * speed
            kept += saved * speed
            t = stop
        if attempt.outcome == MOVED_TO_SPOT:  # a planned move: no interruption, no budget, no backoff
            continue
        interruptions = interruptions_of(records_of(attempts, t)[0])
        if policy.budget_left(interruptions) < 0:
            why = f"interruption budget spent (max_interruptions={policy.max_interruptions})"
            return Outcome(config.name, seed, start_h, False, t, attempts, why)
        t += policy.backoff_delay(len(interruptions), rng=rng) / 3600.0
        if t >= hours:
            return Outcome(config.name, seed, start_h, False, hours, attempts, f"trace ended at hour {hours:g}")


# --- the configurations -----------------------------------------------------------------------------

#: the budget every configuration gets: a week of interruptions must not end the task (the default 3 would)
MAX_INTERRUPTIONS = 20
#: spot's wait per attempt (and per type), as the example pipeline has it
SPOT_WAIT = timedelta(minutes=10)
#: on-demand's wait per type but the last, under instance fallback (InstanceFallback's default)
CAPACITY_WAIT = timedelta(minutes=15)


def _ladder(*rungs: tuple[str, str, str], **options: Any) -> Callable[[], CapacityPolicy]:
    """A :class:`Ladder` of ``(backend, capacity, EC2 instance type)`` rungs (SageMaker's named with ``ml.``);
    ``options``: more of the ladder's (``spot_return=``)."""

    def make() -> CapacityPolicy:
        steps = [LadderRung(b, c, instance_types=[("ml." if b == "sagemaker" else "") + t]) for b, c, t in rungs]
        return Ladder(*steps, spot_wait_timeout=SPOT_WAIT, max_interruptions=MAX_INTERRUPTIONS, **options)

    return make


def _composed(**spot_return: Any) -> CapacityPolicy:
    """Instance fallback, a ladder and back to spot as one policy: Batch spot -> SageMaker managed spot -> Batch
    on-demand, each rung trying p5, p4d, g6e in order (on-demand waiting 15 minutes per type but the last); an
    on-demand attempt moves back to the spot rung the job was last on when spot returns there."""
    typed = ("ml." + t for t in INSTANCE_TYPES)
    return Ladder(
        LadderRung("batch", SPOT, instance_types=INSTANCE_TYPES),
        LadderRung("sagemaker", SPOT, instance_types=tuple(typed)),
        LadderRung("batch", ON_DEMAND, instance_types=INSTANCE_TYPES),
        spot_wait_timeout=SPOT_WAIT,
        max_interruptions=MAX_INTERRUPTIONS,
        instances=InstanceFallback(capacity_wait=CAPACITY_WAIT),
        spot_return=_spot_return(**spot_return),
    )


def _spot_return(**options: Any) -> SpotReturn:
    """Back to spot, with SpotReturn's defaults (30 % saving, score 7, a reading every 10 minutes, 2 moves, an
    hour's cooldown after a reclaim, 30 minutes of work left) and the task's expected runtime; read in us-east-1."""
    return SpotReturn(expected_runtime=timedelta(hours=Task.work_h), regions=[REGION], aws_conn_id=None, **options)


CONFIGS: tuple[Config, ...] = (
    Config("on-demand only", lambda: OnDemand(max_interruptions=MAX_INTERRUPTIONS)),
    Config(
        "spot, then on-demand (one service: today)",
        lambda: SpotFallback(after_preemptions=1, spot_wait_timeout=SPOT_WAIT, max_interruptions=MAX_INTERRUPTIONS),
    ),
    Config(
        "the same + instance fallback p5, p4d, g6e",
        lambda: SpotFallback(
            after_preemptions=1,
            spot_wait_timeout=SPOT_WAIT,
            max_interruptions=MAX_INTERRUPTIONS,
            instances=InstanceFallback(capacity_wait=CAPACITY_WAIT),
        ),
        instance_types=INSTANCE_TYPES,
    ),
    Config(
        "spot, then on-demand + back to spot",
        lambda: SpotFallback(
            after_preemptions=1,
            spot_wait_timeout=SPOT_WAIT,
            max_interruptions=MAX_INTERRUPTIONS,
            spot_return=_spot_return(),
        ),
    ),
    Config(
        "instance fallback + back to spot",
        lambda: SpotFallback(
            after_preemptions=1,
            spot_wait_timeout=SPOT_WAIT,
            max_interruptions=MAX_INTERRUPTIONS,
            instances=InstanceFallback(capacity_wait=CAPACITY_WAIT),
            spot_return=_spot_return(),
        ),
        instance_types=INSTANCE_TYPES,
    ),
    Config(
        "spot, then on-demand + back to spot, max_moves=10",
        lambda: SpotFallback(
            after_preemptions=1,
            spot_wait_timeout=SPOT_WAIT,
            max_interruptions=MAX_INTERRUPTIONS,
            spot_return=_spot_return(max_moves=10),
        ),
    ),
    Config(
        "ladder: Batch spot, SageMaker spot, SageMaker on-demand",
        _ladder(("batch", SPOT, P5), ("sagemaker", SPOT, P5), ("sagemaker", ON_DEMAND, P5)),
    ),
    Config(
        "ladder: Batch spot, SageMaker spot, Batch on-demand",
        _ladder(("batch", SPOT, P5), ("sagemaker", SPOT, P5), ("batch", ON_DEMAND, P5)),
    ),
    Config(
        "ladder by type: Batch spot p5, p4d, SageMaker spot p5, Batch on-demand p5",
        _ladder(("batch", SPOT, P5), ("batch", SPOT, P4D), ("sagemaker", SPOT, P5), ("batch", ON_DEMAND, P5)),
    ),
    Config(
        "ladder + back to spot: Batch spot, SageMaker spot, Batch on-demand, p5 only",
        lambda: _ladder(
            ("batch", SPOT, P5), ("sagemaker", SPOT, P5), ("batch", ON_DEMAND, P5), spot_return=_spot_return()
        )(),
    ),
    Config(
        "one policy: instance fallback + ladder + back to spot",
        lambda: _composed(),
        instance_types=INSTANCE_TYPES,
    ),
)


# --- the report -------------------------------------------------------------------------------------


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def table(outcomes: Sequence[Outcome], configs: Sequence[Config] = CONFIGS) -> list[str]:
    """The side-by-side table: per configuration, medians over the seeds (finished runs only for times)."""
    lines = [
        "| configuration | finished | cost USD | x on-demand | cost USD, mean | completion h | completion h, p90 "
        "| work redone h | reclaims | moves to spot | attempts (started) | work on spot |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = None
    for config in configs:
        mine = [o for o in outcomes if o.config == config.name]
        done = [o for o in mine if o.finished]
        if not mine:
            continue
        cost = _median(o.cost_usd for o in mine)
        base = cost if base is None else base
        completion = f"{_median(o.completion_h for o in done):.1f}" if done else "-"
        p90 = f"{_p90([o.completion_h for o in done]):.1f}" if done else "-"
        mean = statistics.fmean(o.cost_usd for o in mine)
        lines.append(
            f"| {config.name} | {len(done)}/{len(mine)} | {cost:,.0f} | {cost / base:.2f} | {mean:,.0f} "
            f"| {completion} | {p90} "
            f"| {_median(o.work_redone_h for o in mine):.2f} | {_median(o.reclaims for o in mine):g} "
            f"| {_median(o.moves for o in mine):g} "
            f"| {_median(len(o.attempts) for o in mine):g} ({_median(o.started for o in mine):g}) "
            f"| {100 * _median(o.spot_share for o in mine):.0f} % |"
        )
    return lines


def spread(outcomes: Sequence[Outcome], configs: Sequence[Config] = CONFIGS) -> list[str]:
    """Per configuration, the range over the seeds (min - max) of cost, completion and work redone."""
    lines = []
    for config in configs:
        mine = [o for o in outcomes if o.config == config.name]
        if not mine:
            continue
        costs = [o.cost_usd for o in mine]
        ends = [o.completion_h for o in mine]
        redone = [o.work_redone_h for o in mine]
        lines.append(
            f"{config.name}: cost {min(costs):,.0f} - {max(costs):,.0f} USD, completion {min(ends):.1f} - "
            f"{max(ends):.1f} h, work redone {min(redone):.2f} - {max(redone):.2f} h"
        )
    return lines


#: when the task starts in each trace: every 12 hours of the first three days (both halves of the day)
STARTS_H = (0.0, 12.0, 24.0, 36.0, 48.0, 60.0, 72.0)


def run(
    traces: Sequence[Mapping[str, Any]],
    task: Task,
    configs: Sequence[Config] = CONFIGS,
    starts_h: Sequence[float] = STARTS_H,
) -> list[Outcome]:
    """Every configuration on every trace from every start."""
    return [replay(trace, c, task, start_h=s) for trace in traces for s in starts_h for c in configs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 seeds instead of --seeds")
    parser.add_argument("--seeds", type=int, default=51, help="traces to replay, seeds first-seed.. (default 51)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--trace", type=Path, action="append", help="replay this trace file (repeatable)")
    parser.add_argument("--trace-dir", type=Path, help="write each generated trace here (default: a temp dir)")
    parser.add_argument("--work-hours", type=float, default=Task.work_h, help="hours of work on one p5.48xlarge")
    parser.add_argument("--checkpoint-minutes", type=float, default=Task.checkpoint_every_h * 60)
    parser.add_argument("--checkpoint-at-notice", action="store_true", help="the job saves at a reclaim notice")
    parser.add_argument("--details", action="store_true", help="print every attempt of the first seed")
    args = parser.parse_args(argv)
    task = Task(
        work_h=args.work_hours,
        checkpoint_every_h=args.checkpoint_minutes / 60,
        checkpoint_at_notice=args.checkpoint_at_notice,
    )
    began = time.perf_counter()
    if args.trace:
        traces = [read_trace(p) for p in args.trace]
        where = ", ".join(map(str, args.trace))
    else:
        seeds = range(args.first_seed, args.first_seed + (5 if args.quick else args.seeds))
        traces = [generate(s) for s in seeds]
        out = args.trace_dir or Path(tempfile.mkdtemp(prefix="capacity-trace-"))
        out.mkdir(parents=True, exist_ok=True)
        for trace in traces:
            write_trace(trace, out / f"week-seed-{trace['seed']}.json")
        where = f"{out}/week-seed-<seed>.json, seeds {seeds.start}..{seeds.stop - 1}"
    generated = time.perf_counter()
    outcomes = run(traces, task)
    replayed = time.perf_counter()
    print(f"traces: {where}")
    print(
        f"task: {task.work_h:g} h of work on one p5.48xlarge, a checkpoint every {task.checkpoint_every_h * 60:g} min"
        f"{', and at every reclaim notice' if task.checkpoint_at_notice else ''}; start-up "
        + ", ".join(f"{s} {h * 60:g} min" for s, h in task.startup_h.items())
        + "; speed "
        + ", ".join(f"{t} {v:g}" for t, v in task.speed.items())
    )
    print(
        f"medians over {len(traces)} traces x {len(STARTS_H)} starts (hours {', '.join(f'{h:g}' for h in STARTS_H)}; "
        f"{generated - began:.2f} s to generate, {replayed - generated:.2f} s to replay):"
    )
    print("\n".join(table(outcomes)))
    print("\n".join(spread(outcomes)))
    if args.details:
        for o in outcomes[: len(CONFIGS)]:
            state = "finished" if o.finished else "not finished: " + o.why
            print(f"\n{o.config}, seed {o.seed}, start hour {o.start_h:g}: {state}")
            for a in o.attempts:
                started = f"{a.started_h:.2f}" if a.started_h is not None else "-"
                print(
                    f"  {a.number}: {a.service} {a.capacity} {a.instance_type} submitted {a.submitted_h:.2f} "
                    f"started {started} ended {a.ended_h:.2f} {a.outcome}; {a.cost_usd:,.0f} USD, "
                    f"work {a.work_done_h:.2f} h, redone {a.work_redone_h:.2f} h"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
