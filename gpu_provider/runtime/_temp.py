"""Temporary checkpoint entries: owner-tagged names, a lock while writing, removal of what a killed writer left.

A save killed mid-write (SIGKILL at the end of a grace period is how a spot interruption ends)
cannot clean up after itself, and its temporary folder holds a whole checkpoint. So every temporary
entry carries its owner in its name::

    <label>-<random token>@<host>@<pid>@<process start time>@<created, unix seconds>

and the folder a checkpoint is written into is locked (``flock``, exclusive) for as long as its
writer lives; the kernel drops the lock when the process dies, however it dies. A later save
removes an entry only when nobody holds its lock and either

- its owner ran on this host and is gone: its pid is not running, is a zombie, or now belongs to a
  process that started later (pids are reused, also by a restarted container), or
- its owner cannot be checked from here (another host sharing the file system, or a name without
  an owner) and it is older than :data:`STALE_TEMP_AGE_S`.

A writer on another host keeps its entry safe through its lock where the file system shares locks
between hosts (NFSv4, EFS), and through the age otherwise.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: no locks, the owner and age rules still apply
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: an unlocked temporary entry whose owner cannot be checked from this host is removed after this long
STALE_TEMP_AGE_S = 6 * 3600.0

_OWNER = re.compile(r"@(?P<host>[A-Za-z0-9_.-]*)@(?P<pid>[0-9]{1,10})@(?P<start>[0-9]{1,20})@(?P<created>[0-9]{1,12})$")
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")


@dataclass(frozen=True)
class Owner:
    """Who made a temporary entry, read back from its name."""

    host: str
    pid: int
    start: int  # process start time in clock ticks since boot (Linux), 0 where unknown
    created: int  # unix seconds


def this_host() -> str:
    """This host's name as it appears in temporary names (only ``[A-Za-z0-9._-]``, at most 64 characters)."""
    return _HOST_UNSAFE.sub("_", socket.gethostname())[:64] or "unknown"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """State and start time of ``pid`` from ``/proc`` (Linux), or ``None`` where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode("ascii", errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    fields = raw[raw.rfind(")") + 1 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def owner_tag() -> str:
    """The ``@host@pid@start@created`` suffix naming this process as the owner of a new entry."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return f"@{this_host()}@{pid}@{stat[1] if stat else 0}@{int(time.time())}"


def temp_name(label: str) -> str:
    """A unique temporary name ``<label>-<token>@<owner>``; ``label`` starts with the caller's prefix."""
    return f"{label}-{secrets.token_hex(4)}{owner_tag()}"


def parse_owner(name: str) -> Owner | None:
    """The owner recorded in ``name``, or ``None`` for a name without one (an older version's)."""
    match = _OWNER.search(name)
    if match is None:
        return None
    return Owner(match["host"], int(match["pid"]), int(match["start"]), int(match["created"]))


def owner_alive(owner: Owner) -> bool | None:
    """Whether the owner process still runs; ``None`` when that cannot be told from this host."""
    if owner.host != this_host() or owner.pid <= 0:
        return None
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    except OSError:
        return None
    stat = _proc_stat(owner.pid)
    if stat is None:
        return True  # no /proc: the pid exists, which is all we can tell
    state, start = stat
    if state in ("Z", "X"):
        return False  # killed, waiting for its parent to reap it
    return not (owner.start and start != owner.start)


def lock(path: Path) -> int | None:
    """Open ``path`` and hold an exclusive lock on it until the returned descriptor is closed.

    :return: the descriptor, or ``None`` where locks are not available.
    :raises BlockingIOError: another open file (another process, or another writer here) holds it.
    """
    if fcntl is None:
        return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if path.is_dir():
        flags |= getattr(os, "O_DIRECTORY", 0)
    fd = os.open(path, flags)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise BlockingIOError(exc.errno, "locked") from exc
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return None  # a file system without locks: the owner and age rules still apply
        raise
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _why_stale(name: str, modified: float, now: float, max_age_s: float) -> str | None:
    """Why an unlocked entry is stale, or ``None`` when it must be kept."""
    owner = parse_owner(name)
    if owner is not None:
        alive = owner_alive(owner)
        if alive is False:
            return f"its writer, process {owner.pid} on this host, is gone"
        if alive:
            return None
        created = float(owner.created)
    else:
        created = modified
    age = now - created
    if age >= max_age_s:
        return f"nobody holds its lock and it is {age / 3600:.1f} h old"
    return None


def remove_stale(
    parent: Path,
    prefix: str,
    *,
    max_age_s: float = STALE_TEMP_AGE_S,
    only_own_uid: bool = False,
    describe: str = "",
) -> list[str]:
    """Remove the temporary entries directly under ``parent`` whose names start with ``prefix`` and
    whose writers are gone (see the module docstring). Errors on one entry are logged and skipped.

    :param parent: the folder to look in.
    :param prefix: the prefix of temporary names there.
    :param max_age_s: age after which an unlocked entry whose owner cannot be checked is removed.
    :param only_own_uid: look only at entries of this process's user (a shared folder such as ``/tmp``).
    :param describe: how to name ``parent`` in log lines (e.g. its URI); ``parent`` itself when empty.
    :return: the names removed.
    """
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefix)]
    except FileNotFoundError:
        return []
    removed: list[str] = []
    now = time.time()
    for entry in entries:
        try:
            if _remove_if_stale(parent, entry, prefix, now, max_age_s, only_own_uid, describe or str(parent)):
                removed.append(entry.name)
        except OSError as exc:
            log.warning("could not check or remove %s under %s: %s", entry.name, describe or parent, exc)
    return removed


def _remove_if_stale(
    parent: Path, entry: os.DirEntry[str], prefix: str, now: float, max_age_s: float, own_uid: bool, where: str
) -> bool:
    info = entry.stat(follow_symlinks=False)
    if own_uid and hasattr(os, "getuid") and info.st_uid != os.getuid():
        return False
    path = parent / entry.name
    if entry.is_symlink():
        fd = None  # never follow a link: it is judged by its name and age, and unlinked, not its target
    else:
        try:
            fd = lock(path)
        except BlockingIOError:
            return False  # a live writer holds it
        except FileNotFoundError:
            return False  # its writer finished (or another save removed it) meanwhile
    try:
        reason = _why_stale(entry.name, info.st_mtime, now, max_age_s)
        if reason is None:
            return False
        if entry.is_dir(follow_symlinks=False):
            # Rename to a name owned by this process first: another save looking at the same time
            # then sees a live owner and leaves it alone, and a half-removed folder stays temporary.
            doomed = parent / temp_name(f"{prefix}del")
            try:
                os.rename(path, doomed)
            except FileNotFoundError:
                return False
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        log.info("removed %s/%s, left by a checkpoint save that did not finish: %s", where, entry.name, reason)
        return True
    finally:
        release(fd)
