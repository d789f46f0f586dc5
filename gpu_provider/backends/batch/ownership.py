"""Who owns a Batch job, read and written in its tags: the owner read (fresh, before a destructive act) and
``mark`` (TagResource: the try that owns it, that its outcome was collected)."""

from __future__ import annotations

from gpu_provider.backends.aws.calls import PATIENT_ATTEMPTS
from gpu_provider.backends.base import JobHandle, OwnerRead
from gpu_provider.backends.batch.service import BatchJobs
from gpu_provider.backends.batch.status import owner_try
from gpu_provider.backends.common import mark_tags
from gpu_provider.exceptions import GpuJobError


def read_owner(jobs: BatchJobs, handle: JobHandle) -> OwnerRead:
    """DescribeJobs of this one job now: its owner-try tag (Batch returns a job's tags with it)."""
    for job in jobs.describe([handle.job_id], attempts=PATIENT_ATTEMPTS):
        if str(job.get("jobId")) == handle.job_id:
            return OwnerRead(owner_try=owner_try(job))
    return OwnerRead(owner_try=None, exists=False)


def mark(jobs: BatchJobs, handle: JobHandle, *, owner: int | None, collected: bool) -> None:
    """Tag the job (TagResource on its ARN): the try that owns it, or that its outcome was collected."""
    tags = mark_tags(owner, collected)
    if not tags:
        return
    jobs.tag(str(handle.extra.get("job_arn") or "") or job_arn(jobs, handle), tags)


def job_arn(jobs: BatchJobs, handle: JobHandle) -> str:
    """The ARN of a job whose handle does not carry it (a handle from an older version)."""
    for job in jobs.describe([handle.job_id], attempts=PATIENT_ATTEMPTS):
        if job.get("jobArn"):
            return str(job["jobArn"])
    raise GpuJobError(
        f"AWS Batch no longer knows job {handle.job_id} ({handle.name}): it cannot be tagged (expired or deleted)"
    )
