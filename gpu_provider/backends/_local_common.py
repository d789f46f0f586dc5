"""What the local backend and its supervisor process share: the on-disk layout of a job, the
supervisor's states, atomic JSON files, and process liveness / killing.

Standard library only: the supervisor imports this module, and it must start fast and never pull
in Airflow.

On-disk layout under the state directory::

    <state_dir>/
      gpu-allocations.lock          flock()ed while the allocations file is read or written
      gpu-allocations.json          {job_id: {"pid", "pid_start", "devices": {"<index>": share}}}
      jobs/<job_id>/
        request.json                everything the supervisor needs (written once, at submit)
        supervisor.json             pid and start time of the supervisor (written by submit)
        status.json                 the supervisor's state, pids, times, exit codes (atomic rewrites)
        cancel.json                 present once a cancel was asked for: {"reason", "at"}
        job.log                     every node's stdout+stderr, lines prefixed ``[node <rank>] ``
        supervisor.log              the supervisor's own stdout/stderr (tracebacks land here)
        output_uri                  written by the job (``GPU_PROVIDER_OUTPUT_FILE``) to declare its output
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# --- layout ------------------------------------------------------------------------------------

JOBS_DIR = "jobs"
REQUEST_FILE = "request.json"
SUPERVISOR_FILE = "supervisor.json"
STATUS_FILE = "status.json"
CANCEL_FILE = "cancel.json"
LOG_FILE = "job.log"
SUPERVISOR_LOG_FILE = "supervisor.log"
OUTPUT_FILE = "output_uri"
ALLOC_FILE = "gpu-allocations.json"
ALLOC_LOCK_FILE = "gpu-allocations.lock"

#: bumped when request.json changes incompatibly
REQUEST_VERSION = 1

# --- the supervisor's states -------------------------------------------------------------------
# Written into status.json["state"]; local.py maps each to a JobState in one table.

QUEUED = "queued"  # written by submit, before the supervisor runs
WAITING_FOR_GPUS = "waiting_for_gpus"  # the supervisor runs but the GPUs it needs are taken
STARTING = "starting"  # spawning the node processes
RUNNING = "running"
STOPPING = "stopping"  # SIGTERM sent to the nodes, waiting out the grace period
SUCCEEDED = "succeeded"
FAILED = "failed"
PREEMPTED = "preempted"
CANCELLED = "cancelled"

SUPERVISOR_STATES = (QUEUED, WAITING_FOR_GPUS, STARTING, RUNNING, STOPPING, SUCCEEDED, FAILED, PREEMPTED, CANCELLED)
TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, PREEMPTED, CANCELLED})

#: environment variables a node inherits from the worker; everything else (connections, cloud keys) stays out
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME", "PYTHONPATH")


def base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of an environment (see :data:`BASE_ENV_KEYS`)."""
    return {k: environ[k] for k in BASE_ENV_KEYS if k in environ}


# --- files -------------------------------------------------------------------------------------


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON so that a reader sees the old or the new content, never half of it.

    :param path: the target file; a temporary sibling is written first and renamed over it
    :param data: JSON-serialisable mapping
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    # 0o600: request.json holds the job's env, which may carry values the DAG author considers private
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when the file is missing or not (yet) valid JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- processes ---------------------------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    """A token that identifies the process ``pid`` across pid reuse, or ``None`` if it is not running.

    On Linux this is the start time in clock ticks from ``/proc/<pid>/stat``; zombies count as not
    running (a SIGKILLed supervisor stays a zombie until its parent, maybe a busy worker, reaps it).
    Elsewhere it is ``0`` for any live pid (no reuse protection).
    """
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        return _kill_zero(pid)
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _kill_zero(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return 0
    return 0


def is_alive(pid: int | None, start_time: int | None) -> bool:
    """Whether the process that had ``start_time`` (see :func:`process_start_time`) still runs as ``pid``."""
    if not pid:
        return False
    now = process_start_time(pid)
    if now is None:
        return False
    # a start time of 0 or None means "unknown" (not Linux): trust the pid
    return not start_time or not now or now == start_time


def signal_group(pid: int, start_time: int | None, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (each node runs in its own session).

    The group is signalled even when its leader already exited, so the command's children die too;
    Linux does not hand out a pid again while it still names a process group. Only when ``pid`` now
    belongs to a *different* process (another start time) is nothing sent.
    """
    now = process_start_time(pid)
    if now is not None and start_time and now and now != start_time:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_groups(nodes: Iterable[Mapping[str, Any]], sig: int = signal.SIGKILL) -> None:
    """Signal the process group of every node record ``{"pid": ..., "pid_start": ...}`` in a status file."""
    for node in nodes:
        pid = node.get("pid")
        if isinstance(pid, int) and pid > 0:
            signal_group(pid, node.get("pid_start"), sig)
