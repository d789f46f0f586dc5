"""Acting on a job through its folder: cancel (``cancel.json``, SIGTERM to its supervisor), a simulated
spot interruption (``preempt.json``), and the owner marks (``mark.json``)."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from gpu_provider.backends.base import JobHandle, OwnerRead
from gpu_provider.backends.local import common
from gpu_provider.backends.local.folders import elsewhere
from gpu_provider.backends.local.status import end_orphan, supervisor_of
from gpu_provider.exceptions import GpuJobError

log = logging.getLogger("gpu_provider.backends.local")


def cancel(handle: JobHandle, job_dir: Path, reason: str) -> None:
    """Ask the job's supervisor to stop it (see :meth:`LocalBackend.cancel`). Takes no lock."""
    away = elsewhere(handle, job_dir)
    status = common.read_json(job_dir / common.STATUS_FILE)
    if status is None or status.get("state") in common.TERMINAL_STATES:
        return
    if not (job_dir / common.CANCEL_FILE).exists():  # keep the first reason: cancel is idempotent
        try:
            common.write_json_atomic(job_dir / common.CANCEL_FILE, {"reason": reason, "at": time.time()})
        except OSError as err:  # stop the job all the same; only the reason is lost
            log.warning("local job %s: cancel reason not recorded (%s); stopping it anyway", handle.job_id, err)
    if away:
        return  # its supervisor, on its own host, reads cancel.json; pids here are not its pids
    pid, pid_start = supervisor_of(job_dir, status)
    if pid is not None and common.is_alive(pid, pid_start):
        try:
            os.kill(pid, signal.SIGTERM)
            return
        except ProcessLookupError:
            pass
    fresh = common.read_json(job_dir / common.STATUS_FILE) or status
    request = common.read_json(job_dir / common.REQUEST_FILE) or {}
    if fresh.get("state") not in common.TERMINAL_STATES and (pid is not None or request):
        end_orphan(job_dir, request, fresh, reason)


def simulate_preemption(handle: JobHandle, job_dir: Path) -> None:
    """Ask the job's supervisor for a simulated spot interruption now (``preempt.json``)."""
    if common.read_json(job_dir / common.REQUEST_FILE) is None:
        raise GpuJobError(f"local job {handle.job_id}: cannot interrupt it, its folder {job_dir} is gone")
    common.write_json_atomic(
        job_dir / common.PREEMPT_FILE,
        {"reason": "simulated spot interruption (LocalBackend.simulate_preemption)", "at": time.time()},
    )


def read_owner(handle: JobHandle, job_dir: Path) -> OwnerRead:
    """The owner read from the job's folder now (``mark.json``, else the try in ``request.json``)."""
    elsewhere(handle, job_dir)  # raises when this machine cannot see the job's folder
    request = common.read_json(job_dir / common.REQUEST_FILE)
    if request is None:
        if os.path.lexists(job_dir):
            raise GpuJobError(f"{job_dir / common.REQUEST_FILE} is missing or not valid JSON")
        return OwnerRead(owner_try=None, exists=False)
    owner = (common.read_json(job_dir / common.MARK_FILE) or {}).get("owner_try")
    if owner is None:
        owner = (request.get("identity") or {}).get("try_number")
    return OwnerRead(owner_try=int(owner) if owner is not None else None)


def mark(handle: JobHandle, job_dir: Path, *, owner_try: int | None, collected: bool) -> None:
    """Write ``mark.json`` atomically: the owning try, and ``collected``, which never goes back."""
    if common.read_json(job_dir / common.REQUEST_FILE) is None:
        raise GpuJobError(f"local job {handle.job_id}: cannot mark it, its folder {job_dir} is gone")
    marks = common.read_json(job_dir / common.MARK_FILE) or {}
    if owner_try is not None:
        marks["owner_try"] = owner_try
    marks["collected"] = bool(marks.get("collected")) or bool(collected)
    marks["updated_at"] = time.time()
    try:
        common.write_json_atomic(job_dir / common.MARK_FILE, marks)
    except OSError as err:
        raise GpuJobError(f"local job {handle.job_id}: could not write {common.MARK_FILE}: {err}") from err
