"""The local backend's fork server: a per-user process that starts job supervisors by ``fork()``.

A job's supervisor must outlive the Airflow worker that submits it, so it cannot be a thread or a
plain child of the worker: it runs in a session of its own. Started as a new interpreter
(``python -S -m gpu_provider.backends.local.supervisor``), that costs every launch the interpreter's
start and the supervisor's imports (about 45-50 ms). The fork server pays them once: it is started
detached on first use (its own session), has the supervisor's code imported, and on a request over a
Unix socket forks a child that becomes exactly that supervisor (same job folder, same files, same
session and process group semantics). It exits after ``idle_s`` seconds without a request, on
SIGTERM, or when its socket file is gone (its state directory was deleted).

Where it lives, and why it is safe to use:

* ``<state_dir>/forkserver/`` (0700, the worker's user only) holds ``<name>.sock``, ``<name>.lock``
  (flocked for the server's life: one server per name), ``<name>.json`` (its pid and start time, no
  secret) and ``<name>.log``. ``<name>`` is keyed by the uid, the interpreter, the host and a hash of the
  source of every module the server has imported (:data:`SERVED_MODULES`): an upgraded provider or
  another interpreter never reaches an old server; the server refuses a request naming another hash too.
* Both ends check the other's uid (``SO_PEERCRED``).
* The job's environment values never reach the server: the forked child gets them from the worker
  over the connection, after the worker has recorded the child's pid. A child that does not receive
  them (the worker gave up, died, or the reply was lost) exits without starting anything, so a
  worker that falls back to a directly spawned supervisor never starts a second one.
* The worker asks before it writes the job's folder (:class:`Asked`): the child does what needs no folder
  meanwhile, and gets the environment once the folder and its pid are written (the create-or-adopt rename
  still decides before anything starts). The protocol, step by step: :mod:`.forkchild`.
* The child's environment, cwd, umask, rlimits, signal dispositions, stdin/stdout/stderr and open
  files are set to what a directly spawned supervisor would have: see :func:`.forkchild.prepare`.
* The fork is off the launch path, and so is the server: after each request (and once at start) the
  server forks a *spare* that leaves the server at once and accepts the next connection on the server's
  socket itself (the server does not while it has a spare), tells the server on a channel of its own, and
  goes on as a child forked on demand does; the server forks the next spare meanwhile. The spare exits
  (having started nothing) when its channel closes; when there is none, the server forks on demand.

Standard library only: the server imports nothing of Airflow.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_provider.backends.local import common, forkchild
from gpu_provider.backends.local.forkchild import RLIMITS, SIGNALS
from gpu_provider.backends.local.frames import peer_uid, recv, send

#: the modules a fork server has imported when it serves (their source is in its name's hash)
SERVED_MODULES = (
    "__init__.py",
    "backends/__init__.py",
    "backends/local/__init__.py",
    "backends/local/common.py",
    "backends/local/gpus.py",
    "backends/local/supervisor.py",
    "backends/local/forkserver.py",
    "backends/local/forkchild.py",
    "backends/local/frames.py",
)
#: what ``python -m`` runs for the server
SERVER_MODULE = "gpu_provider.backends.local.forkserver"
#: the folder under the state directory
FOLDER = "forkserver"
#: how long either end waits for the other within one request
IO_TIMEOUT_S = 5.0
#: how often the server looks at its socket file and its idle time
_TICK_S = 1.0
#: how long after a spare took a launch the server forks the next one (a launch arriving before gets it at once):
#: the fork (about 1 ms of CPU, more on a loaded machine) would otherwise compete with the launch for the cores
SPARE_AFTER_S = 0.05


class Refused(Exception):
    """The server did not start a supervisor for this request (nothing was started).

    ``absent``: no server listens there (no socket, or a dead server's): one may be started.
    """

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


# --- names and messages ------------------------------------------------------------------------


@functools.cache
def package_root() -> Path:
    """The folder holding the ``gpu_provider`` package the server imports (put on its ``PYTHONPATH``)."""
    return Path(__file__).resolve().parent.parent.parent.parent


#: the last hash per package root, with the files' identities (device, inode, size, mtime) it was read at
_hashes: dict[Path, tuple[tuple[tuple[int, int, int, int], ...], str]] = {}


def source_hash(root: Path | None = None) -> str:
    """A hash of the source of :data:`SERVED_MODULES` as it is on disk now: read again when a file changed identity,
    size or mtime (an upgrade replaces or rewrites them), else the last reading answers (8 stats, not ~100 KB)."""
    pkg = (root or package_root()) / "gpu_provider"
    paths = [pkg / rel for rel in SERVED_MODULES]
    stats = tuple((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for st in map(os.stat, paths))
    known = _hashes.get(pkg)
    if known is not None and known[0] == stats:
        return known[1]
    digest = hashlib.sha256()
    for rel, path in zip(SERVED_MODULES, paths, strict=True):
        digest.update(rel.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    _hashes[pkg] = (stats, digest.hexdigest())
    return digest.hexdigest()


def server_name(code_hash: str, *, uid: int | None = None, executable: str | None = None) -> str:
    """``fs-<uid>-<16 hex>``: one server per user, interpreter, source of the served modules and host (a
    state directory shared by several machines holds one server per machine)."""
    key = f"{executable or sys.executable}\0{code_hash}\0{socket.gethostname()}".encode()
    return f"fs-{os.geteuid() if uid is None else uid}-{hashlib.sha256(key).hexdigest()[:16]}"


def socket_address(folder: Path, name: str, folder_fd: int) -> str:
    """The socket's address; through ``/proc/self/fd`` when the path is too long for ``sun_path``."""
    path = str(folder / f"{name}.sock")
    if len(path.encode()) < 100:
        return path
    return f"/proc/self/fd/{folder_fd}/{name}.sock"


def open_folder(state_dir: Path) -> int:
    """``<state_dir>/forkserver``, created 0700 if missing, opened (the fd); refused unless it is a folder
    of this user that nobody else can enter."""
    folder = state_dir / FOLDER
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=common.DIR_MODE, parents=False)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise PermissionError(f"{folder} belongs to uid {info.st_uid} or is open to others (mode {info.st_mode:o})")
    return fd


