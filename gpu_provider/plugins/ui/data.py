"""The figures of the GPU page, computed from attempt records (no Airflow, no database here).

:mod:`gpu_provider.plugins.ui.queries` reads the rows (the task state store's attempt records joined
with their task instances, the pools, the backends' live jobs); this module turns them into the JSON
the page and its API serve. Everything here is a pure function of its inputs and ``now``, so the
arithmetic is tested without a server.

Attribution rules (docs/how-to/gpu-page-in-the-ui.md says the same):

* an attempt belongs to the team of its task's pool (``gpu_<team>``; tasks without ``team=`` are
  shown as team ``-``);
* GPU-hours and cost of a window are those of the attempts that *ended* in it, plus what the
  attempts still running have used so far (as the team monthly budget counts them);
* the interruption rate of a capacity type is interrupted attempts / ended attempts of that type in
  the window (an attempt ended by the service restarting it inside counts once, with its restarts).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from gpu_provider.backends.base import JobState, OwnedJob
from gpu_provider.names import INTERRUPTION_KINDS
from gpu_provider.records import AttemptRecord, load_records

#: the windows the page shows, and their length
WINDOWS: dict[str, timedelta] = {"day": timedelta(days=1), "week": timedelta(days=7), "month": timedelta(days=30)}
#: buckets of the "GPUs in use" chart per window (5 minutes, 1 hour, 6 hours)
BUCKETS: dict[str, timedelta] = {"day": timedelta(minutes=5), "week": timedelta(hours=1), "month": timedelta(hours=6)}
#: task instance states in which an attempt of the task may still hold GPUs
LIVE_TI_STATES = frozenset(
    {"running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "restarting"}
)
#: what the reaper's cancel reason says (``gpu_provider.spend.reaper.reap``): such attempts ended "reaped"
REAPED_MARK = "the GPU reaper"
#: the team of tasks that do not set ``team=`` (their pool is not a ``gpu_`` pool)
NO_TEAM = "-"
TEAM_POOL_PREFIX = "gpu_"


def team_of_pool(pool: str | None) -> str:
    if pool and pool.startswith(TEAM_POOL_PREFIX) and len(pool) > len(TEAM_POOL_PREFIX):
        return pool[len(TEAM_POOL_PREFIX) :]
    return NO_TEAM


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _dt(value: Any) -> float | None:
    """A datetime from the database (aware or naive UTC) as Unix time."""
    if not isinstance(value, datetime):
        return None
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()


def end_kind(record: AttemptRecord) -> str:
    """How an ended attempt ended: ``succeeded``, ``preempted``, ``capacity_timeout``, ``lost``,
    ``reaped``, ``cancelled`` or ``failed``."""
    if record.state is JobState.SUCCEEDED:
        return "succeeded"
    if record.interruption:
        return record.interruption
    if record.state is JobState.CANCELLED:
        return "reaped" if REAPED_MARK in record.reason else "cancelled"
    if record.state is JobState.PREEMPTED:
        return "preempted"
    return "failed"


@dataclass(frozen=True)
class TaskRow:
    """One task instance's attempt records (a task state store row) and what its task instance says."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    value: str
    """The stored JSON (a list of attempt records)."""
    updated_at: datetime | None = None
    ti_state: str | None = None
    pool: str | None = None
    pool_slots: int | None = None
    ti_end_date: datetime | None = None
    records: tuple[AttemptRecord, ...] | None = None
    """``value`` parsed (:func:`parse_records`); a reader that parsed it already passes it here."""


def parse_records(value: str) -> tuple[AttemptRecord, ...]:
    """The attempt records of a stored value (a damaged value gives none)."""
    try:
        return tuple(load_records(json.loads(value)))
    except (TypeError, ValueError):
        return ()


