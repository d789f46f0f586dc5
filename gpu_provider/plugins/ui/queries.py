"""What the GPU page reads: Airflow's metadata database and the backends' live jobs.

* Attempt records: the rows of Airflow's task state store under the operator's key
  (``gpu_provider_attempts``) updated in the last 30 days, joined with their task instances (state,
  pool = team, pool slots). One bounded query (at most :data:`MAX_TASK_ROWS` task instances, newest
  first), cached for :data:`CACHE_S` seconds so that the page's four requests read the database once.
* Pools: Airflow's own occupancy figures (``Pool.slots_stats``, deferred tasks counted where the pool
  says so) for the ``gpu_<team>`` pools.
* Live state: ``Backend.list_owned()`` of each backend in ``[gpu_provider] ui_backends``, each with
  a time limit, cached like the records; a backend that cannot answer is reported, not fatal.
* Ends nobody could write: an attempt whose record is not terminal while its task instance is no longer
  live and its backend no longer lists the job was stopped by something that cannot write the task's
  records (the trigger of a task killed while deferred, the reaper). Its end is read from the service
  (``Backend.poll``, the service's own start, GPU time and reason), priced like every other attempt, and
  shown in place of the stale record (:func:`read_ended`). A read only: nothing is written or stopped.
  An end, once read, is final and kept for the process's life (bounded), so each job is asked once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from gpu_provider.backends.base import Backend, JobStatus, OwnedJob, provider_config, resolve_backend
from gpu_provider.names import STATE_KEY
from gpu_provider.plugins.ui.data import LIVE_TI_STATES, TEAM_POOL_PREFIX, WINDOWS, PoolRow, TaskRow, parse_records
from gpu_provider.records import AttemptRecord

#: the most task instances (state store rows) one read takes, newest update first
MAX_TASK_ROWS = 20_000
#: seconds a read of the records, the pools and the live jobs is reused
CACHE_S = 10.0
#: state store rows fetched by id per query
FETCH_CHUNK = 500
#: seconds one backend's ``list_owned`` may take before the page goes on without it
LIVE_TIMEOUT_S = 10.0
#: the most ended jobs whose end (read from the service) is kept
MAX_ENDED = 20_000

T = TypeVar("T")


def ui_backends() -> list[Backend]:
    """``[gpu_provider] ui_backends`` (a JSON list of names or mappings), else ``reaper_backends``,
    else the local backend alone (a cloud backend is asked only when configured)."""
    text = provider_config("ui_backends") or provider_config("reaper_backends") or '["local"]'
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = [v.strip() for v in text.split(",") if v.strip()]
    if not isinstance(value, list):
        value = [value]
    return [resolve_backend(v) for v in value]


def unswept_place() -> Callable[[Mapping[str, Any]], str | None]:
    """For :func:`~gpu_provider.plugins.ui.data.unswept`: the place of a rung's backend mapping when no backend of
    the configured reaper (:func:`gpu_provider.spend.scope.configured_reapers`) sweeps it, else ``None``; a
    mapping this server cannot build (its extra missing) is left out."""
    from gpu_provider.spend.scope import configured_reapers, describe, sweeps

    try:
        reapers = configured_reapers()
    except Exception:  # the reaper's own DAG fails on a bad reaper_backends: the page does not judge then
        return lambda spec: None
    known: dict[str, str | None] = {}

    def place_of(spec: Mapping[str, Any]) -> str | None:
        key = json.dumps(spec, sort_keys=True, default=str)
        if key not in known:
            try:
                backend = resolve_backend(dict(spec))
            except Exception:
                known[key] = None
            else:
                known[key] = None if any(sweeps(r, backend) for r in reapers) else describe(backend)
        return known[key]

    return place_of


class RecordCache:
    """Parsed attempt records by state store row, so that a refresh fetches and parses only the rows
    written since the last one (a row is rewritten whenever its task's attempts change)."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[Any, tuple[AttemptRecord, ...]]] = {}
        self.fetched = 0
        self._lock = threading.Lock()
        """Rows whose value the last read fetched and parsed."""

    def reset(self) -> None:
        with self._lock:
            self._rows = {}

    def records(self, session: Any, wanted: dict[int, Any]) -> dict[int, tuple[AttemptRecord, ...]]:
        """The records of the rows ``wanted`` (id -> updated_at), fetching the new and changed ones by id."""
        with self._lock:
            return self._records(session, wanted)

    def _records(self, session: Any, wanted: dict[int, Any]) -> dict[int, tuple[AttemptRecord, ...]]:
        from airflow.models.task_state_store import TaskStateStoreModel as Store
        from sqlalchemy import select

        stale = [i for i, updated in wanted.items() if i not in self._rows or self._rows[i][0] != updated]
        for chunk in range(0, len(stale), FETCH_CHUNK):
            ids = stale[chunk : chunk + FETCH_CHUNK]
            for i, value, updated in session.execute(
                select(Store.id, Store.value, Store.updated_at).where(Store.id.in_(ids))
            ):
                self._rows[i] = (updated, parse_records(value))
        self.fetched = len(stale)
        self._rows = {i: self._rows[i] for i in wanted if i in self._rows}  # forget rows out of the window
        return {i: entry[1] for i, entry in self._rows.items()}


def read_task_rows(
    session: Any, since: datetime, limit: int = MAX_TASK_ROWS, cache: RecordCache | None = None
) -> tuple[list[TaskRow], bool]:
    """State store rows of the operator's key updated since ``since`` with their task instances.

    The rows' values (the records) are fetched by primary key in a second step, and only for rows the
    ``cache`` has not seen at their current ``updated_at``.

    :return: the rows (newest first) and whether ``limit`` cut them
    """
    from airflow.models.task_state_store import TaskStateStoreModel as Store
    from airflow.models.taskinstance import TaskInstance as TI
    from sqlalchemy import and_, select

    query = (
        select(
            Store.id,
            Store.dag_id,
            Store.run_id,
            Store.task_id,
            Store.map_index,
            Store.updated_at,
            TI.state,
            TI.pool,
            TI.pool_slots,
            TI.end_date,
        )
        .join(
            TI,
            and_(
                TI.dag_id == Store.dag_id,
                TI.run_id == Store.run_id,
                TI.task_id == Store.task_id,
                TI.map_index == Store.map_index,
            ),
            isouter=True,
        )
        .where(Store.key == STATE_KEY, Store.updated_at >= since)
        .order_by(Store.updated_at.desc())
        .limit(limit + 1)
    )
    found = list(session.execute(query))
    truncated = len(found) > limit
    found = found[:limit]
    records = (cache or RecordCache()).records(session, {r.id: r.updated_at for r in found})
    rows = [
        TaskRow(
            dag_id=r.dag_id,
            run_id=r.run_id,
            task_id=r.task_id,
            map_index=r.map_index,
            value="",
            updated_at=r.updated_at,
            ti_state=str(r.state.value if hasattr(r.state, "value") else r.state) if r.state is not None else None,
            pool=r.pool,
            pool_slots=r.pool_slots,
            ti_end_date=r.end_date,
            records=records.get(r.id, ()),
        )
        for r in found
    ]
    return rows, truncated


def read_pools(session: Any) -> list[PoolRow]:
    """The ``gpu_<team>`` pools with Airflow's occupancy figures."""
    from airflow.models.pool import Pool
    from sqlalchemy import select

    stats = Pool.slots_stats(session=session)
    deferred = dict(session.execute(select(Pool.pool, Pool.include_deferred)).all())
    return [
        PoolRow(
            pool=name,
            total=float(s["total"]),
            running=int(s["running"]),
            queued=int(s["queued"]),
            deferred=int(s["deferred"]),
            scheduled=int(s["scheduled"]),
            include_deferred=bool(deferred.get(name)),
        )
        for name, s in sorted(stats.items())
        if name.startswith(TEAM_POOL_PREFIX)
    ]


@dataclass
class LiveJobs:
    jobs: dict[str, OwnedJob] = field(default_factory=dict)
    """Active jobs by job id, from every backend that answered."""
    errors: list[str] = field(default_factory=list)
    """What each backend that could not answer said (for users who may read every DAG only)."""
    failed: list[str] = field(default_factory=list)
    """The names of those backends, in the same order (what everyone else is told)."""
    backends: list[str] = field(default_factory=list)
    usd_per_hour: dict[str, float] = field(default_factory=dict)
    """What each job bills per hour, where a price is known (as the reaper estimates it)."""


_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpu-ui-live")


def read_live(backends: Sequence[Backend], timeout_s: float = LIVE_TIMEOUT_S) -> LiveJobs:
    """Every backend's ``list_owned()``, in parallel, each within ``timeout_s``."""
    from gpu_provider.spend.prices import PriceBook
    from gpu_provider.spend.reaper import job_usd_per_hour

    out = LiveJobs(backends=[b.name for b in backends])
    book = PriceBook.from_config()
    futures = [(b, _pool.submit(b.list_owned)) for b in backends]
    deadline = time.monotonic() + timeout_s
    for backend, future in futures:
        try:
            owned = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            out.errors.append(f"{backend.name}: no answer from list_owned within {timeout_s:g}s")
            out.failed.append(backend.name)
            continue
        except Exception as err:
            out.errors.append(f"{backend.name}: could not list its jobs: {err}")
            out.failed.append(backend.name)
            continue
        for job in owned:
            out.jobs[job.handle.job_id] = job
            rate = job_usd_per_hour(backend, job, book)
            if rate is not None:
                out.usd_per_hour[job.handle.job_id] = rate
    return out


class _Cached:
    """One value, recomputed at most every ``ttl`` seconds (one computation at a time)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._value: Any = None
        self._at = float("-inf")

    def get(self, compute: Callable[[], T]) -> T:
        with self._lock:
            if time.monotonic() - self._at > self.ttl:
                self._value = compute()
                self._at = time.monotonic()
            return self._value  # type: ignore[no-any-return]

    def clear(self) -> None:
        with self._lock:
            self._at = float("-inf")


@dataclass(frozen=True)
class Snapshot:
    """One read of everything the page shows."""

    rows: list[TaskRow]
    truncated: bool
    pools: list[PoolRow]
    live: LiveJobs
    read_at: float
    read_s: float
    dag_ids: frozenset[str] = frozenset()
    """Every DAG Airflow knows: a user allowed all of them may see what belongs to no known DAG."""
    ended: dict[str, AttemptRecord] = field(default_factory=dict)
    """Attempts whose end only the service knows, by job id, with that end (:func:`read_ended`)."""


_snapshot = _Cached(CACHE_S)
_records = RecordCache()


def snapshot(backends: Callable[[], Sequence[Backend]] = ui_backends) -> Snapshot:
    """The rows of the last 30 days, the pools and the live jobs (cached :data:`CACHE_S` seconds)."""
    return _snapshot.get(lambda: _read(backends))


def _read(backends: Callable[[], Sequence[Backend]]) -> Snapshot:
    from airflow.utils.session import create_session

    began = time.monotonic()
    now = datetime.now(timezone.utc)
    chosen: Sequence[Backend] = []
    try:
        chosen = backends()
        live = read_live(chosen)
    except Exception as err:  # a bad ui_backends value: show the page, say why live state is missing
        live = LiveJobs(errors=[f"[gpu_provider] ui_backends: {err}"], failed=["[gpu_provider] ui_backends"])
    with create_session() as session:
        rows, truncated = read_task_rows(session, now - max(WINDOWS.values()) - timedelta(hours=1), cache=_records)
        pools = read_pools(session)
        dag_ids = read_dag_ids(session)
    ended = read_ended(rows, live, chosen)
    return Snapshot(rows, truncated, pools, live, now.timestamp(), time.monotonic() - began, dag_ids, ended)


#: ends read from the services, by job id (final: a job's end does not change)
_ended: dict[str, JobStatus] = {}
_ended_lock = threading.Lock()


def unwritten_ends(rows: Sequence[TaskRow], live: LiveJobs) -> list[tuple[TaskRow, AttemptRecord]]:
    """Attempts whose record is not terminal although their task instance is no longer live and no
    backend that answered lists the job: their end was not written by the task (a kill while deferred,
    the reaper). A backend that could not list its jobs gives none (the job may still run)."""
    out = []
    for row in rows:
        if row.ti_state in LIVE_TI_STATES:
            continue
        for record in row.records or ():
            backend = record.handle.backend
            if record.state.terminal or record.job_id in live.jobs:
                continue
            if backend not in live.backends or backend in live.failed:
                continue
            out.append((row, record))
    return out


def read_ended(
    rows: Sequence[TaskRow], live: LiveJobs, backends: Sequence[Backend], timeout_s: float = LIVE_TIMEOUT_S
) -> dict[str, AttemptRecord]:
    """The service's end of each attempt :func:`unwritten_ends` finds, as a record to show in place of the
    stale one: ``CANCELLED`` (or however the service says it ended) with its reason (``the GPU reaper: ...``,
    ``... was killed while deferred``), start, GPU-seconds and instance, priced at the record's price (else
    the backend's price for its GPUs). One batched ``poll`` per backend, within ``timeout_s``; a job that has
    not ended yet, or cannot be read, keeps its record."""
    wanted = unwritten_ends(rows, live)
    if not wanted:
        return {}
    by_name = {b.name: b for b in backends}
    with _ended_lock:
        missing = [r for _, r in wanted if r.job_id not in _ended and r.handle.backend in by_name]
    futures = []
    for name in sorted({r.handle.backend for r in missing}):
        handles = [r.handle for r in missing if r.handle.backend == name]
        futures.append(_pool.submit(by_name[name].poll, handles))
    deadline = time.monotonic() + timeout_s
    for future in futures:
        try:
            found = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # no end read this time: the record is shown as it is, and asked again next read
            continue
        with _ended_lock:
            for job_id, read in found.items():
                if isinstance(read, JobStatus) and read.state.terminal:
                    _ended[job_id] = read
            while len(_ended) > MAX_ENDED:
                del _ended[next(iter(_ended))]
    out = {}
    for row, record in wanted:
        with _ended_lock:
            end = _ended.get(record.job_id)
        backend = by_name.get(record.handle.backend)
        if end is not None and backend is not None:
            out[record.job_id] = ended_record(record, end, backend, row.pool_slots)
    return out


def ended_record(record: AttemptRecord, status: JobStatus, backend: Backend, pool_slots: int | None) -> AttemptRecord:
    """A copy of ``record`` with the service's end ``status``, priced (the record's price, else the
    backend's for the task's GPUs: ``pool_slots`` is the task's total GPUs)."""
    from gpu_provider.job import GpuResources
    from gpu_provider.spend.ended import price_from_dict, priced
    from gpu_provider.spend.prices import PriceBook

    copy = AttemptRecord.from_dict(record.to_dict())
    copy.update(status)
    price = price_from_dict(record.price)
    if price is None:
        nodes = max(1, copy.nodes)
        per_node = float(pool_slots or 1) / nodes
        try:
            resources = GpuResources(gpus=per_node if per_node < 1 else round(per_node), nodes=nodes)
            price = PriceBook.from_config().job_price(
                resources,
                copy.capacity,
                backend.price_region(),
                backend.price_catalog,
                instance_type=copy.instance_type,
            )
        except Exception:  # no price known: GPU time without a cost, as for any unpriced attempt
            price = None
    return priced(copy, price)


def read_dag_ids(session: Any) -> frozenset[str]:
    """The ids of every DAG in Airflow's metadata database."""
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    return frozenset(session.scalars(select(DagModel.dag_id)))


def clear_cache(*, records: bool = False) -> None:
    """Forget the last read (``records``: the parsed records too, so the next read fetches every row)."""
    _snapshot.clear()
    if records:
        _records.reset()
        with _ended_lock:
            _ended.clear()


def permitted(rows: Sequence[TaskRow], dag_ids: Mapping[str, Any] | set[str] | None) -> list[TaskRow]:
    """The rows of the DAGs a user may read (``None``: all)."""
    if dag_ids is None:
        return list(rows)
    return [r for r in rows if r.dag_id in dag_ids]


def visible_live(jobs: Mapping[str, OwnedJob], dag_ids: Collection[str], every_dag: bool) -> dict[str, OwnedJob]:
    """The live jobs a user may see: those of the DAGs they may read (``dag_ids``). A user who may read
    every DAG (``every_dag``) sees all, also the jobs of DAGs Airflow does not know (``untracked``:
    a deleted DAG, a job submitted outside Airflow with this provider's tags), which bill too."""
    if every_dag:
        return dict(jobs)
    return {k: j for k, j in jobs.items() if j.task is not None and j.task.dag_id in dag_ids}


def visible_errors(live: LiveJobs, every_dag: bool) -> list[str]:
    """What a user is told about backends that could not list their jobs: the backends' own words to a
    user who may read every DAG; to the others only which backend, since a service's error may name
    other teams' roles, namespaces or jobs."""
    if every_dag:
        return list(live.errors)
    return [
        f"{name}: its live jobs could not be read (a user who may read every DAG sees the service's error)"
        for name in live.failed
    ]
