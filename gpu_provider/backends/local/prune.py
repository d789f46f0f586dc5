"""Pruning: deleting the folders of jobs that ended long ago, through folder handles, following no link."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpu_provider.backends.local.common import JOBS_DIR, STATUS_FILE, TERMINAL_STATES, read_json_at, remove_tree_at

# the log of the local backend (pruning reports what it removed there)
log = logging.getLogger("gpu_provider.backends.local")

#: a folder left by a submit that died before finishing it (``jobs/.new-*``) is removed after this long
STALE_NEW_DIR_S = 3600.0


def prune_jobs(jobs: Path, retention_days: float, wall: float) -> list[str]:
    """Delete the folders in ``jobs`` of jobs that ended more than ``retention_days`` before ``wall``
    (Unix time); return their ids. See :meth:`LocalBackend.prune` for what it never touches."""
    if retention_days <= 0:
        return []
    cutoff = wall - retention_days * 86400
    try:
        jobs_fd = os.open(jobs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    except OSError as err:  # ELOOP / ENOTDIR: a link or a file where jobs/ should be
        log.warning("not pruning %s: it is a symbolic link or not a folder (%s)", jobs, err)
        return []
    removed: list[str] = []
    try:
        for entry in list(os.scandir(jobs_fd)):
            if not entry.is_dir(follow_symlinks=False):
                continue  # links are not ours to follow or remove
            if entry.name.startswith("."):
                # a folder a submit was writing when it died (never renamed into place: no process)
                stale = entry.stat(follow_symlinks=False).st_mtime < wall - STALE_NEW_DIR_S
                if entry.name.startswith(".new-") and stale:
                    remove_tree_at(jobs_fd, entry.name)
                continue
            status = read_json_at(jobs_fd, entry.name, STATUS_FILE) or {}
            ended_at = status.get("ended_at")
            if not (
                status.get("state") in TERMINAL_STATES and isinstance(ended_at, (int, float)) and ended_at < cutoff
            ):
                continue
            remove_tree_at(jobs_fd, entry.name)
            try:
                os.lstat(entry.name, dir_fd=jobs_fd)
            except FileNotFoundError:
                removed.append(entry.name)
            else:
                log.warning("could not remove the folder of local job %s in %s completely", entry.name, jobs)
    finally:
        os.close(jobs_fd)
    if removed:
        log.info("removed %d local job folder(s) older than %g days from %s", len(removed), retention_days, jobs)
    return removed


# When each state directory was last pruned of old job folders (by this process).
_pruned_at: dict[str, float] = {}
_pruned_lock = threading.Lock()
PRUNE_EVERY_S = 600.0
#: in ``jobs/``: its modification time is when a process last pruned the state directory
PRUNED_STAMP = ".pruned"


def prune_now_and_then(state_dir: Path, prune: Callable[[], object]) -> None:
    """Call ``prune`` for ``state_dir`` at most every :data:`PRUNE_EVERY_S`, by all processes together (after a
    submit). Each Airflow task is a process of its own: without ``jobs/.pruned`` every task would read every job
    folder's status. An error is logged, never raised: housekeeping must never fail a submission."""
    key = str(state_dir)
    now = time.monotonic()
    with _pruned_lock:
        if now - _pruned_at.get(key, -math.inf) < PRUNE_EVERY_S:
            return
        _pruned_at[key] = now
    stamp = state_dir / JOBS_DIR / PRUNED_STAMP
    try:
        with contextlib.suppress(FileNotFoundError):
            if 0 <= time.time() - os.stat(stamp, follow_symlinks=False).st_mtime < PRUNE_EVERY_S:
                return  # another process pruned it lately
        os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        os.utime(stamp, follow_symlinks=False)
        prune()
    except OSError as err:
        log.warning("could not prune old local jobs in %s: %s", key, err)