@dataclass
class Attempt:
    """An attempt record with its task instance, as the page shows it."""

    row: TaskRow
    record: AttemptRecord
    team: str
    start: float | None
    end: float | None
    """When it ended; for an attempt still running: ``None``."""
    gpus: float
    live: OwnedJob | None = None
    live_usd_per_hour: float | None = None
    """What the live job bills per hour (the reaper's estimate), for a running attempt not priced yet."""

    @property
    def active(self) -> bool:
        return self.end is None

    def gpu_hours_at(self, now: float) -> float:
        if self.active and self.start is not None:
            return max(self.record.gpu_seconds, self.gpus * max(0.0, now - self.start)) / 3600.0
        return self.record.gpu_seconds / 3600.0

    def cost_at(self, now: float) -> float | None:
        """Estimated USD: the record's figure, or for a running attempt its price x GPU-hours so far."""
        price = self.record.price or {}
        rate = price.get("usd_per_gpu_hour")
        if self.active and not isinstance(rate, (int, float)) and self.live_usd_per_hour is not None and self.gpus:
            rate = self.live_usd_per_hour / self.gpus
        if self.active and isinstance(rate, (int, float)):
            return round(max(self.record.cost_usd or 0.0, float(rate) * self.gpu_hours_at(now)), 6)
        return self.record.cost_usd

    def to_dict(self, now: float) -> dict[str, Any]:
        r, row = self.record, self.row
        live = self.live
        state = live.state.value if live is not None else r.state.value
        nodes = live.nodes if live is not None else r.nodes
        return {
            "dag_id": row.dag_id,
            "task_id": row.task_id,
            "run_id": row.run_id,
            "map_index": row.map_index,
            "ti_state": row.ti_state,
            "team": self.team,
            "backend": r.handle.backend,
            # where the attempt ran under a capacity ladder (a rung on another service or region); None otherwise
            "service": r.service,
            "region": (r.backend_spec or {}).get("region_name"),
            "rung": r.rung,
            "job_id": r.job_id,
            "job_name": r.name,
            "attempt": r.attempt,
            "try_number": r.owner_try or r.try_number,
            "capacity": r.capacity,
            "state": state,
            "end": None if self.active else end_kind(r),
            "reason": r.reason,
            "interruption": r.interruption,
            "restarts": r.restarts,
            # a move back to spot (not an interruption): what it is estimated to save
            "spot_return_saving_usd": (r.spot_return or {}).get("saving_usd"),
            "instance_type": (live.instance_type if live else None) or r.instance_type,
            "usd_per_hour": (r.price or {}).get("usd_per_hour"),
            "gpus": round(self.gpus, 3),
            "gpus_per_node": round(self.gpus / max(1, nodes), 3),
            "nodes": nodes,
            "submitted_at": _iso(r.handle.submitted_at),
            "started_at": _iso(self.start),
            "ended_at": _iso(self.end),
            "running_for_s": round(now - self.start, 1) if self.active and self.start else None,
            "gpu_hours": round(self.gpu_hours_at(now), 6),
            "cost_usd": self.cost_at(now),
            "live": live is not None,
            "_extra": dict(r.handle.extra),  # for the job's links; the API drops it
            "_spec": dict(r.backend_spec) if r.backend_spec else None,  # the attempt's own backend, for its links
        }


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat() if ts else None


def attempts_of(
    rows: Iterable[TaskRow],
    live_jobs: Mapping[str, OwnedJob],
    now: float,
    live_rates: Mapping[str, float] | None = None,
    ended: Mapping[str, AttemptRecord] | None = None,
) -> list[Attempt]:
    """Every attempt in ``rows``; ``live_jobs`` (by job id) are the backends' active jobs, ``live_rates``
    what each bills per hour.

    An attempt whose record is not terminal counts as running while its task instance is live or
    its backend still lists the job; otherwise it ended: with the end the service reports for it
    (``ended``, by job id: a task killed while deferred, a job the reaper stopped, whose records nobody
    could write), else when its task instance did.
    """
    out = []
    for row in rows:
        team = team_of_pool(row.pool)
        for record in row.records if row.records is not None else parse_records(row.value):
            live = live_jobs.get(record.job_id)
            if not record.state.terminal and live is None and row.ti_state not in LIVE_TI_STATES:
                record = (ended or {}).get(record.job_id, record)
            start = _ts(record.started_at) or (live.started_at if live else None)
            end = _ts(record.ended_at)
            if record.state.terminal:
                end = end or _dt(row.updated_at) or start
            elif live is None and row.ti_state not in LIVE_TI_STATES:
                end = _dt(row.ti_end_date) or _dt(row.updated_at) or start
            else:
                end = None
            out.append(
                Attempt(
                    row,
                    record,
                    team,
                    start,
                    end,
                    _gpus(record, row, live, start, end),
                    live,
                    (live_rates or {}).get(record.job_id),
                )
            )
    return out


