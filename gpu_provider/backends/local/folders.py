"""Job folders in the state directory: which host a job runs on, scanning ``jobs/``, create-or-adopt."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobIdentity, TaskKey
from gpu_provider.backends.local import common
from gpu_provider.exceptions import GpuJobElsewhereError, GpuJobError


def this_host() -> str:
    """The name of the machine this process runs on, as recorded on the jobs it submits."""
    return socket.gethostname()


def elsewhere(handle: JobHandle, job_dir: Path) -> bool:
    """Whether the job runs on another machine; raise when its state cannot be read from this one."""
    host = handle.extra.get("host")
    here = this_host()
    if not host or host == here:
        return False
    if os.path.lexists(job_dir / common.REQUEST_FILE):
        return True  # a shared state directory: its files are the truth, its processes are not ours to see
    raise GpuJobElsewhereError(
        f"local job {handle.job_id} runs on host {host!r}, and this process runs on {here!r}, which cannot "
        f"see its state ({job_dir} is not here). The local backend keeps a job's state on the machine "
        "that started it: run the task's worker and triggerer on one machine (or deferrable=False), or set "
        "[gpu_provider] local_state_dir to a folder every worker and triggerer host mounts; across "
        "machines, use a remote backend such as batch. The job was left alone; a retry on "
        f"{host!r} reattaches to it"
    )


def ensure_jobs_dir(state_dir: Path) -> Path:
    """Create the state directory and ``jobs/`` (0700) if needed; refuse a ``jobs/`` that is a link."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=common.DIR_MODE)
    jobs = state_dir / common.JOBS_DIR
    with contextlib.suppress(FileExistsError):
        jobs.mkdir(mode=common.DIR_MODE)
    check_jobs_dir(jobs)
    return jobs


def check_jobs_dir(jobs: Path) -> None:
    """Refuse a ``jobs/`` that is a symbolic link or not a folder."""
    info = os.lstat(jobs)
    if not stat.S_ISDIR(info.st_mode):
        raise GpuJobError(
            f"{jobs} is a symbolic link or not a folder: the local backend keeps its jobs in a real folder "
            "inside its state directory and never follows links out of it. Remove it, or configure another "
            "state_dir"
        )


def job_dirs(jobs: Path) -> Iterator[Path]:
    """Every job folder in ``jobs/``: real folders only (no links, no half-made ``.new-*`` folders)."""
    try:
        check_jobs_dir(jobs)
        entries = list(os.scandir(jobs))
    except FileNotFoundError:
        return
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


def task_requests(jobs: Path, task: TaskKey) -> list[dict[str, Any]]:
    """request.json of every job of ``task`` in the state directory."""
    wanted = asdict(task)
    found = []
    for job_dir in job_dirs(jobs):
        # the name prefix narrows the scan; the stored TaskKey decides (prefixes are slugs and may collide)
        if not job_dir.name.startswith(task.prefix + "-"):
            continue
        req = common.read_json(job_dir / common.REQUEST_FILE)
        if req is not None and req.get("task") == wanted:
            found.append(req)
    return found


def previous_spot_attempts(jobs: Path, task: TaskKey) -> int:
    """How many spot attempts of ``task`` were submitted before (picks the simulated interruption)."""
    return sum(1 for req in task_requests(jobs, task) if req.get("capacity") == names.SPOT)


def existing(jobs: Path, identity: JobIdentity) -> JobHandle | None:
    """The attempt already submitted under ``identity.name``, if any (create-or-adopt)."""
    folder = jobs / identity.name
    candidates: list[dict[str, Any] | None] = []
    if folder.is_dir() and not folder.is_symlink():
        req = common.read_json(folder / common.REQUEST_FILE)
        if req is None:
            raise GpuJobError(
                f"local job {identity.name}: its folder {folder} exists but its request.json cannot be read; "
                "it cannot be adopted or submitted again. Remove the folder to submit this attempt anew"
            )
        candidates.append(req)
    # folders of older versions carry a random suffix after the name
    candidates.extend(task_requests(jobs, identity.task))
    for req in candidates:
        if req is None or (req.get("identity") or {}).get("name") != identity.name or "handle" not in req:
            continue
        if req.get("task") != asdict(identity.task):
            raise GpuJobError(
                f"local job {identity.name}: the name is taken by a job of another task ({req.get('task')}); "
                "this cannot happen unless two run hashes collide. Remove the folder or rename the task"
            )
        return JobHandle.from_dict(req["handle"])
    return None


def create_job_dir(jobs: Path, job_dir: Path, record: dict[str, Any]) -> JobHandle | None:
    """Write the job's folder under a temporary name and rename it into place.

    The rename is the create-or-adopt decision: it fails when ``job_dir`` exists, and then the
    handle of the job there is returned. A failure leaves no folder behind.
    """
    new = jobs / f".new-{job_dir.name}-{secrets.token_hex(4)}"
    new.mkdir(mode=common.DIR_MODE)
    try:
        # the folder is private until the rename: each file is written once, in place
        common.write_new(new / common.REQUEST_FILE, record)
        common.write_new(
            new / common.STATUS_FILE,
            {
                "state": common.QUEUED,
                "reason": "starting the local supervisor",
                "queued_since": record["submitted_at"],
                "updated_at": record["submitted_at"],
            },
        )
        # written in place later, so that neither needs disk space when it matters
        common.write_new(new / common.SUPERVISOR_FILE, {"pid": None}, preallocated=True)
        common.write_new(new / common.FATAL_FILE, {}, preallocated=True)
        os.close(os.open(new / common.LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        os.close(os.open(new / common.SUPERVISOR_LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        try:
            os.rename(new, job_dir)
        except OSError as err:
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            req = common.read_json(job_dir / common.REQUEST_FILE)
            if req is None or "handle" not in req:
                raise GpuJobError(
                    f"local job {job_dir.name}: {job_dir} exists but its request.json cannot be read; "
                    "remove the folder to submit this attempt anew"
                ) from err
            return JobHandle.from_dict(req["handle"])
    except BaseException as err:
        shutil.rmtree(new, ignore_errors=True)
        if isinstance(err, OSError):
            raise GpuJobError(f"local job {job_dir.name}: could not write its folder in {jobs}: {err}") from err
        raise
    shutil.rmtree(new, ignore_errors=True)  # only still there when the rename failed
    return None
