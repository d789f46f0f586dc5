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


class SupervisorStart:
    """Starting one job's supervisor in two steps: made before the job's folder is written (where a fork server
    runs, it is asked now, and its child gets ready while the folder is written), then :meth:`start` once the
    folder is there, or :meth:`abandon` when it is not to start (the attempt was adopted, the folder failed).

    With ``state_dir`` and ``[gpu_provider] local_fork_server`` on, the fork server of ``state_dir`` forks the
    supervisor (:mod:`~gpu_provider.backends.local.forkserver`); when there is none, or it refuses or does not
    answer, nothing was started there and the supervisor is spawned here, as a new interpreter.
    """

    def __init__(self, job_dir: Path, *, state_dir: Path | None = None) -> None:
        self.job_dir = job_dir
        self.env = supervisor_env()
        self.asked: forkserver.Asked | None = None
        self.start_server: Callable[[], None] | None = None
        if state_dir is not None:
            enabled, idle_s = fork_server_settings()
            if enabled and sys.platform.startswith("linux"):  # peer credentials, /proc: Linux only
                self.asked, self.start_server = _ask_fork_server(state_dir, job_dir, self.env, idle_s)

    def start(self, secrets_payload: Mapping[str, Any]) -> int:
        """Start the supervisor, hand it the environment values, record its pid; return the pid.

        A failure after the process started kills it (its whole session) before raising.
        """
        asked, self.asked = self.asked, None
        if asked is not None:
            try:
                return asked.finish(secrets_payload)  # the child recorded itself in supervisor.json
            except forkserver.Refused as err:
                log.debug("local fork server: %s; spawning the supervisor unless the child recorded itself", err)
        with common.supervisor_record(self.job_dir / common.SUPERVISOR_FILE) as (recorded, record):
            if recorded is not None:  # the fork server's child recorded itself before its word was lost
                return int(recorded["pid"])
            proc = _spawn_supervisor(self.job_dir, self.env, secrets_payload, record)
        if self.start_server is not None:
            self.start_server()  # after this job's supervisor: starting the server does not delay this launch
        return proc.pid

    def abandon(self) -> None:
        """Withdraw a request to the fork server that :meth:`start` did not finish (its child starts nothing)."""
        asked, self.asked = self.asked, None
        if asked is not None:
            asked.abandon()


def start_supervisor(job_dir: Path, secrets_payload: Mapping[str, Any], *, state_dir: Path | None = None) -> int:
    """:class:`SupervisorStart` and its :meth:`~SupervisorStart.start` at once, for a folder written already."""
    starting = SupervisorStart(job_dir, state_dir=state_dir)
    try:
        return starting.start(secrets_payload)
    finally:
        starting.abandon()


def _spawn_supervisor(
    job_dir: Path,
    env: Mapping[str, str],
    secrets_payload: Mapping[str, Any],
    record: Callable[[int, int | None], None],
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
        record(proc.pid, common.process_start_time(proc.pid))  # before it has its environment, as a forked one
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(json.dumps(secrets_payload).encode("utf-8"))
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


def _ask_fork_server(
    state_dir: Path, job_dir: Path, env: Mapping[str, str], idle_s: float
) -> tuple[forkserver.Asked | None, Callable[[], None] | None]:
    """A supervisor of ``job_dir`` asked of the fork server; ``None`` when it cannot be asked (then the caller
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
        try:
            return forkserver.Asked(address, code_hash=code_hash, job_dir=job_dir, env=env), None
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