def _gpus(record: AttemptRecord, row: TaskRow, live: OwnedJob | None, start: float | None, end: float | None) -> float:
    """GPUs the attempt held: the backend's figure, else GPU-seconds over run time, else the pool slots."""
    if live is not None and live.total_gpus > 0:
        return live.total_gpus
    if start is not None and end is not None and end > start and record.gpu_seconds > 0:
        return record.gpu_seconds / (end - start)
    return float(row.pool_slots or 1)


@dataclass
class TeamFigures:
    team: str
    pool: str | None = None
    slots_total: float | None = None
    slots_in_use: float = 0.0
    tasks_running: int = 0
    tasks_deferred: int = 0
    tasks_waiting: int = 0
    """Task instances waiting for a pool slot (scheduled) or for the executor (queued)."""
    jobs_waiting: int = 0
    """Attempts submitted and waiting for capacity in their service."""
    attempts_running: int = 0
    gpus_running: float = 0.0
    gpu_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    cost_usd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS, 0.0))
    ended: dict[str, dict[str, int]] = field(default_factory=dict)
    interrupted: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        rates: dict[str, dict[str, Any]] = {}
        for window in WINDOWS:
            rates[window] = {}
            for capacity, n in sorted(self.ended.get(window, {}).items()):
                hit = self.interrupted.get(window, {}).get(capacity, 0)
                rates[window][capacity] = {"attempts": n, "interrupted": hit, "rate": round(hit / n, 4) if n else None}
        return {
            "team": self.team,
            "pool": self.pool,
            "slots_total": None if self.slots_total in (None, float("inf")) else self.slots_total,
            "slots_in_use": self.slots_in_use,
            "tasks_running": self.tasks_running,
            "tasks_deferred": self.tasks_deferred,
            "tasks_waiting": self.tasks_waiting,
            "jobs_waiting": self.jobs_waiting,
            "attempts_running": self.attempts_running,
            "gpus_running": round(self.gpus_running, 3),
            "gpu_hours": {k: round(v, 4) for k, v in self.gpu_hours.items()},
            "cost_usd": {k: round(v, 4) for k, v in self.cost_usd.items()},
            "interruption_rate": rates,
        }


@dataclass(frozen=True)
class PoolRow:
    """One ``gpu_`` pool and Airflow's own occupancy figures for it (``Pool.slots_stats``)."""

    pool: str
    total: float
    running: int
    queued: int
    deferred: int
    scheduled: int
    include_deferred: bool


def team_figures(attempts: Sequence[Attempt], pools: Sequence[PoolRow], now: float) -> list[dict[str, Any]]:
    """The per-team table: pool occupancy, waiting tasks, GPU-hours and cost per window, interruption rates."""
    teams: dict[str, TeamFigures] = {}

    def team(name: str) -> TeamFigures:
        return teams.setdefault(name, TeamFigures(team=name))

    for p in pools:
        t = team(team_of_pool(p.pool))
        t.pool, t.slots_total = p.pool, p.total
        t.slots_in_use = p.running + p.queued + (p.deferred if p.include_deferred else 0)
        t.tasks_running, t.tasks_deferred, t.tasks_waiting = p.running, p.deferred, p.scheduled + p.queued
    for a in attempts:
        t = team(a.team)
        if a.active:
            t.attempts_running += 1
            state = a.live.state if a.live is not None else a.record.state
            if state is JobState.QUEUED:
                t.jobs_waiting += 1
            else:
                t.gpus_running += a.gpus
        moment = now if a.active else (a.end or now)
        for window, length in WINDOWS.items():
            if moment < now - length.total_seconds():
                continue
            t.gpu_hours[window] += a.gpu_hours_at(now)
            t.cost_usd[window] += a.cost_at(now) or 0.0
            if not a.active:
                t.ended.setdefault(window, {}).setdefault(a.record.capacity, 0)
                t.ended[window][a.record.capacity] += 1
                if end_kind(a.record) in INTERRUPTION_KINDS or a.record.restarts:
                    hits = t.interrupted.setdefault(window, {})
                    hits[a.record.capacity] = hits.get(a.record.capacity, 0) + 1
    return [teams[name].to_dict() for name in sorted(teams, key=lambda n: (n == NO_TEAM, n))]


