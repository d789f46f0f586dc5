"""Finding Batch jobs again, by name or id: an attempt before it is submitted (create-or-adopt), every attempt
of a task, one job, the task a job belongs to, and every active job this provider owns (the reaper's list).

Batch lists jobs per queue (ListJobs, by ``JOB_NAME`` or by state), and its listings hold no tags: each
lookup describes what it found (DescribeJobs, 100 at a time) and checks the task tags. Reads only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpu_provider import names
from gpu_provider.backends.aws.calls import PATIENT_ATTEMPTS
from gpu_provider.backends.base import JobHandle, JobIdentity, JobState, JobStatus, OwnedJob, TaskKey, task_from_tags
from gpu_provider.backends.batch.service import BatchJobs
from gpu_provider.backends.batch.status import owned_job
from gpu_provider.backends.common import ATTEMPT_NAME_END

#: Batch states of jobs that have not ended (what :func:`list_owned` lists)
ACTIVE_BATCH_STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")

HandleOf = Callable[[Mapping[str, Any], str, Mapping[str, Any]], JobHandle]
"""The handle of a job found on a queue: ``(job, queue, its ListJobs summary or {})``."""


def owned_by(job: Mapping[str, Any], task: TaskKey) -> bool:
    """Whether a job found by name belongs to the task (names shorten the ids; the tags hold them whole)."""
    tags = job.get("tags") or {}
    return bool(
        tags.get(names.TAG_DAG_ID, task.dag_id[:256]) == task.dag_id[:256]
        and tags.get(names.TAG_TASK_ID, task.task_id[:256]) == task.task_id[:256]
    )


def newest(jobs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Of several jobs of one name, the newest active one, else the newest."""
    ordered = sorted(
        jobs, key=lambda j: (str(j.get("status")) not in ("SUCCEEDED", "FAILED"), int(j.get("createdAt") or 0))
    )
    return ordered[-1] if ordered else None


def find_attempt(jobs: BatchJobs, identity: JobIdentity, queue: str, handle_of: HandleOf) -> JobHandle | None:
    """The job of this attempt on ``queue``, if one exists: the newest active one, else the newest."""
    summaries = {str(s["jobId"]): s for s in jobs.list_by_name(queue, identity.name)}
    if not summaries:
        return None
    owned = [j for j in jobs.describe(list(summaries), attempts=PATIENT_ATTEMPTS) if owned_by(j, identity.task)]
    job = newest(owned)
    return None if job is None else handle_of(job, queue, summaries[str(job["jobId"])])


def find_existing(jobs: BatchJobs, task: TaskKey, queues: Sequence[str], handle_of: HandleOf) -> list[JobHandle]:
    """Every attempt of the task instance in ``queues``, found by job name (ListJobs JOB_NAME filter)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for queue in queues:
        for summary in jobs.list_by_name(queue, f"{task.prefix}-t*"):
            name = str(summary.get("jobName") or "")
            match = ATTEMPT_NAME_END.search(name)
            if match and name[: match.start()] == task.prefix:  # not another map index's jobs
                found[str(summary["jobId"])] = (queue, summary)
    if not found:
        return []
    details = {str(j["jobId"]): j for j in jobs.describe(list(found), attempts=PATIENT_ATTEMPTS)}
    handles = [
        handle_of(details[job_id], queue, summary)
        for job_id, (queue, summary) in found.items()
        if job_id in details and owned_by(details[job_id], task)
    ]
    return sorted(handles, key=lambda h: (h.attempt, h.submitted_at))


def by_id(jobs: BatchJobs, job_id: str, queues: Sequence[str], handle_of: HandleOf) -> JobHandle | None:
    """The job of this id (DescribeJobs), else ``None``."""
    for job in jobs.describe([job_id], attempts=PATIENT_ATTEMPTS):
        if str(job.get("jobId")) == job_id:
            # DescribeJobs names the queue by its ARN; handles carry the name the queues were given as
            ref = str(job.get("jobQueue") or "")
            short = ref.rpartition("job-queue/")[2]
            queue = next((q for q in queues if q in (ref, short)), short)
            return handle_of(job, queue, {})
    return None


def by_name(jobs: BatchJobs, name: str, queues: Sequence[str], handle_of: HandleOf) -> JobHandle | None:
    """The job of this name in ``queues`` (ListJobs ``JOB_NAME``; of several, the newest active one, else
    the newest), else ``None``."""
    if "*" in name:
        raise ValueError(f"name={name!r}: a job name, not a pattern ('*' is not allowed)")
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for queue in queues:
        for summary in jobs.list_by_name(queue, name):
            if str(summary.get("jobName") or "") == name:
                found[str(summary["jobId"])] = (queue, summary)
    job = newest(jobs.describe(list(found), attempts=PATIENT_ATTEMPTS)) if found else None
    if job is None:
        return None
    queue, summary = found[str(job["jobId"])]
    return handle_of(job, queue, summary)


def task_of(jobs: BatchJobs, handle: JobHandle) -> TaskKey | None:
    """The task instance in the job's tags (one DescribeJobs); ``None`` for a job without them or one gone."""
    for job in jobs.describe([handle.job_id], attempts=PATIENT_ATTEMPTS):
        if str(job.get("jobId")) == handle.job_id:
            return task_from_tags(job.get("tags") or {})
    return None


def list_owned(
    jobs: BatchJobs,
    queues: Sequence[str],
    handle_of: HandleOf,
    status_of: Callable[[Mapping[str, Any], JobHandle], JobStatus],
    *,
    region: str,
) -> list[OwnedJob]:
    """Every active job in ``queues`` that carries this provider's task tags.

    ListJobs per queue and active Batch state (SUBMITTED to RUNNING; a listing by state returns
    no ended jobs), then DescribeJobs 100 at a time for the tags, the timeout and the start time.
    Jobs without the task tags (submitted by something else) are not listed.
    """
    found: dict[str, str] = {}
    for queue in queues:
        for batch_state in ACTIVE_BATCH_STATES:
            for summary in jobs.list_jobs(queue, jobStatus=batch_state):
                found.setdefault(str(summary["jobId"]), queue)
    owned: list[OwnedJob] = []
    for job in jobs.describe(list(found), attempts=PATIENT_ATTEMPTS):
        if names.TAG_DAG_ID not in (job.get("tags") or {}):
            continue
        handle = handle_of(job, found[str(job["jobId"])], {})
        try:
            state = status_of(job, handle).state
        except ValueError:  # a state this version does not know: it may be running
            state = JobState.RUNNING
        if not state.terminal:
            owned.append(owned_job(job, handle, state, region=region))
    return sorted(owned, key=lambda o: (o.handle.submitted_at, o.handle.job_id))
