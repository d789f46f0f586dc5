"""Which backend an attempt runs on, and a task's attempts recovered from every one it may run on.

A task's attempts run on its backend, or under a capacity ladder on each rung's own backend (another
service or region): :func:`backend_of` finds an attempt's from its record, :func:`recover` asks every one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpu_provider.backends.base import Backend, JobHandle, JobStatus, TaskKey
from gpu_provider.records import AttemptRecord, AttemptSummary


def recover(
    backend: Backend,
    task: TaskKey,
    stored: list[AttemptRecord],
    log: Any,
    summary: AttemptSummary | None = None,
    *,
    others: Sequence[Backend] = (),
) -> list[AttemptRecord]:
    """Every attempt of a task instance, refreshed with its current status.

    ``others``: the task's other backends (a capacity ladder's rungs on other services or regions): each
    is asked for the task's attempts too, and every attempt is read from its own backend.

    ``stored`` are the records from the task state store (resume point, owner, interruption
    kind). The backend's lookup by identity is asked too: it also finds an attempt submitted just
    before a crash kept its record from the store, so that attempt is reattached, not duplicated.
    An attempt whose end is known is not asked about again (the service may have forgotten it since,
    and a lost job must not replace what was known), nor is one folded into ``summary``.
    """
    places = distinct_backends(backend, others)
    return _refreshed(backend, places, _found_everywhere(places, task), stored, log, summary)


def recover_at_start(
    backend: Backend,
    task: TaskKey,
    read_store: Callable[[], tuple[list[AttemptRecord], AttemptSummary | None]],
    log: Any,
    *,
    others: Sequence[Backend] = (),
    first_execution: bool = False,
    in_parallel: bool = True,
) -> tuple[list[AttemptRecord], list[AttemptRecord], AttemptSummary | None]:
    """:func:`recover` at the start of a try, reading the task state store only where it can hold something,
    and never after the backend's lookup when it can be read during it. Returns the records, those read
    from the store, and the store's summary.

    ``read_store``: the task state store's records and summary (one round trip to Airflow's API server).
    ``first_execution``: this is the first execution of its task instance (``execute()`` of try 1, never
    rescheduled; see :func:`gpu_provider.operators._state.first_execution`), so the store holds nothing of
    an earlier one and is not read, unless the backend's lookup finds an attempt of the task after all
    (an earlier execution of this try exists, e.g. ``airflow tasks test`` re-running a task instance): then
    it is read after the lookup. Otherwise the read runs in a thread while the lookups run here, so the
    start pays the longer of the two, not their sum; ``in_parallel=False`` reads first, then looks up
    (where the store may not be read from another thread).
    The backend's lookup is the create-or-adopt authority in every case: it is always asked.
    """
    places = distinct_backends(backend, others)
    if first_execution:
        found = _found_everywhere(places, task)
        stored, summary = read_store() if found else ([], None)
    elif not in_parallel:
        stored, summary = read_store()
        found = _found_everywhere(places, task)
    else:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-store-read") as pool:
            reading = pool.submit(read_store)
            found = _found_everywhere(places, task)
            stored, summary = reading.result()
    return _refreshed(backend, places, found, stored, log, summary), stored, summary


def _found_everywhere(places: Sequence[Backend], task: TaskKey) -> list[tuple[Backend, JobHandle]]:
    """Each backend's attempts of ``task`` (its lookup by identity), with the backend that found them."""
    return [(place, h) for place in places for h in place.find_existing(task)]


def _refreshed(
    backend: Backend,
    places: Sequence[Backend],
    found: Sequence[tuple[Backend, JobHandle]],
    stored: list[AttemptRecord],
    log: Any,
    summary: AttemptSummary | None,
) -> list[AttemptRecord]:
    """The stored records and those ``found`` that the store does not know, each open one refreshed."""
    known = {r.job_id for r in stored}
    folded = (summary.last_attempt or 0) if summary else 0
    records = list(stored)
    for place, h in found:
        if h.job_id not in known and h.attempt > folded:
            known.add(h.job_id)
            record = AttemptRecord.new(h)
            if place is not backend:  # found on a rung's own backend: its later reads go there
                record.backend_spec, record.service = place.spec(), place.service or None
            records.append(record)
    records.sort(key=lambda r: (r.attempt, r.handle.submitted_at))
    open_records = [r for r in records if not r.state.terminal]
    statuses = poll_where_they_run(open_records, lambda r: backend_of(backend, r, places))
    for record in open_records:
        status = statuses.get(record.job_id)
        if isinstance(status, JobStatus):
            record.update(status)
        elif status is not None:
            log.warning("Could not read the status of job %s: %s", record.job_id, status)
    return records


def poll_where_they_run(
    records: Sequence[AttemptRecord], backend_for: Callable[[AttemptRecord], Backend]
) -> dict[str, Any]:
    """Each record's status (or the error reading it) by job id, read from the attempt's own backend: one
    :meth:`~gpu_provider.backends.base.Backend.poll` per backend. A poll that raises raises here."""
    groups: dict[str, tuple[Backend, list[AttemptRecord]]] = {}
    for record in records:
        place = backend_for(record)
        groups.setdefault(spec_key(place), (place, []))[1].append(record)
    statuses: dict[str, Any] = {}
    for place, group in groups.values():
        statuses.update(place.poll([r.handle for r in group]))
    return statuses


def spec_key(backend: Backend) -> str:
    """A backend's identity as a string (its name and options): equal backends, equal keys."""
    return json.dumps(backend.spec(), sort_keys=True, default=str)


def distinct_backends(backend: Backend, others: Sequence[Backend]) -> list[Backend]:
    """``backend`` and then each of ``others`` not equal to one before it."""
    seen: dict[str, Backend] = {}
    for b in (backend, *others):
        seen.setdefault(spec_key(b), b)
    return list(seen.values())


def backend_of(backend: Backend, record: AttemptRecord, known: Sequence[Backend] = ()) -> Backend:
    """The backend ``record``'s attempt runs on: its own (``record.backend_spec``, a ladder's rung), else the
    task's ``backend`` (records written before ladders existed). One of ``known`` equal to it is reused."""
    spec = record.backend_spec
    if not spec:
        return backend
    key = json.dumps(spec, sort_keys=True, default=str)
    for b in (backend, *known):
        if spec_key(b) == key:
            return b
    from gpu_provider.backends.base import resolve_backend

    return resolve_backend(spec)
