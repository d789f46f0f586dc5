"""A job's status: the supervisor's states in one table, ``status.json`` read into a :class:`JobStatus`,
and the end of a job whose supervisor vanished."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus, map_state
from gpu_provider.backends.local import common
from gpu_provider.backends.local.folders import elsewhere
from gpu_provider.backends.local.gpus import gpu_seconds
from gpu_provider.exceptions import GpuJobError

log = logging.getLogger("gpu_provider.backends.local")

#: the supervisor's states (``status.json["state"]``) and what they mean for the operator
STATE_TABLE: dict[str, JobState] = {
    common.QUEUED: JobState.QUEUED,
    common.WAITING_FOR_GPUS: JobState.QUEUED,
    common.STARTING: JobState.STARTING,
    common.RUNNING: JobState.RUNNING,
    # still RUNNING while the nodes get their grace period: they hold their GPUs until they exit
    common.STOPPING: JobState.RUNNING,
    common.SUCCEEDED: JobState.SUCCEEDED,
    common.FAILED: JobState.FAILED,
    common.PREEMPTED: JobState.PREEMPTED,
    common.CANCELLED: JobState.CANCELLED,
}

#: a supervisor that has not recorded its pid this long after submit is taken as never started
SUPERVISOR_START_TIMEOUT_S = 60.0

# Verdicts on jobs whose supervisor vanished, when status.json could not be written (disk full): the
# same answer on every poll. A plain dict, no lock: cancel() may run in a signal handler.
_orphans: dict[str, dict[str, Any]] = {}


def strip_cancel_prefix(reason: str) -> str:
    """``reason`` without :data:`~gpu_provider.names.CANCEL_PREFIX`."""
    return reason[len(names.CANCEL_PREFIX) :] if reason.startswith(names.CANCEL_PREFIX) else reason


def read_status(handle: JobHandle, job_dir: Path, *, backend: str) -> JobStatus:
    """The job's status read from its folder now (see :meth:`LocalBackend.poll`)."""
    away = elsewhere(handle, job_dir)
    request = common.read_json(job_dir / common.REQUEST_FILE)
    if request is None:
        if os.path.lexists(job_dir):
            raise GpuJobError(f"{job_dir / common.REQUEST_FILE} is missing or not valid JSON")
        return JobStatus(
            state=JobState.FAILED,
            reason=f"local job {handle.job_id}: its folder {job_dir} is gone (pruned, deleted, or the state "
            "directory is on another machine); how the job ended is unknown",
            interruption=names.LOST,
            capacity=handle.capacity,
        )
    status = common.read_json(job_dir / common.STATUS_FILE) or {"state": common.QUEUED}
    map_state(STATE_TABLE, str(status.get("state")), backend=backend)  # an unknown state is an error
    if status.get("state") not in common.TERMINAL_STATES and not away:
        # another host's supervisor cannot be seen from here: its status file is the truth
        status = check_supervisor(job_dir, request, status)
    state = map_state(STATE_TABLE, str(status.get("state")), backend=backend)
    reason = strip_cancel_prefix(str(status.get("reason") or ""))
    interruption, stopping = None, None
    if state.active:  # a stop asked for and not carried out yet: the cancel request says why
        asked = (common.read_json(job_dir / common.CANCEL_FILE) or {}).get("reason")
        stopping = strip_cancel_prefix(str(asked)) if asked else None
    elif state is JobState.CANCELLED:
        asked = str((common.read_json(job_dir / common.CANCEL_FILE) or {}).get("reason") or reason)
        if strip_cancel_prefix(asked).startswith(names.CAPACITY_TIMEOUT_MARK):
            interruption = names.CAPACITY_TIMEOUT
    elif state is JobState.PREEMPTED:
        interruption = names.PREEMPTED
    fault = status.get("fault") if state is JobState.FAILED else None
    if fault:  # a GPU hardware fault in a node's output (the supervisor read it): not the job's error
        interruption = names.NODE_FAULT
    started_at = status.get("started_at")
    ended_at = status.get("ended_at")
    held = 0.0
    if started_at is not None:
        end = ended_at if ended_at is not None else (time.time() if state.active else started_at)
        held = gpu_seconds(float(request["resources"]["gpus"]), int(request["resources"]["nodes"]), end - started_at)
    marks = common.read_json(job_dir / common.MARK_FILE) or {}
    owner_try = marks.get("owner_try")
    if owner_try is None:
        owner_try = (request.get("identity") or {}).get("try_number")
    return JobStatus(
        state=state,
        reason=reason,
        exit_code=status.get("exit_code"),
        started_at=started_at,
        ended_at=ended_at,
        gpu_seconds=held,
        output_uri=output_uri(job_dir),
        interruption=interruption,
        fault=str(fault) if fault else None,
        queued_since=status.get("queued_since") or request.get("submitted_at"),
        capacity=str(request.get("capacity") or handle.capacity),
        owner_try=int(owner_try) if owner_try is not None else None,
        collected=bool(marks.get("collected")),
        stopping=stopping,
    )