def gpus_in_use(attempts: Sequence[Attempt], window: str, now: float) -> dict[str, Any]:
    """GPUs in use per team over the window: the mean over each bucket (GPU-seconds / bucket length)."""
    length, step = WINDOWS[window].total_seconds(), BUCKETS[window].total_seconds()
    count = int(length // step)
    first = (now // step) * step - (count - 1) * step
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * count)
    for a in attempts:
        if a.start is None:
            continue
        begin, end = a.start, a.end if a.end is not None else now
        if end <= first or begin >= first + count * step:
            continue
        values = series[a.team]
        i = max(0, int((begin - first) // step))
        while i < count:
            low, high = first + i * step, first + (i + 1) * step
            if low >= end:
                break
            overlap = min(high, end) - max(low, begin)
            if overlap > 0:
                values[i] += a.gpus * overlap / step
            i += 1
    span, steps = gpu_steps(attempts, now - length, now)
    top = max((gpus for points in steps.values() for _, gpus in points), default=0.0)
    return {
        "window": window,
        "bucket_s": step,
        "start": _iso(first),
        "times": [_iso(first + i * step) for i in range(count)],
        "teams": {team: [round(v, 3) for v in values] for team, values in sorted(series.items())},
        # what the chart draws: the exact count per team as steps, over the part of the window with data
        "span": {"start": _iso(span[0]), "end": _iso(span[1])},
        "steps": {team: [[_iso(t), round(g, 3)] for t, g in points] for team, points in sorted(steps.items())},
        "y_axis": axis(top),
    }


def gpu_steps(
    attempts: Sequence[Attempt], begin: float, now: float
) -> tuple[tuple[float, float], dict[str, list[tuple[float, float]]]]:
    """GPUs in use per team as a step function: ``(time, GPUs from then on)`` at every change, over the
    span of ``[begin, now]`` that has data (from the first start in it; the whole window when none).

    A minute-long run over a day is a step a person can see, where the mean of 5-minute buckets over a
    day's axis is a flat line with a spike.
    """
    changes: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    first = now
    for a in attempts:
        if a.start is None or not a.gpus:
            continue
        start, end = max(a.start, begin), min(a.end if a.end is not None else now, now)
        if end <= start:
            continue
        first = min(first, start)
        changes[a.team][start] += a.gpus
        changes[a.team][end] -= a.gpus
    if first >= now:
        return (begin, now), {}
    out: dict[str, list[tuple[float, float]]] = {}
    for team, deltas in changes.items():
        level, points = 0.0, [(first, 0.0)]
        for moment in sorted(deltas):
            level = max(0.0, level + deltas[moment])
            if moment == points[-1][0]:
                points[-1] = (moment, level)
            else:
                points.append((moment, level))
        out[team] = points
    return (first, now), out


def axis(top: float, *, money: bool = False, ticks: int = 4) -> dict[str, Any]:
    """A chart's y axis: values from 0 in round steps (1, 2 or 5 x 10^n) up to at least ``top``, about
    ``ticks`` of them, and their labels, each with as many decimals as the step needs so that no two
    labels read the same (amounts of cents: ``$0.005``, ``$0.010``; money shows at least cents)."""
    top = top if top > 0 else (0.01 if money else 1.0)
    raw = top / ticks
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1.0, 2.0, 5.0, 10.0) if m * magnitude >= raw * (1 - 1e-9))
    count = max(1, math.ceil(top / step - 1e-9))
    values = [round(step * i, 12) for i in range(count + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if money and step < 1:
        decimals = max(decimals, 2)  # an amount under a dollar reads in cents at least
    labels = [("$" if money else "") + f"{v:,.{decimals}f}" for v in values]
    return {"max": values[-1], "ticks": values, "labels": labels}


def daily_cost(attempts: Sequence[Attempt], days: int, now: float) -> dict[str, Any]:
    """Estimated USD per team per UTC day (by the day an attempt ended; running ones: today so far)."""
    today = datetime.fromtimestamp(now, tz=timezone.utc).date()
    dates = [today - timedelta(days=days - 1 - i) for i in range(days)]
    index = {d: i for i, d in enumerate(dates)}
    series: dict[str, list[float]] = defaultdict(lambda: [0.0] * days)
    for a in attempts:
        cost = a.cost_at(now)
        if not cost:
            continue
        day = datetime.fromtimestamp(a.end if a.end is not None else now, tz=timezone.utc).date()
        if day in index:
            series[a.team][index[day]] += cost
    totals = [sum(values[i] for values in series.values()) for i in range(days)]
    return {
        "days": [d.isoformat() for d in dates],
        "teams": {team: [round(v, 4) for v in values] for team, values in sorted(series.items())},
        "y_axis": axis(max(totals, default=0.0), money=True),
    }


def unswept(attempts: Sequence[Attempt], place_of: Callable[[Mapping[str, Any]], str | None]) -> list[str]:
    """One line per task whose attempts ran on a ladder rung no configured reaper sweeps (``place_of``: the place
    of a rung's backend mapping when no reaper sweeps it, else ``None``), newest task first."""
    lines: dict[tuple[str, str, str], str] = {}
    for attempt in sorted(attempts, key=lambda a: a.start or 0.0, reverse=True):
        spec = attempt.record.backend_spec
        if not spec:
            continue
        place = place_of(spec)
        key = (attempt.row.dag_id, attempt.row.task_id, place or "")
        if place is not None and key not in lines:
            lines[key] = (
                f"{attempt.row.dag_id}.{attempt.row.task_id} ran attempts on {place}, which no reaper sweeps "
                "([gpu_provider] reaper_backends): a job there that outlives its task keeps billing"
            )
    return list(lines.values())


def running(attempts: Sequence[Attempt], now: float) -> list[dict[str, Any]]:
    """The attempts still running (or waiting for capacity), longest running first."""
    active = [a for a in attempts if a.active]
    active.sort(key=lambda a: (a.start or a.record.handle.submitted_at, a.row.dag_id, a.row.task_id))
    return [a.to_dict(now) for a in active]


def untracked(attempts: Sequence[Attempt], live_jobs: Mapping[str, OwnedJob], now: float) -> list[dict[str, Any]]:
    """Active jobs a backend lists that no attempt record of the window knows (submitted just before
    a worker crash, or by a task whose records are gone): they bill too, and the reaper judges them."""
    known = {a.record.job_id for a in attempts}
    out = []
    for job in sorted(live_jobs.values(), key=lambda j: (j.handle.submitted_at, j.handle.job_id)):
        if job.handle.job_id in known:
            continue
        task = job.task
        out.append(
            {
                "backend": job.handle.backend,
                "job_id": job.handle.job_id,
                "job_name": job.handle.name,
                "dag_id": task.dag_id if task else None,
                "task_id": task.task_id if task else None,
                "run_id": task.run_id if task else None,
                "map_index": task.map_index if task else -1,
                "team": job.team or NO_TEAM,
                "capacity": job.handle.capacity,
                "state": job.state.value,
                "gpus": round(job.total_gpus, 3),
                "nodes": job.nodes,
                "started_at": _iso(job.started_at),
                "running_for_s": round(now - job.started_at, 1) if job.started_at else None,
            }
        )
    return out


def recent(
    attempts: Sequence[Attempt], now: float, *, offset: int, limit: int, team: str | None = None
) -> dict[str, Any]:
    """Ended attempts, newest end first, one page of them."""
    ended = [a for a in attempts if not a.active and (team is None or a.team == team)]
    ended.sort(key=lambda a: (a.end or 0.0, a.record.attempt), reverse=True)
    page = ended[offset : offset + limit]
    return {
        "total": len(ended),
        "offset": offset,
        "limit": limit,
        "attempts": [a.to_dict(now) for a in page],
    }
