"""What the local backend and its supervisor process share: the on-disk layout of a job, the
supervisor's states, atomic JSON files, and process liveness / killing.

Standard library only: the supervisor imports this module, and it must start fast and never pull
in Airflow.

On-disk layout under the state directory (folders 0700, files 0600: only the worker's user reads them)::

    <state_dir>/
      gpu-allocations.lock          flock()ed while the allocations file is read or written
      gpu-allocations.json          {job_id: {"pid", "pid_start", "devices": {"<index>": share}}}
      jobs/<job_id>/                the job id is the attempt's identity name (one folder per attempt)
        request.json                what the supervisor needs, written once at submit. The job's
                                    environment is NOT here: only its variable names. The values reach
                                    the supervisor over a pipe on its stdin and stay in its memory.
        supervisor.json             pid and start time of the supervisor (preallocated at submit, filled in place)
        fatal.json                  preallocated at submit; the supervisor overwrites it in place with the
                                    reason it died when status.json can no longer be written (disk full)
        status.json                 the supervisor's state, pids, times, exit codes (atomic rewrites)
        cancel.json                 present once a cancel was asked for: {"reason", "at"}
        preempt.json                present once a simulated spot interruption was asked for now: {"reason", "at"}
        mark.json                   which Airflow try owns the attempt and whether its outcome was collected
        job.log                     every node's stdout+stderr, lines prefixed ``[node <rank>] ``
        supervisor.log              the supervisor's own stdout/stderr (tracebacks land here)
        work/                       the job's own folder: ``GPU_PROVIDER_OUTPUT_FILE`` is ``work/output_uri``.
                                    With ``run_as_user`` it belongs to that user (and ``<job_id>/`` is 0710,
                                    group of that user, so the user can reach ``work/`` and nothing else)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

# --- layout ------------------------------------------------------------------------------------

JOBS_DIR = "jobs"
REQUEST_FILE = "request.json"
SUPERVISOR_FILE = "supervisor.json"
STATUS_FILE = "status.json"
CANCEL_FILE = "cancel.json"
PREEMPT_FILE = "preempt.json"
LOG_FILE = "job.log"
SUPERVISOR_LOG_FILE = "supervisor.log"
MARK_FILE = "mark.json"
FATAL_FILE = "fatal.json"
OUTPUT_FILE = "output_uri"
ALLOC_FILE = "gpu-allocations.json"
ALLOC_LOCK_FILE = "gpu-allocations.lock"

#: bumped when request.json changes incompatibly (2: env names only, values over the supervisor's stdin)
REQUEST_VERSION = 2
#: size of the files written in place later (supervisor.json, fatal.json): no new disk block is needed then
PREALLOCATED_BYTES = 4096
#: the most bytes of an output URI file read (a URI is one short line)
OUTPUT_MAX_BYTES = 64 * 1024
#: folders the backend creates (the state directory, jobs/, each job's folder)
DIR_MODE = 0o700

# --- the supervisor's states -------------------------------------------------------------------
# Written into status.json["state"]; status.py maps each to a JobState in one table.

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

    :param path: the target file; a temporary sibling is written first (mode 0600) and renamed over it
    :param data: JSON-serialisable mapping
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        write_new(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_new(path: Path, data: Mapping[str, Any], *, preallocated: bool = False) -> None:
    """Create ``path`` (mode 0600; it must not exist) holding ``data`` as JSON.

    For a file in a folder nobody reads yet (a job's folder before it is renamed into place), where
    :func:`write_json_atomic`'s temporary file and rename buy nothing. ``preallocated``: padded to
    :data:`PREALLOCATED_BYTES` with its disk blocks allocated, for :func:`overwrite_in_place`. A failure
    may leave a partial file behind: the caller removes the folder.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if not preallocated:
            _write_all(fd, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))
            return
        try:
            # the blocks are really allocated now, not just promised: a later write into them cannot fail
            # for lack of space (POSIX), at a fraction of an fsync's cost (0.06 vs 3-5 ms on ext4)
            os.posix_fallocate(fd, 0, PREALLOCATED_BYTES)
            allocated = True
        except OSError:
            allocated = False  # a file system without it: write, then fsync, as a launch did before
        _write_all(fd, _padded(data))
        if not allocated:
            os.fsync(fd)
    finally:
        os.close(fd)


