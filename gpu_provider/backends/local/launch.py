"""Starting a job: its ``request.json`` record, its work folder, and its detached supervisor process
(reaped later by the process that started it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gpu_provider
from gpu_provider.backends.base import JobHandle, JobRequest
from gpu_provider.backends.local import common
from gpu_provider.backends.local.folders import this_host
from gpu_provider.exceptions import GpuJobError

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


def start_supervisor(job_dir: Path, secrets_payload: Mapping[str, Any]) -> subprocess.Popen[bytes]:
    """Start the job's supervisor, hand it the environment values over its stdin, record its pid.

    A failure after the process started kills it (its whole session) before raising.
    """
    # The supervisor gets the same allow-listed environment as the nodes (no connections or keys
    # in its /proc/<pid>/environ either), plus the directory this package is imported from.
    env = common.base_env(os.environ)
    package_root = str(Path(gpu_provider.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
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
