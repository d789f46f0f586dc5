"""What one DescribeJobs entry says about an attempt: its :class:`~gpu_provider.backends.base.JobStatus`, its
handle (a job found by name or id), its owner, and what a job DescribeJobs did not return means.

What Batch's states and status reasons mean is in :mod:`~gpu_provider.backends.batch.mapping`; this module
applies it to whole jobs. Pure functions, no client.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpu_provider import names
from gpu_provider.backends.aws.status import missing as missing_job
from gpu_provider.backends.base import JobHandle, JobState, JobStatus, OwnedJob, map_state, task_from_tags
from gpu_provider.backends.batch.mapping import (
    STATE_TABLE,
    console_log_url,
    definition_name,
    exit_code,
    job_gpus,
    job_nodes,
    node_fault,
    refine_failure,
    seconds_from_ms,
    tag_number,
    unrunnable,
)
from gpu_provider.backends.common import ATTEMPT_NAME_END
from gpu_provider.exceptions import GpuJobStatusError


def status_of(job: Mapping[str, Any], handle: JobHandle, *, backend: str, region: str, log_group: str) -> JobStatus:
    """Map one DescribeJobs entry onto a :class:`JobStatus`."""
    state = map_state(STATE_TABLE, str(job.get("status")), backend=backend)
    reason = str(job.get("statusReason") or "")
    interruption = None
    if state is JobState.FAILED:
        state, reason, interruption = refine_failure(job)
    elif state is JobState.SUCCEEDED:
        reason = ""  # Batch says "Essential container in task exited" on success too: no news
    started = seconds_from_ms(job.get("startedAt"))
    ended = seconds_from_ms(job.get("stoppedAt")) if state.terminal else None
    gpus = float(handle.extra.get("gpus") or job_gpus(job))
    gpu_seconds = gpus * max(0.0, (ended or time.time()) - started) if started else 0.0
    stream = str((job.get("container") or {}).get("logStreamName") or "")
    log_url = console_log_url(region, log_group, stream) if stream else None
    tags = job.get("tags") or {}
    owner = str(tags.get(names.TAG_OWNER_TRY) or "")
    return JobStatus(
        state=state,
        reason=reason,
        exit_code=exit_code(job),
        started_at=started,
        ended_at=ended,
        gpu_seconds=gpu_seconds,
        log_url=log_url,
        interruption=interruption,
        fault=node_fault(job) if interruption == names.NODE_FAULT else None,
        capacity=handle.capacity,  # the attempt's queue decides it (Batch does not report it per job)
        owner_try=int(owner) if owner.isdigit() else None,
        collected=str(tags.get(names.TAG_COLLECTED) or "").lower() == "true",
        never_starts=unrunnable(job),
    )


def missing(handle: JobHandle, now: float) -> JobStatus | GpuJobStatusError:
    """What a job DescribeJobs did not return means: not visible yet, or gone for good."""
    return missing_job(
        handle,
        now,
        unseen=f"AWS Batch does not list job {handle.name} (id {handle.job_id})",
        unseen_note=" (its API is eventually consistent)",
        gone=(
            f"AWS Batch no longer knows job {handle.job_id} (expired or deleted): DescribeJobs did not return "
            f"{handle.name}, so how it ended cannot be known (Batch keeps ended jobs for a limited time)."
        ),
    )


def owner_try(job: Mapping[str, Any]) -> int | None:
    """The Airflow try that owns the job: its owner-try tag, else the try that submitted it."""
    tags = job.get("tags") or {}
    owner = str(tags.get(names.TAG_OWNER_TRY) or tags.get(names.TAG_TRY_NUMBER) or "")
    return int(owner) if owner.isdigit() else None


def handle_of(
    job: Mapping[str, Any], queue: str, summary: Mapping[str, Any], *, backend: str, spot_queue: str | None, region: str
) -> JobHandle:
    """The handle of a job found by name or id on ``queue`` (its attempt number is in the name)."""
    name = str(summary.get("jobName") or job.get("jobName") or "")
    match = ATTEMPT_NAME_END.search(name)
    tags = job.get("tags") or {}
    capacity = tags.get(names.TAG_CAPACITY) or (names.SPOT if queue == spot_queue else names.ON_DEMAND)
    return JobHandle(
        backend=backend,
        job_id=str(job["jobId"]),
        name=name,
        attempt=int(match.group(2)) if match else int(tag_number(tags, names.TAG_ATTEMPT) or 1),
        capacity=str(capacity),
        submitted_at=seconds_from_ms(summary.get("createdAt") or job.get("createdAt")) or time.time(),
        extra={
            "queue": queue,
            "region": region,
            "job_definition": definition_name(job),
            "job_arn": str(job.get("jobArn") or summary.get("jobArn") or ""),
            "gpus": tag_number(tags, names.TAG_GPUS) or job_gpus(job),
            "nodes": job_nodes(job),
        },
    )


def owned_job(job: Mapping[str, Any], handle: JobHandle, state: JobState, *, region: str) -> OwnedJob:
    """What :meth:`~gpu_provider.backends.base.Backend.list_owned` says of an active job of ours."""
    tags = job.get("tags") or {}
    owner = tag_number(tags, names.TAG_OWNER_TRY) or tag_number(tags, names.TAG_TRY_NUMBER)
    timeout = (job.get("timeout") or {}).get("attemptDurationSeconds")
    nodes = int(handle.extra.get("nodes") or 1)
    return OwnedJob(
        handle=handle,
        task=task_from_tags(tags),
        state=state,
        try_number=int(owner) if owner else None,
        team=str(tags.get(names.TAG_TEAM) or "") or None,
        started_at=seconds_from_ms(job.get("startedAt")),
        nodes=nodes,
        gpus=float(handle.extra.get("gpus") or 0.0) / nodes,
        max_runtime_s=float(timeout) if timeout else None,
        region=region,
        # Batch's timeout counts from the attempt's startedAt; a RUNNABLE job has no wait limit
        max_wait_s=None,
        training_seconds=None,
    )
