"""The fork server's child: a process forked from the server that becomes one job's supervisor.

The child (the server's spare, forked ahead of a request, or one forked on demand) speaks for itself on the
worker's connection, in this order, so that it starts nothing the worker has not recorded:

1. it has the worker's request (the job's folder, the supervisor's environment and the caller's context),
   checked by the server's rules (the source hash above all: a refusal is its only word before step 3); the
   worker sends the request before it writes the job's folder;
2. meanwhile it takes on everything of a spawned supervisor that does not need the job's folder
   (:func:`prepare`);
3. it waits for the job's environment values (``secrets``), which the worker sends once the folder is written
   (the create-or-adopt rename has decided); without them (the worker died, gave up, or found the attempt
   taken) it exits having started nothing;
4. it enters the job's folder (:func:`enter_job_dir`: cwd, ``supervisor.log``) and records its own pid in
   ``supervisor.json`` under that file's lock (:func:`~.common.supervisor_record`), unless a pid is recorded
   already (a worker that heard nothing from it in time starts a supervisor of its own there, under the same
   lock): then it exits having started nothing. It says ``started`` with its pid (or why not: then nothing ran,
   and the worker spawns the supervisor itself where none is recorded) and runs the job.

So the worker waits for no answer before it hands over the environment, and the child records itself before
anything starts: a job's supervisor is always the one ``supervisor.json`` names, and there is one.

Standard library only, like the server and the supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_provider.backends.local import common
from gpu_provider.backends.local.frames import recv, send

#: how long a forked child waits for the job's environment after sending its pid (then it starts nothing)
SECRETS_TIMEOUT_S = 60.0
#: resource limits a job's supervisor inherits from the worker, set in the forked child the same
RLIMITS = tuple(
    getattr(resource, n)
    for n in (
        "RLIMIT_AS",
        "RLIMIT_CORE",
        "RLIMIT_CPU",
        "RLIMIT_DATA",
        "RLIMIT_FSIZE",
        "RLIMIT_MEMLOCK",
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_STACK",
    )
    if hasattr(resource, n)
)
#: every signal a disposition can be set for (``valid_signals()`` builds a set of enum members per call)
SIGNALS = tuple(sorted(int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)))


def serve(conn: socket.socket, request: Mapping[str, Any], pid_start: int | None) -> int:
    """In the forked child (it has left the server and leads its own session): steps 2 to 4 above, then the job.

    ``pid_start``: this process's start time, read ahead (a spare reads it while nobody waits)."""
    me = os.getpid()
    try:
        job_dir = Path(request["job_dir"])
        prepare(request, keep_fd=conn.fileno())  # while the worker writes the job's folder
        pid_start = pid_start or common.process_start_time(me)
    except BaseException as err:  # nothing started: the worker spawns the supervisor itself
        with contextlib.suppress(BaseException):
            send(conn, {"refused": f"the forked child could not set itself up: {type(err).__name__}: {err}"})
        return 1
    try:
        conn.settimeout(SECRETS_TIMEOUT_S)
        secrets = recv(conn)  # sent once the job's folder is written; a worker that dies closes (EOF at once)
    except BaseException:
        return 0  # the worker did not hand over the job's environment: start nothing
    try:
        enter_job_dir(job_dir)
        with common.supervisor_record(job_dir / common.SUPERVISOR_FILE) as (recorded, record):
            if recorded is None:
                record(me, pid_start)
    except BaseException as err:
        with contextlib.suppress(BaseException):
            send(conn, {"refused": f"the forked child could not enter {job_dir}: {type(err).__name__}: {err}"})
        return 1
    if recorded is not None:  # the worker heard nothing from this child in time and started the supervisor itself
        with contextlib.suppress(BaseException):
            send(conn, {"refused": f"supervisor {recorded.get('pid')} was recorded first"})
        return 0
    with contextlib.suppress(OSError):
        send(conn, {"started": True, "pid": me, "pid_start": pid_start})  # the worker returns meanwhile
    conn.close()
    from gpu_provider.backends.local.supervisor import run_job  # imported already by the server's preload()

    return run_job(job_dir, lambda: secrets, pid_start=pid_start)


def rehearse() -> None:
    """In a spare, before any request: run once, starting nothing and writing nothing, the code a launch then runs
    in this process up to the job's ``Popen`` and just after it (JSON, the port, a thread, ``Popen`` itself).

    A process just forked shares the server's memory pages, and the first write to each (a reference count's
    included) copies it: about 300 page copies on that path, 1-3 ms of a launch on this project's machines, that
    the spare pays here while nobody waits. The ``Popen`` is of a path that cannot exist (``/dev/null`` is no
    folder): the exec fails, so no program runs.
    """
    from gpu_provider.backends.local import supervisor  # imported already by the server's preload()

    with contextlib.suppress(Exception):
        status = {"state": common.RUNNING, "nodes": [{"rank": 0, "pid": 1, "pid_start": 1}], "at": time.time()}
        json.loads(json.dumps(status, indent=1, sort_keys=True))
        common.read_json(Path(os.devnull))
        supervisor._free_port()
        thread = threading.Thread(target=len, args=((),), name="rehearsal", daemon=True)
        thread.start()
        thread.join()
        with contextlib.suppress(OSError):
            subprocess.Popen(
                [os.path.join(os.devnull, "none")],
                env=dict(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
            )


def prepare(request: Mapping[str, Any], *, keep_fd: int) -> None:
    """Make this forked process what ``python -S -m ...supervisor <job_dir>``, spawned by the worker, is, in all
    that does not need the job's folder (which may not exist yet): :func:`enter_job_dir` does the rest.

    Signal dispositions: default for every signal, but those the worker ignores (ignored across exec) and
    what a new interpreter sets (SIGPIPE and SIGXFSZ ignored, SIGINT raising KeyboardInterrupt); the
    supervisor then installs its SIGTERM and SIGINT handlers itself. Signal mask: the server blocks none.
    Descriptors: stdin on ``/dev/null``, every other one of the server closed but ``keep_fd`` (the connection)
    and stdout / stderr (pointed at ``supervisor.log`` by :func:`enter_job_dir`).
    """
    ignored = {int(s) for s in request.get("ignored_signals") or ()}
    for sig in SIGNALS:
        handler: Any = signal.SIG_IGN if sig in ignored else signal.SIG_DFL
        if sig in (signal.SIGPIPE, signal.SIGXFSZ):
            handler = signal.SIG_IGN
        elif sig == signal.SIGINT and sig not in ignored:
            handler = signal.default_int_handler
        try:
            if signal.getsignal(sig) != handler:  # most are at their default already: no system call
                signal.signal(sig, handler)
        except (OSError, ValueError, RuntimeError):
            pass
    os.umask(int(request["umask"]))
    for key, (soft, hard) in (request.get("rlimits") or {}).items():
        if resource.getrlimit(int(key)) != (soft, hard):
            resource.setrlimit(int(key), (soft, hard))
    # the worker's environment for the supervisor, as it would be spawned with it: only what differs is set
    env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    # stdin: /dev/null (the spawned supervisor's pipe is pointed there once read)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if devnull > 2 and devnull != keep_fd:
        os.close(devnull)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, max(keep_fd + 2, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    sys.argv = [sys.argv[0], str(request["job_dir"])]


def enter_job_dir(job_dir: Path) -> None:
    """The job's folder as cwd, stdout and stderr appended to its ``supervisor.log`` (as a spawned supervisor's)."""
    os.chdir(job_dir)
    log_flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    log_fd = os.open(job_dir / common.SUPERVISOR_LOG_FILE, log_flags, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    if log_fd > 2:
        os.close(log_fd)
