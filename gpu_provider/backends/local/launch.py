"""Starting a job: its ``request.json`` record, its work folder, and its detached supervisor process
(forked by the fork server of the state directory, else spawned here and reaped later by this process)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gpu_provider
from gpu_provider.backends.base import JobHandle, JobRequest
from gpu_provider.backends.local import common, forkserver
from gpu_provider.backends.local.folders import this_host
from gpu_provider.exceptions import GpuJobError

log = logging.getLogger("gpu_provider.backends.local")

#: what ``python -m`` runs for each job. Nothing recognises a running supervisor by its command line (a pid
#: and its start time identify it), so one started by 0.4.0 or earlier, as
#: ``-m gpu_provider.backends._local_supervisor``, is found, cancelled and reaped all the same.
SUPERVISOR_MODULE = "gpu_provider.backends.local.supervisor"
#: the supervisor's interpreter skips ``site`` (-S): it imports the standard library and this package only (found
#: through PYTHONPATH), and site-packages' ``.pth`` files (an editable install's finder among them) cost every
#: job's start 10-20 ms
SUPERVISOR_FLAGS = ("-S",)

# Supervisors this process started: polled now and then so finished ones are reaped, not left as zombies.
_children: list[subprocess.Popen[bytes]] = []
_children_lock = threading.Lock()


def reap_children() -> None:
    """Forget (and so reap) the supervisors this process started that have exited."""
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]
        _servers[:] = [p for p in _servers if p.poll() is None]


def work_folder(job_id: str, run_as: Mapping[str, Any] | None) -> str | None:
    """A ``run_as_user`` job's own writable folder, outside the state directory (which its user cannot enter)."""
    work_dir: str | None = None
    if run_as is not None:
        try:
            work_dir = tempfile.mkdtemp(prefix=f"gpu-provider-{job_id}-")
            os.chown(work_dir, run_as["uid"], run_as["gid"])
        except OSError as err:
            common.remove_work_dir(work_dir)
            raise GpuJobError(f"local job {job_id}: could not create its work folder: {err}") from err
    return work_dir


def request_record(
    request: JobRequest,
    handle: JobHandle,
    *,
    cwd: str,
    run_as: Mapping[str, Any] | None,
    work_dir: str | None,
    devices: list[int],
    model: str | None,
    grace_period: float,
    spot_index: int | None,
    preempt_after: float | None,
    state_dir: Path,
) -> dict[str, Any]:
    """What ``request.json`` holds: everything the supervisor needs, except the environment's values."""
    identity = request.identity
    return {
        "version": common.REQUEST_VERSION,
        "job_id": handle.job_id,
        "handle": handle.to_dict(),
        "task": asdict(identity.task),
        "identity": {
            "name": identity.name,
            "try_number": identity.try_number,
            "attempt": identity.attempt,
            "capacity": identity.capacity,
            "team": identity.team,
            "tags": identity.tags(),
        },
        "command": list(request.command),
        # names only: the values go to the supervisor over a pipe and never touch the disk
        "env_keys": sorted(request.env),
        "cwd": cwd,
        "host": this_host(),
        "run_as": run_as,
        "work_dir": work_dir,
        "resources": request.resources.to_dict(),
        "capacity": request.capacity,
        "image": request.image,
        "max_runtime_s": request.max_runtime_s,
        "checkpoint_uri": request.checkpoint_uri,
        "resume_from": request.resume_from,
        "gpu_devices": devices,
        "gpu_model": model,
        "instance_type": request.instance_type,
        "grace_period": grace_period,
        "spot_index": spot_index,
        "preempt_after_s": preempt_after,
        "state_dir": str(state_dir),
        "submitted_at": handle.submitted_at,
    }


