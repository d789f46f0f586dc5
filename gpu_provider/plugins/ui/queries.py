"""What the GPU page reads: Airflow's metadata database and the backends' live jobs.

* Attempt records: the rows of Airflow's task state store under the operator's key
  (``gpu_provider_attempts``) updated in the last 30 days, joined with their task instances (state,
  pool = team, pool slots). One bounded query (at most :data:`MAX_TASK_ROWS` task instances, newest
  first), cached for :data:`CACHE_S` seconds so that the page's four requests read the database once.
* Pools: Airflow's own occupancy figures (``Pool.slots_stats``, deferred tasks counted where the pool
  says so) for the ``gpu_<team>`` pools.
* Live state: ``Backend.list_owned()`` of each backend in ``[gpu_provider] ui_backends``, each with
  a time limit, cached like the records; a backend that cannot answer is reported, not fatal.
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

from gpu_provider.backends.base import Backend, OwnedJob, provider_config, resolve_backend
from gpu_provider.plugins.ui.data import TEAM_POOL_PREFIX, WINDOWS, PoolRow, TaskRow, parse_records
from gpu_provider.records import AttemptRecord

#: the task state store key of the operator's attempt records (``GpuJobOperator`` writes it)
STATE_KEY = "gpu_provider_attempts"
#: the most task instances (state store rows) one read takes, newest update first
MAX_TASK_ROWS = 20_000
#: seconds a read of the records, the pools and the live jobs is reused
CACHE_S = 10.0
#: state store rows fetched by id per query
FETCH_CHUNK = 500
#: seconds one backend's ``list_owned`` may take before the page goes on without it
LIVE_TIMEOUT_S = 10.0

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


_snapshot = _Cached(CACHE_S)
_records = RecordCache()


def snapshot(backends: Callable[[], Sequence[Backend]] = ui_backends) -> Snapshot:
    """The rows of the last 30 days, the pools and the live jobs (cached :data:`CACHE_S` seconds)."""
    return _snapshot.get(lambda: _read(backends))


def _read(backends: Callable[[], Sequence[Backend]]) -> Snapshot:
    from airflow.utils.session import create_session

    began = time.monotonic()
    now = datetime.now(timezone.utc)
    try:
        live = read_live(backends())
    except Exception as err:  # a bad ui_backends value: show the page, say why live state is missing
        live = LiveJobs(errors=[f"[gpu_provider] ui_backends: {err}"], failed=["[gpu_provider] ui_backends"])
    with create_session() as session:
        rows, truncated = read_task_rows(session, now - max(WINDOWS.values()) - timedelta(hours=1), cache=_records)
        pools = read_pools(session)
        dag_ids = read_dag_ids(session)
    return Snapshot(rows, truncated, pools, live, now.timestamp(), time.monotonic() - began, dag_ids)


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