def overwrite_in_place(path: Path, data: Mapping[str, Any]) -> None:
    """Rewrite a file made by ``write_new(..., preallocated=True)`` without allocating disk space (works on a
    full disk).

    Readers may see a mix of old and new bytes for an instant; the files written this way are read
    only by a process that found the writer gone (fatal.json) or treats unreadable JSON as "not yet".
    """
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, _padded(data))
    finally:
        os.close(fd)


@contextlib.contextmanager
def supervisor_record(path: Path) -> Iterator[tuple[dict[str, Any] | None, Callable[[int, int | None], None]]]:
    """``supervisor.json`` (made by ``write_new(..., preallocated=True)``) under its lock: the supervisor it records
    (``None``: none yet) and what records one, in place. Whoever records a pid under the lock is the job's
    supervisor: a forked child records itself before it starts anything, and a worker that got no word from it
    starts a supervisor of its own only where none is recorded, holding the lock meanwhile."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            recorded = json.loads(os.pread(fd, PREALLOCATED_BYTES, 0) or b"null")
        except ValueError:
            recorded = None

        def record(pid: int, pid_start: int | None) -> None:
            data, done = _padded({"pid": pid, "pid_start": pid_start}), 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], done)

        yield (recorded if isinstance(recorded, dict) and recorded.get("pid") else None), record
    finally:
        os.close(fd)  # and so the lock


def _padded(data: Mapping[str, Any]) -> bytes:
    raw = json.dumps(data, sort_keys=True).encode("utf-8")
    if len(raw) >= PREALLOCATED_BYTES:  # a long reason: cut it, the file must not grow
        reason = str(data.get("reason", ""))[: PREALLOCATED_BYTES // 2]
        raw = json.dumps({**data, "reason": reason + " ..."}, sort_keys=True).encode("utf-8")[: PREALLOCATED_BYTES - 1]
    return raw.ljust(PREALLOCATED_BYTES - 1) + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when the file is missing or not (yet) valid JSON.

    A symbolic link is not followed (these files are the backend's own, never links).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    return _json_object(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file (mode 0600) so that a reader sees the old or the new content."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_small_text(path: Path, limit: int = OUTPUT_MAX_BYTES, *, owner: int | None = None) -> str | None:
    """The text of a small regular file written by the job, or ``None``.

    Refuses what a hostile job could plant to make the worker read another file for it: a symbolic
    link, something not a regular file, a hard link to a file of another user (``owner``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (owner is not None and info.st_uid != owner):
            return None
        raw = os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def remove_work_dir(path: Any) -> None:
    """Remove a ``run_as_user`` job's work folder. Its user may have put a link in its place: a link is
    removed, never followed, and ``shutil.rmtree`` follows no link inside."""
    if isinstance(path, str) and path:
        with contextlib.suppress(OSError):
            if os.path.islink(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)


def read_json_at(dir_fd: int, folder: str, name: str) -> dict[str, Any] | None:
    """``<folder>/<name>`` under the folder ``dir_fd`` as JSON, following no link (``None``: absent or bad)."""
    try:
        folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder_fd)
    except OSError:
        return None
    finally:
        os.close(folder_fd)
    return _json_object(fd)


def remove_tree_at(dir_fd: int, name: str) -> None:
    """Remove the entry ``name`` of the folder ``dir_fd`` and everything under it, best effort.

    Works through folder handles only and follows no symbolic link: a link is removed as a link.
    Whatever a path in the meantime points to, nothing outside ``dir_fd`` is touched.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)  # a file or a link (O_NOFOLLOW refused it), or nothing
        return
    try:
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                remove_tree_at(fd, entry.name)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=dir_fd)


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


def _json_object(fd: int) -> dict[str, Any] | None:
    """The JSON object in the open file ``fd`` (closed here), or ``None`` if it holds none (at most 16 MiB read)."""
    try:
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read(1 << 24) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