def supervisor_env() -> dict[str, str]:
    """The supervisor's own environment: the allow-listed part of the worker's (no connections or keys in its
    ``/proc/<pid>/environ`` either), plus the directory this package is imported from."""
    env = common.base_env(os.environ)
    package_root = str(Path(gpu_provider.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    return env


def start_supervisor(job_dir: Path, secrets_payload: Mapping[str, Any], *, state_dir: Path | None = None) -> int:
    """Start the job's supervisor, hand it the environment values, record its pid; return the pid.

    With ``state_dir`` and ``[gpu_provider] local_fork_server`` on, the fork server of ``state_dir`` forks
    it (:mod:`~gpu_provider.backends.local.forkserver`); when there is none, or it refuses or does not
    answer, nothing was started there and the supervisor is spawned here, as a new interpreter.
    A failure after the process started kills it (its whole session) before raising.
    """
    env = supervisor_env()
    start_server: Callable[[], None] | None = None
    if state_dir is not None:
        enabled, idle_s = fork_server_settings()
        if enabled and sys.platform.startswith("linux"):  # peer credentials, /proc: Linux only
            pid, start_server = _via_fork_server(state_dir, job_dir, env, secrets_payload, idle_s)
            if pid is not None:
                return pid
    proc = _spawn_supervisor(job_dir, env, secrets_payload)
    if start_server is not None:
        start_server()  # after this job's supervisor: starting the server does not delay this launch
    return proc.pid


def _spawn_supervisor(
    job_dir: Path, env: Mapping[str, str], secrets_payload: Mapping[str, Any]
) -> subprocess.Popen[bytes]:
    with open(job_dir / common.SUPERVISOR_LOG_FILE, "ab") as sup_log:
        proc = subprocess.Popen(
            [sys.executable, *SUPERVISOR_FLAGS, "-m", SUPERVISOR_MODULE, str(job_dir)],
            cwd=job_dir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=sup_log,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,  # not in the worker's process group: a worker crash does not stop the job
        )
    try:
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(json.dumps(secrets_payload).encode("utf-8"))
        common.overwrite_in_place(
            job_dir / common.SUPERVISOR_FILE, {"pid": proc.pid, "pid_start": common.process_start_time(proc.pid)}
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    with _children_lock:
        _children.append(proc)
    return proc


# --- the fork server ---------------------------------------------------------------------------

# Fork servers this process started (reaped like the supervisors), and when it last tried to start each name.
_servers: list[subprocess.Popen[bytes]] = []
_server_tries: dict[tuple[str, str], float] = {}
#: a name whose server did not come up is not started again for this long by this process
_SERVER_RETRY_S = 30.0


def fork_server_settings() -> tuple[bool, float]:
    """``[gpu_provider] local_fork_server`` (default on) and ``local_fork_server_idle_s`` (default 600)."""
    from gpu_provider.backends.local.options import fork_server_settings as read

    return read()


def _via_fork_server(
    state_dir: Path, job_dir: Path, env: Mapping[str, str], secrets_payload: Mapping[str, Any], idle_s: float
) -> tuple[int | None, Callable[[], None] | None]:
    """The supervisor's pid, forked by the fork server; ``None`` when it started nothing (then the caller
    spawns the supervisor). With it, when no server runs there: what starts one for the next launches."""
    try:
        code_hash = forkserver.source_hash()
        name = forkserver.server_name(code_hash)
        folder_fd = forkserver.open_folder(state_dir)
    except OSError as err:
        log.debug("local fork server not used: %s", err)
        return None, None
    folder = state_dir / forkserver.FOLDER
    try:
        address = forkserver.socket_address(folder, name, folder_fd)

        def record(pid: int, pid_start: int | None) -> None:
            common.overwrite_in_place(job_dir / common.SUPERVISOR_FILE, {"pid": pid, "pid_start": pid_start})

        try:
            pid = forkserver.request_start(
                address,
                code_hash=code_hash,
                job_dir=job_dir,
                env=env,
                on_pid=record,
                secrets_payload=secrets_payload,
            )
            return pid, None
        except forkserver.Refused as err:
            log.debug("local fork server: %s; spawning the supervisor", err)
            if err.absent:
                return None, lambda: _start_server(folder, name, code_hash, idle_s)
            return None, None
    finally:
        os.close(folder_fd)


def _start_server(folder: Path, name: str, code_hash: str, idle_s: float) -> None:
    """Start the fork server ``name`` detached (its own session); its settings go over its stdin."""
    now = time.monotonic()
    with _children_lock:
        if now - _server_tries.get((str(folder), name), -_SERVER_RETRY_S) < _SERVER_RETRY_S:
            return
        _server_tries[str(folder), name] = now
    settings = {"folder": str(folder), "name": name, "hash": code_hash, "idle_s": idle_s}
    try:
        log_fd = os.open(folder / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with open(log_fd, "ab") as server_log:
            proc = subprocess.Popen(
                [sys.executable, *SUPERVISOR_FLAGS, "-m", forkserver.SERVER_MODULE],
                cwd=folder,
                env=supervisor_env(),
                stdin=subprocess.PIPE,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,  # outlives this worker, like the supervisors it forks
            )
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(json.dumps(settings).encode("utf-8"))
    except OSError as err:
        log.warning("could not start the local fork server in %s: %s", folder, err)
        return
    log.info("local fork server %s starting (pid %s) in %s", name, proc.pid, folder)
    with _children_lock:
        _servers.append(proc)


def stop_fork_servers(timeout: float = 5.0) -> None:
    """Stop the fork servers this process started (SIGTERM; the supervisors they forked run on)."""
    with _children_lock:
        servers = list(_servers)
    for proc in servers:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    reap_children()