# --- the worker's side -------------------------------------------------------------------------


def caller_context() -> dict[str, Any]:
    """What a supervisor spawned by this process would inherit besides its environment: umask, rlimits,
    the signals this process ignores."""
    mask = os.umask(0o077)
    os.umask(mask)
    ignored = []
    for sig in SIGNALS:
        if sig in (signal.SIGPIPE, signal.SIGXFSZ):
            continue  # set by every Python interpreter at start (and so by the spawned supervisor's)
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                ignored.append(sig)
        except (OSError, ValueError):
            pass
    return {
        "umask": mask,
        "rlimits": {str(int(r)): list(resource.getrlimit(r)) for r in RLIMITS},
        "ignored_signals": ignored,
    }


class Asked:
    """A supervisor asked of the server at ``address`` for ``job_dir``, which may not exist yet: the child gets
    ready meanwhile (see :mod:`~gpu_provider.backends.local.forkchild`), and starts nothing before :meth:`finish`
    sends it the job's environment. :meth:`abandon` (or a worker that dies) leaves it to exit having started
    nothing.

    :raises Refused: nothing can be asked there (no server: ``absent``; another user's; the request not sent)
    """

    def __init__(self, address: str, *, code_hash: str, job_dir: Path, env: Mapping[str, str]) -> None:
        self.address = address
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.conn.settimeout(IO_TIMEOUT_S)
            try:
                self.conn.connect(address)
            except (FileNotFoundError, ConnectionRefusedError) as err:
                raise Refused(f"no fork server at {address}: {err}", absent=True) from err
            except OSError as err:
                raise Refused(f"could not reach the fork server at {address}: {err}") from err
            try:
                if peer_uid(self.conn) != os.geteuid():
                    raise Refused(f"the fork server at {address} runs as another user")
                send(self.conn, {"hash": code_hash, "job_dir": str(job_dir), "env": dict(env), **caller_context()})
            except (OSError, ValueError, struct.error) as err:
                raise Refused(f"could not ask the fork server at {address}: {err}") from err
        except BaseException:
            self.conn.close()
            raise

    def finish(self, secrets_payload: Mapping[str, Any]) -> int:
        """Hand the child the job's environment (call it once the job's folder is written); the pid it recorded
        in ``supervisor.json`` once it says it started the job.

        :raises Refused: the child did not say it started: it refused (nothing started), its environment could not
            be sent (it starts nothing without it), or no word came in time (a timeout, an end); the caller
            starts a supervisor itself only where ``supervisor.json`` records none, under its lock
        """
        conn, address = self.conn, self.address
        try:
            ready, _, _ = select.select([conn], [], [], 0)
            if ready:  # a word before the environment is a refusal: it gets no environment
                raise Refused(f"the fork server at {address} refused: {_words(conn)}")
            try:
                send(conn, secrets_payload)
                conn.shutdown(socket.SHUT_WR)
            except (OSError, ValueError) as err:
                raise Refused(f"could not hand the job's environment to the fork server's child: {err}") from err
            try:
                reply = recv(conn)
            except (OSError, EOFError, ValueError, struct.error) as err:
                raise Refused(f"no word from the fork server's child at {address}: {err}") from err
            if not reply.get("started"):
                raise Refused(f"the fork server's child did not start the job: {reply.get('refused', reply)}")
            return int(reply["pid"])
        finally:
            conn.close()

    def abandon(self) -> None:
        """Withdraw the request: the child reads EOF and exits, having started nothing."""
        self.conn.close()


