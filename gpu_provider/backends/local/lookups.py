"""Finding jobs in the state directory: the attempts of a task, one job by id or name, every job, and the
jobs that have not ended (``list_owned``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpu_provider.backends.base import JobHandle, JobState, JobStatus, OwnedJob, PollResult, TaskKey, lookup_key
from gpu_provider.backends.local import common
from gpu_provider.backends.local.folders import job_dirs, task_requests


def find_existing(jobs: Path, task: TaskKey) -> list[JobHandle]:
    """Every attempt of exactly this task instance in ``jobs/``, oldest attempt first."""
    handles = [JobHandle.from_dict(req["handle"]) for req in task_requests(jobs, task) if "handle" in req]
    return sorted(handles, key=lambda h: (h.attempt, h.submitted_at, h.job_id))


def lookup(jobs: Path, *, job_id: str | None, name: str | None) -> JobHandle | None:
    """A job by id or by attempt name in ``jobs/`` (see :meth:`LocalBackend.lookup`)."""
    field_name, value = lookup_key(job_id, name)
    if "/" in value or "\0" in value or value.startswith("."):
        # never a path: the value may come from a template, and folders outside jobs/ are not jobs
        raise ValueError(f"{field_name}={value!r}: local job ids and names hold no '/' and do not start with '.'")
    folder = jobs / value
    # its own folder first; folders of older versions carry a random suffix after the name
    first = [folder] if folder.is_dir() and not folder.is_symlink() else []
    for job_dir in [*first, *job_dirs(jobs)]:
        req = common.read_json(job_dir / common.REQUEST_FILE)
        if req is not None and "handle" in req:
            handle = JobHandle.from_dict(req["handle"])
            if value == (handle.job_id if field_name == "job_id" else handle.name):
                return handle
    return None


def task_of(job_dir: Path) -> TaskKey | None:
    """The task instance recorded in the job's ``request.json`` (``None`` once its folder is gone)."""
    req = common.read_json(job_dir / common.REQUEST_FILE)
    task = (req or {}).get("task")
    return TaskKey(**task) if isinstance(task, dict) else None


def list_jobs(jobs: Path) -> list[JobHandle]:
    """Every job in ``jobs/``, of any task, oldest submission first."""
    requests = (common.read_json(job_dir / common.REQUEST_FILE) for job_dir in job_dirs(jobs))
    handles = [JobHandle.from_dict(req["handle"]) for req in requests if req is not None and "handle" in req]
    return sorted(handles, key=lambda h: (h.submitted_at, h.job_id))


def list_owned(jobs: Path, poll: Callable[[Sequence[JobHandle]], PollResult]) -> list[OwnedJob]:
    """Every job in ``jobs/`` that ``poll`` does not report ended (see :meth:`LocalBackend.list_owned`)."""
    owned: list[OwnedJob] = []
    for job_dir in job_dirs(jobs):
        req = common.read_json(job_dir / common.REQUEST_FILE)
        if req is None or "handle" not in req:
            continue
        handle = JobHandle.from_dict(req["handle"])
        status = poll([handle])[handle.job_id]
        if isinstance(status, JobStatus) and status.state.terminal:
            continue
        task = req.get("task")
        identity = req.get("identity") or {}
        resources = req.get("resources") or {}
        owner = status.owner_try if isinstance(status, JobStatus) else None
        try_number = owner if owner is not None else identity.get("try_number")
        owned.append(
            OwnedJob(
                handle=handle,
                task=TaskKey(**task) if isinstance(task, dict) else None,
                state=status.state if isinstance(status, JobStatus) else JobState.RUNNING,
                try_number=int(try_number) if try_number is not None else None,
                team=identity.get("team") or None,
                started_at=status.started_at if isinstance(status, JobStatus) else None,
                nodes=int(resources.get("nodes") or 1),
                gpus=float(resources.get("gpus") or 0.0),
                max_runtime_s=req.get("max_runtime_s"),
                # the supervisor counts max_runtime from the job's start; a job waiting for GPUs has no limit
                max_wait_s=None,
                training_seconds=None,
            )
        )
    return sorted(owned, key=lambda o: (o.handle.submitted_at, o.handle.job_id))
