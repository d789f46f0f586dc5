"""Start ``dag.test()`` children from a warm process instead of a fresh interpreter.

A fresh ``python -m gpu_provider.testing.dagrun`` spends about 16 s of CPU before and around its DAG:
importing Airflow (~5 s) and, on the first task, building the versioned routes of Airflow's in-process
execution API (~8 s, cadwyn). A test suite that runs a hundred DAGs on a 2-core machine spends most of its
time there. A *warm server* pays that once: it imports Airflow and this provider, builds the execution
API, and then forks one child per DAG run (about 2 s of CPU each). The child is still a process of its
own: its own session and process group (``os.killpg(child.pid, SIGKILL)`` is a worker crash), its own
log file, the environment of the run; only the interpreter's warm-up is shared.

One server per test process and per Airflow home and Airflow settings read at import (the environment's
``AIRFLOW*`` variables other than the DAGs folder, this provider's section, connections and variables,
which Airflow and the provider read when they use them). It exits with its test process (it watches its
stdin), killing the children still running. On by default on Linux; ``GPU_PROVIDER_TESTING_WARM=0`` turns
it off (fresh interpreters, as before), ``=1`` turns it on elsewhere (off by default on macOS, whose
system libraries are not safe to use after a fork).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: environment variables read when used, not at import: a run may set them without a server of its own
_LATE_PREFIXES = ("AIRFLOW__GPU_PROVIDER__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")
_LATE_KEYS = frozenset({"AIRFLOW__CORE__DAGS_FOLDER"})
#: how long a new server may take to warm up on a loaded machine before runs start fresh instead
_READY_TIMEOUT = 300.0
ENABLE_VARIABLE = "GPU_PROVIDER_TESTING_WARM"
#: what the server prints once it takes requests
READY = "gpu-provider-warm-server: ready"


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether runs start from a warm server: on by default on Linux (``GPU_PROVIDER_TESTING_WARM=0`` turns it
    off); elsewhere only when that variable is ``1`` (macOS's system libraries are not safe to fork after use)."""
    default = "1" if sys.platform.startswith("linux") else "0"
    value = (env if env is not None else os.environ).get(ENABLE_VARIABLE, default).strip().lower()
    return hasattr(os, "fork") and value not in {"0", "false", "no", "off"}


def _late(key: str) -> bool:
    return key in _LATE_KEYS or key.startswith(_LATE_PREFIXES)


