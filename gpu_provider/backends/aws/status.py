"""What the AWS backends make of a job the service does not return: not visible yet, or gone for good."""

from __future__ import annotations

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.exceptions import GpuJobStatusError

#: a job not returned this long after its submission is lost (before: not visible yet; the APIs are
#: eventually consistent)
VISIBILITY_GRACE_S = 60.0
#: what happens to a lost job, said at the end of its reason
LOST_NEXT = (
    "Treated as lost: the capacity policy decides whether a new attempt runs, resuming from the latest checkpoint."
)


def missing(
    handle: JobHandle, now: float, *, unseen: str, gone: str, unseen_note: str = ""
) -> JobStatus | GpuJobStatusError:
    """What a job the service did not return means, ``now``: a status error to read it again next poll
    within :data:`VISIBILITY_GRACE_S` of its submission, then a ``FAILED`` status with ``interruption="lost"``.

    :param unseen: who does not return which job (``"AWS Batch does not list job gp-... (id ...)"``)
    :param gone: the reason of a lost job, before :data:`LOST_NEXT` (a whole sentence or more)
    :param unseen_note: said after the job's age while it may not be visible yet
    """
    age = now - handle.submitted_at
    if age < VISIBILITY_GRACE_S:
        return GpuJobStatusError(
            f"{unseen} yet, {age:.0f}s after it was submitted{unseen_note}; reading it again on the next poll"
        )
    return JobStatus(
        state=JobState.FAILED,
        reason=f"{gone} {LOST_NEXT}",
        interruption=names.LOST,
        capacity=handle.capacity,
    )
