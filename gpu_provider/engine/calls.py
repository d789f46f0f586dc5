"""One call to a backend, with a deadline where the caller cannot wait: a status, an owner, a cancel."""

from __future__ import annotations

import threading

from gpu_provider.backends.base import Backend, JobHandle, JobStatus, OwnerRead


def poll_one(backend: Backend, handle: JobHandle, *, timeout: float | None = None) -> JobStatus | None:
    """One attempt's status, or ``None`` when it cannot be read now.

    :param timeout: read in a separate thread and give up after this many seconds: from a signal
        handler, the interrupted code may hold a lock the read needs (a connection pool's, say)
    """
    if timeout is None:
        return _status_of(backend, handle)
    found: list[JobStatus | None] = []
    reader = threading.Thread(target=lambda: found.append(_status_of(backend, handle)), daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else None


def read_owner(backend: Backend, handle: JobHandle, *, timeout: float | None = None) -> OwnerRead | None:
    """Who owns an attempt, read from the service now (:meth:`Backend.read_owner`, no cache), or
    ``None`` when it cannot be read (in time).

    :param timeout: read in a separate thread and give up after this many seconds (from a signal handler)
    """

    def read() -> OwnerRead | None:
        try:
            return backend.read_owner(handle)
        except Exception:
            return None

    if timeout is None:
        return read()
    found: list[OwnerRead | None] = []
    reader = threading.Thread(target=lambda: found.append(read()), daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else None


def cancel_within(backend: Backend, handle: JobHandle, reason: str, timeout: float) -> str | None:
    """Cancel the job in a separate thread, giving up after ``timeout`` seconds: ``None`` when it was
    cancelled, else why not (the service's error, or that it did not answer in time)."""
    outcome: list[str | None] = []

    def run() -> None:
        try:
            backend.cancel(handle, reason)
            outcome.append(None)
        except Exception as err:
            outcome.append(f"{type(err).__name__}: {err}")

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:.0f}s"


def read_now(backend: Backend, handle: JobHandle) -> JobStatus | BaseException:
    """One status read of one job, or the error it failed with (a trigger counts it like the poller's)."""
    try:
        status = backend.poll([handle]).get(handle.job_id)
    except Exception as err:
        return err
    if status is None:
        return LookupError(f"{backend.name} backend returned no status for job {handle.job_id}")
    return status


def _status_of(backend: Backend, handle: JobHandle) -> JobStatus | None:
    try:
        status = backend.poll([handle]).get(handle.job_id)
    except Exception:
        return None
    return status if isinstance(status, JobStatus) else None