def _fingerprint(env: Mapping[str, str]) -> str:
    """What a server was warmed with: the interpreter and the settings Airflow reads at import."""
    read_at_import = {k: v for k, v in env.items() if k.startswith(("AIRFLOW", "PYTHON")) and not _late(k)}
    blob = json.dumps([sys.executable, os.getcwd(), sorted(read_at_import.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class WarmChild:
    """A child the server forked, seen from the test process: the parts of ``subprocess.Popen`` the
    runner and tests use (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
    ``kill``). Its exit status comes from the server, which is its parent."""

    def __init__(self, pid: int, connection: socket.socket, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._connection = connection
        self._buffer = b""
        self._lock = threading.Lock()

    def _read_exit(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            deadline = None if timeout is None else time.monotonic() + timeout
            while b"\n" not in self._buffer:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self._connection.settimeout(left)
                try:
                    data = self._connection.recv(4096)
                except (TimeoutError, BlockingIOError):
                    return None
                if not data:  # the server is gone (killed its children on the way out, or was killed itself)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.pid, signal.SIGKILL)  # its own group: nothing of the run outlives it
                    self.returncode = -int(signal.SIGKILL)
                    self._connection.close()
                    return self.returncode
                self._buffer += data
            line, _, self._buffer = self._buffer.partition(b"\n")
            self.returncode = int(json.loads(line)["exit"])
            self._connection.close()
            return self.returncode

    def poll(self) -> int | None:
        return self._read_exit(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_exit(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmServer:
    """The test process's handle on one server: starts it, and asks it for children."""

    _servers: dict[str, WarmServer | None] = {}
    _lock = threading.Lock()

    def __init__(self, env: Mapping[str, str]) -> None:
        # the server's own environment: what Airflow reads at import, and the test process's; never a
        # run's connections, credentials or other values (a run gets its whole environment in its child)
        server_env = {
            key: value
            for key, value in env.items()
            if not _late(key) and (key.startswith(("AIRFLOW", "PYTHON")) or os.environ.get(key) == value)
        }
        self.folder = Path(tempfile.mkdtemp(prefix="gpu-warm-"))
        self.address = str(self.folder / "server.sock")
        self.log = self.folder / "server.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpu_provider.testing.warm", self.address],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env,
                start_new_session=True,
            )

    @classmethod
    def for_env(cls, env: Mapping[str, str]) -> WarmServer | None:
        """The running server for ``env`` (started and warmed on first use), or None when none can run."""
        key = _fingerprint(env)
        with cls._lock:
            if key not in cls._servers:
                server = cls(env)
                ready = server._ready()
                if not ready:
                    server.close()
                cls._servers[key] = server if ready else None
            found = cls._servers[key]
            if found is not None and found.process.poll() is not None:  # died since: start fresh from now on
                cls._servers[key] = found = None
            return found

    def _ready(self) -> bool:
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                print(f"gpu_provider.testing: the warm server exited; runs start fresh. Log:\n{tail}", file=sys.stderr)
                return False
            if os.path.exists(self.address) and READY in self.log.read_text(errors="replace"):
                return True
            time.sleep(0.05)
        print("gpu_provider.testing: the warm server did not start in time; runs start fresh", file=sys.stderr)
        return False

    def start(self, args: Sequence[str], env: Mapping[str, str], log: Path) -> WarmChild:
        """Fork a child that runs ``python -m gpu_provider.testing.dagrun *args`` with ``env``, output to ``log``."""
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.address)
        request = {"args": list(args), "env": dict(env), "log": str(log), "cwd": os.getcwd()}
        connection.sendall(json.dumps(request).encode() + b"\n")
        try:
            raw, rest = _read_line(connection, timeout=None)
            answer = json.loads(raw)
        except ConnectionError as err:
            raise RuntimeError(f"the warm server closed the connection; its log: {self.log}") from err
        if "error" in answer:
            raise RuntimeError(f"the warm server could not start the run: {answer['error']}")
        child = WarmChild(int(answer["pid"]), connection, [sys.executable, "-m", "gpu_provider.testing.dagrun", *args])
        child._buffer = rest  # the child's exit, when it came with the answer
        return child

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # the server sees EOF, kills its children and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def close_all(cls) -> None:
        with cls._lock:
            for server in cls._servers.values():
                if server is not None:
                    server.close()
            cls._servers.clear()


atexit.register(WarmServer.close_all)


# --- the server ----------------------------------------------------------------------------------


def _warm_up() -> None:
    """Import what every run imports, and build the in-process execution API once."""
    import airflow.models
    import airflow.sdk  # noqa: F401
    from airflow.sdk.execution_time import supervisor, task_runner  # noqa: F401

    app = supervisor.in_process_api_server().app
    initialize = getattr(app, "_cadwyn_initialize", None)  # builds the versioned routes a first request would
    if callable(initialize) and not getattr(app, "_cadwyn_initialized", True):
        initialize()
    import gpu_provider.backends.local.backend
    import gpu_provider.operators
    import gpu_provider.sensors  # noqa: F401

    _warm_first_use()

    for optional in (
        "gpu_provider.backends.batch",
        "gpu_provider.backends.sagemaker",
        "gpu_provider.backends.kubernetes",
        "airflow.providers.amazon.aws.hooks.base_aws",
        "airflow.providers.standard.operators.python",
    ):
        with contextlib.suppress(ImportError):
            __import__(optional)


def _warm_first_use() -> None:
    """What every run did again on its first use, done once before the forks: configure the ORM's mappers (the
    first query of each run configured all of Airflow's, about 0.3 s of CPU) and read the metrics registry (each
    run's first metric parsed Airflow's metrics YAML, about 0.2 s). Both hold no connection, file or thread; each
    is skipped where this Airflow lacks it (a run then does it itself, as before)."""
    from sqlalchemy.orm import configure_mappers

    configure_mappers()
    for stats in ("airflow._shared.observability.metrics.stats", "airflow.sdk._shared.observability.metrics.stats"):
        with contextlib.suppress(Exception):
            importlib.import_module(stats)._get_registry()


def _run_child(request: dict[str, Any], server_files: Sequence[Any]) -> None:
    """In the forked child: become the run's own process, run it, and exit with its code."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for file in server_files:  # the server's socket, pipes and connections are not the run's
        with contextlib.suppress(OSError):
            file.close() if hasattr(file, "close") else os.close(file)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [str(Path(__file__).with_name("dagrun.py")), *request["args"]]
    code = 0
    try:
        from airflow import settings
        from airflow.configuration import conf

        settings.DAGS_FOLDER = os.path.expanduser(conf.get_mandatory_value("core", "DAGS_FOLDER"))
        if settings.engine is not None:
            settings.engine.dispose(close=False)  # no connection of the server's is shared
        from gpu_provider.testing import dagchild

        dagchild.main(request["args"])
    except SystemExit as exit_:
        if isinstance(exit_.code, int):
            code = exit_.code
        elif exit_.code is not None:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _read_line(connection: socket.socket, timeout: float | None) -> tuple[bytes, bytes]:
    """One newline-ended message of the protocol (a request, or the server's answer to one), and what came after
    it in the same reads (a child that exits at once: its exit message arrives with the answer)."""
    data = b""
    connection.settimeout(timeout)
    while b"\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            raise ConnectionError("the other end closed the connection before its message ended")
        data += chunk
    connection.settimeout(None)
    line, _, rest = data.partition(b"\n")
    return line, rest


def serve(address: str) -> None:
    """Warm up, then fork a child per request until stdin closes (the test process is gone)."""
    _warm_up()
    # what the warm-up made lives as long as the server: out of the collector's sight, so that a run's full
    # collections do not walk (and copy, page by page, from the server) the million objects it inherits
    gc.freeze()
    if threading.active_count() > 1:  # forking a process with threads is not safe: refuse, runs start fresh
        raise SystemExit(f"warm-up left threads running ({threading.enumerate()}); not forking from here")
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    print(READY, flush=True)

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = children.pop(pid, None)
            if connection is not None:
                with contextlib.suppress(OSError):
                    selector.unregister(connection)
                with contextlib.suppress(OSError):
                    connection.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                connection.close()

    def kill_all() -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    try:
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "parent":
                    if not os.read(sys.stdin.fileno(), 4096):  # EOF: the test process closed us or died
                        return
                elif key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_read, 4096):
                            pass
                elif key.data == "accept":
                    connection, _ = listener.accept()
                    try:
                        request = json.loads(_read_line(connection, timeout=30)[0])
                        sys.stdout.flush()
                        sys.stderr.flush()
                        pid = os.fork()
                        if pid == 0:
                            server_files = [selector, listener, wake_read, wake_write, connection]
                            _run_child(request, [*server_files, *children.values()])
                        children[pid] = connection
                        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                        selector.register(connection, selectors.EVENT_READ, pid)
                    except Exception as err:  # a bad request fails that request, not the server
                        with contextlib.suppress(OSError):
                            connection.sendall(json.dumps({"error": repr(err)}).encode() + b"\n")
                        connection.close()
                else:  # a test process dropped its child's handle (closed the connection): stop that run
                    pid = int(key.data)
                    dropped = children.get(pid)
                    with contextlib.suppress(OSError):
                        if dropped is not None and dropped.recv(1) == b"":
                            selector.unregister(dropped)
                            with contextlib.suppress(ProcessLookupError):
                                os.killpg(pid, signal.SIGKILL)
            reap()
    finally:
        kill_all()
        reap()


if __name__ == "__main__":
    serve(sys.argv[1])
    # its children are killed and reaped: skip the interpreter's shutdown (the exit handlers of everything the
    # warm-up imported, Airflow's among them: about 1.5 s), which a test process closing its server waits for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