def _words(conn: socket.socket) -> str:
    """What the other end said (a refusal), or why it said nothing readable."""
    try:
        reply = recv(conn)
    except (OSError, EOFError, ValueError, struct.error) as err:
        return f"no answer ({err})"
    return str(reply.get("refused", reply))


def request_start(
    address: str, *, code_hash: str, job_dir: Path, env: Mapping[str, str], secrets_payload: Mapping[str, Any]
) -> int:
    """:class:`Asked` and its :meth:`~Asked.finish` at once, for a ``job_dir`` that exists already."""
    return Asked(address, code_hash=code_hash, job_dir=job_dir, env=env).finish(secrets_payload)


# --- the server --------------------------------------------------------------------------------


class Server:
    """One fork server: its socket, lock and pid file in ``folder``, named ``name``."""

    def __init__(self, folder: Path, name: str, code_hash: str, idle_s: float) -> None:
        self.folder = folder
        self.name = name
        self.code_hash = code_hash
        self.idle_s = idle_s
        self.stop = False
        self.why = ""
        self.listener: socket.socket | None = None
        self.folder_fd = -1
        self.lock_fd = -1
        self.wake_r = self.wake_w = -1
        self.sock_ino: int | None = None
        #: the next request's supervisor, forked ahead of it and waiting: (pid, the server's end of its channel)
        self.spare: tuple[int, socket.socket] | None = None

    # -- life

    def claim(self) -> bool:
        """Take the name's lock and bind its socket; ``False`` when another server holds the name."""
        self.folder_fd = open_folder(self.folder.parent)
        self.lock_fd = os.open(
            f"{self.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.folder_fd
        )
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self.name}.sock", dir_fd=self.folder_fd)  # a dead server's: the lock was free
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_address(self.folder, self.name, self.folder_fd))
        os.chmod(f"{self.name}.sock", 0o600, dir_fd=self.folder_fd)
        self.listener.listen(64)
        self.listener.setblocking(False)  # the spare and the server accept on it after select: never block
        self.sock_ino = os.stat(f"{self.name}.sock", dir_fd=self.folder_fd, follow_symlinks=False).st_ino
        me = os.getpid()
        common.write_json_atomic(
            self.folder / f"{self.name}.json",
            {"pid": me, "pid_start": common.process_start_time(me), "hash": self.code_hash, "started_at": time.time()},
        )
        return True

    def socket_is_mine(self) -> bool:
        try:
            return os.stat(f"{self.name}.sock", dir_fd=self.folder_fd, follow_symlinks=False).st_ino == self.sock_ino
        except OSError:
            return False

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop = True
        self.why = f"signal {signum}"

    def serve(self) -> None:
        assert self.listener is not None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes select: children are reaped at once
        last = time.monotonic()
        spare_at: float | None = None  # when to fork the next spare (None: there is one, or forks failed)
        try:
            self._fork_spare()
            while True:
                _reap()
                now = time.monotonic()
                idle = now - last
                if idle >= self.idle_s:
                    self.why = self.why or f"idle for {idle:.0f}s"
                elif not self.socket_is_mine():
                    self.why = self.why or "its socket is gone"
                if self.stop or self.why:
                    return
                if self.spare is None and spare_at is not None and now >= spare_at:
                    spare_at = None
                    self._fork_spare()
                # the spare accepts the next connection itself; the server only while it has none
                watched = self.spare[1].fileno() if self.spare is not None else self.listener.fileno()
                wait = min(_TICK_S, self.idle_s - idle, max(0.0, spare_at - now) if spare_at is not None else _TICK_S)
                ready, _, _ = select.select([watched, self.wake_r], [], [], wait)
                if self.wake_r in ready:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                if watched not in ready:
                    continue
                if self.spare is not None:
                    # the next spare is forked once this launch had the cores to itself (a dead spare's at once)
                    took = self._spare_took()
                    last = time.monotonic() if took else last
                    spare_at = last + SPARE_AFTER_S if took else time.monotonic()
                    continue
                if spare_at is not None:  # a launch before the next spare: fork it now, it takes the launch
                    spare_at = None
                    self._fork_spare()
                    if self.spare is not None:
                        continue
                try:  # no spare could be forked: fork on demand
                    conn, _ = self.listener.accept()
                except OSError:
                    continue
                last = time.monotonic()
                with conn:
                    self.handle(conn)
                spare_at = time.monotonic() + SPARE_AFTER_S
        finally:
            self.close()

    def close(self) -> None:
        self._drop_spare()
        if self.listener is not None:
            if self.socket_is_mine():
                with contextlib.suppress(OSError):
                    os.unlink(f"{self.name}.sock", dir_fd=self.folder_fd)
            if (common.read_json(self.folder / f"{self.name}.json") or {}).get("pid") == os.getpid():
                with contextlib.suppress(OSError):
                    os.unlink(f"{self.name}.json", dir_fd=self.folder_fd)
            self.listener.close()
            self.listener = None

    # -- one request

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(IO_TIMEOUT_S)
        try:
            if peer_uid(conn) != os.geteuid():
                return  # another user: no answer at all
            request = recv(conn)
            problem = self.check(request)
            if problem:
                send(conn, {"refused": problem})
                return
        except (OSError, EOFError, ValueError, struct.error):
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as err:
            with contextlib.suppress(OSError):
                send(conn, {"refused": f"fork failed: {err}"})
            return
        if pid == 0:  # the child: never returns into the server's loop
            code = 1
            try:
                code = self._child(conn, request)
            finally:
                os._exit(code)

    def check(self, request: Mapping[str, Any]) -> str:
        """Why this server cannot serve ``request`` the way a spawned supervisor would run ("": it can)."""
        if request.get("hash") != self.code_hash:
            asked = str(request.get("hash"))[:12]
            return f"this server runs other code (hash {self.code_hash[:12]}, asked for {asked})"
        job_dir = request.get("job_dir")
        if not isinstance(job_dir, str) or not os.path.isabs(job_dir):
            return f"job_dir={job_dir!r} is not an absolute path"
        if os.geteuid() != 0:  # limits can only be lowered: refuse what this server could not give
            for key, (_soft, hard) in (request.get("rlimits") or {}).items():
                have = resource.getrlimit(int(key))[1]
                if have != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > have):
                    return f"resource limit {key}: the worker's hard limit {hard} is above this server's {have}"
        return ""

    # -- the spare: a child forked ahead of the next request, waiting for it

    def _fork_spare(self) -> None:
        """Fork the next request's child now, while nobody waits: it leaves the server at once and accepts the
        next connection on the server's socket itself (then it is what :meth:`_child` is), telling the server
        on a channel of its own. It starts nothing before that, and exits when the channel closes (this server
        exits or drops it)."""
        if self.spare is not None or self.stop or self.why:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return  # the server accepts the next connection and forks on demand
        if pid == 0:
            code = 1
            try:
                ours.close()
                code = self._spare(theirs)
            finally:
                os._exit(code)
        theirs.close()
        self.spare = (pid, ours)

    def _drop_spare(self) -> None:
        if self.spare is not None:
            self.spare[1].close()  # the spare reads EOF and exits, having started nothing
            self.spare = None

    def _spare_took(self) -> bool:
        """The spare's news (its channel is readable): ``True`` when it took a connection, ``False`` when it
        died. Either way it is no longer the spare."""
        assert self.spare is not None
        channel = self.spare[1]
        try:
            channel.settimeout(IO_TIMEOUT_S)
            took = channel.recv(1) == b"t"
        except OSError:
            took = False
        self._drop_spare()
        return took

    def _spare(self, channel: socket.socket) -> int:
        """In the spare: leave the server, then accept the next connection (or exit when the channel closes)."""
        try:
            self._leave_server(keep_listener=True)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)  # a signal to a waiting spare ends it (no server handler)
            pid_start = common.process_start_time(os.getpid())  # read now, while nobody waits
            forkchild.rehearse()
            listener = self.listener
            assert listener is not None
            while True:
                ready, _, _ = select.select([listener.fileno(), channel.fileno()], [], [])
                if channel.fileno() in ready:
                    return 0  # the server is gone or dropped this spare (EOF): nothing was asked
                try:
                    conn, _ = listener.accept()  # non-blocking: another process may have been quicker
                except (BlockingIOError, InterruptedError):
                    continue
                break
            listener.close()
            self.listener = None
            with contextlib.suppress(OSError):
                channel.send(b"t")  # the server forks the next spare while this one serves
            channel.close()
        except BaseException:
            return 0
        conn.settimeout(IO_TIMEOUT_S)
        try:
            if peer_uid(conn) != os.geteuid():
                return 0  # another user: no answer at all
            request = recv(conn)
            problem = self.check(request)
            if problem:
                send(conn, {"refused": problem})
                return 0
        except (OSError, EOFError, ValueError, struct.error):
            return 0
        return forkchild.serve(conn, request, pid_start)

    def _child(self, conn: socket.socket, request: Mapping[str, Any]) -> int:
        """In a child forked on demand (no spare): leave the server, then become the supervisor."""
        try:
            self._leave_server()
        except BaseException as err:  # nothing started: the worker spawns the supervisor itself
            with contextlib.suppress(BaseException):
                send(conn, {"refused": f"the forked child could not set itself up: {type(err).__name__}: {err}"})
            return 1
        return forkchild.serve(conn, request, None)

    def _leave_server(self, *, keep_listener: bool = False) -> None:
        """In the forked child: drop the server's signal handlers, wake-up pipe, lock and (unless kept, by a spare
        until it accepts) socket, and lead a session of its own."""
        signal.set_wakeup_fd(-1)
        if self.listener is not None and not keep_listener:
            self.listener.close()
            self.listener = None
        for fd in (self.wake_r, self.wake_w, self.lock_fd, self.folder_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()  # like start_new_session=True: its own session and process group, led by itself


def _reap() -> None:
    """Reap the supervisors this server forked that have ended (they are its children until it exits)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def preload() -> None:
    """Import what a supervisor runs, once, in the server: its forked children start with it imported."""
    import gpu_provider.backends.local.supervisor  # noqa: F401


def main() -> int:
    """``python -S -m gpu_provider.backends.local.forkserver``; its settings arrive on stdin as JSON
    (``{"folder", "name", "hash", "idle_s"}``), so its command line names nothing."""
    settings = json.loads(sys.stdin.buffer.read(1 << 20) or b"{}")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    folder, name = Path(settings["folder"]), str(settings["name"])
    preload()
    code_hash = source_hash()
    if code_hash != settings.get("hash") or server_name(code_hash) != name:
        print(f"fork server {name}: the source changed since it was asked for; not serving", flush=True)
        return 0
    server = Server(folder, name, code_hash, float(settings.get("idle_s", 600.0)))
    if not server.claim():
        return 0  # another server holds the name
    print(f"fork server {name} (pid {os.getpid()}) serving; idle exit after {server.idle_s:g}s", flush=True)
    server.serve()
    print(f"fork server {name} (pid {os.getpid()}) exits: {server.why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