def output_uri(job_dir: Path) -> str | None:
    """The URI the job wrote to ``GPU_PROVIDER_OUTPUT_FILE``, if any."""
    text = common.read_small_text(job_dir / common.OUTPUT_FILE)
    return (text or "").strip() or None


def supervisor_of(job_dir: Path, status: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The pid and start time of the job's supervisor (``None``: it never recorded them)."""
    if status.get("supervisor_pid"):
        return int(status["supervisor_pid"]), status.get("supervisor_start")
    info = common.read_json(job_dir / common.SUPERVISOR_FILE) or {}
    pid = info.get("pid")
    return (int(pid), info.get("pid_start")) if pid else (None, None)


def check_supervisor(job_dir: Path, request: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """Turn a non-terminal status whose supervisor is gone into a terminal one (and kill the rest)."""
    known = _orphans.get(str(job_dir))
    if known is not None:
        return known
    pid, pid_start = supervisor_of(job_dir, status)
    fatal = str((common.read_json(job_dir / common.FATAL_FILE) or {}).get("reason") or "")
    if pid is None:
        if not fatal and time.time() - float(request.get("submitted_at", 0)) < SUPERVISOR_START_TIMEOUT_S:
            return status  # submit is between starting the supervisor and recording its pid
        reason = fatal or "local supervisor never started (the submitting worker died during submit?)"
    elif common.is_alive(pid, pid_start):
        return status
    else:
        reason = fatal or f"local supervisor process {pid} disappeared"
    # the supervisor may have written its final state just before exiting
    fresh = common.read_json(job_dir / common.STATUS_FILE) or status
    if fresh.get("state") in common.TERMINAL_STATES:
        return fresh
    return end_orphan(job_dir, request, fresh, reason)


def end_orphan(job_dir: Path, request: Mapping[str, Any], status: dict[str, Any], reason: str) -> dict[str, Any]:
    """Kill the node processes of a job without a supervisor and record its end.

    When the record cannot be written (disk full), the verdict is kept in memory and returned:
    poll answers the same on every call instead of raising.
    """
    common.kill_groups(status.get("nodes") or [], signal.SIGKILL)
    common.remove_work_dir(request.get("work_dir"))
    cancel = common.read_json(job_dir / common.CANCEL_FILE)
    if cancel is not None:
        state, reason = common.CANCELLED, str(cancel.get("reason") or "cancelled")
    else:
        state = common.FAILED
    now = time.time()
    status = {**status, "state": state, "reason": reason, "ended_at": now, "updated_at": now}
    try:
        common.write_json_atomic(job_dir / common.STATUS_FILE, status)
    except OSError as err:
        _orphans[str(job_dir)] = status
        log.warning("local job %s: %s; could not record it in status.json (%s)", job_dir.name, reason, err)
    else:
        _orphans.pop(str(job_dir), None)
    log.warning("local job %s: %s; marked %s", job_dir.name, reason, state.upper())
    return status
