"""Who owns a training job, and the stop protocol: tag text, ``mark``, ``read_owner`` and the tagged stop.

Ownership is read fresh from the service (ListTags now), never from what polls keep: a cancel, a stop
or the reaper acts on it. A stop tags the job with its reason first (:data:`TAG_STOP_REASON`), so the
``Stopped`` job says who stopped it and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpu_provider import names
from gpu_provider.backends.aws.calls import PATIENT_ATTEMPTS, error_code
from gpu_provider.backends.base import JobHandle, OwnerRead
from gpu_provider.backends.common import mark_tags
from gpu_provider.backends.sagemaker.cache import JobCache
from gpu_provider.backends.sagemaker.service import SERVICE, TrainingJobs, not_found
from gpu_provider.exceptions import GpuJobError

MAX_TAG_VALUE_CHARS = 256
#: the tag on a job this provider stopped: why (``CANCEL_PREFIX`` + reason), read back from a Stopped job
TAG_STOP_REASON = names.TAG_PREFIX + "stop-reason"

_TAG_UNSAFE = re.compile(r"[^\w\s.:/=+\-@]", re.UNICODE)
#: what a tag value keeps as it is; anything else (``@`` included) is escaped as ``@XX`` per UTF-8 byte
_TAG_PLAIN = re.compile(r"[^\W]|[ .:/=+\-]", re.UNICODE)
_TAG_ESCAPES = re.compile(r"(?:@[0-9A-F]{2})+")


def tag_value(text: str) -> str:
    """A tag value SageMaker accepts: letters, digits, spaces and ``_.:/=+-@``, at most 256 characters."""
    return _TAG_UNSAFE.sub(" ", text)[:MAX_TAG_VALUE_CHARS]


def encode_tag_text(text: str) -> str:
    """``text`` as a tag value SageMaker accepts, reversibly (:func:`decode_tag_text`): punctuation SageMaker
    refuses becomes ``@XX`` per UTF-8 byte (``,`` -> ``@2C``), cut at a whole character within 256."""
    out: list[str] = []
    size = 0
    for char in text:
        piece = char if _TAG_PLAIN.fullmatch(char) else "".join(f"@{b:02X}" for b in char.encode())
        if size + len(piece) > MAX_TAG_VALUE_CHARS:
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def decode_tag_text(value: str) -> str:
    """The text :func:`encode_tag_text` encoded (a value written before the encoding reads as it is)."""
    return _TAG_ESCAPES.sub(lambda m: bytes.fromhex(m.group(0).replace("@", "")).decode("utf-8", "replace"), value)


def stop_reason(tags: Mapping[str, str]) -> str:
    """Why this provider stopped the job (its stop tag, without ``CANCEL_PREFIX``); ``""`` if it did not."""
    ours = decode_tag_text(str(tags.get(TAG_STOP_REASON) or ""))
    return ours[len(names.CANCEL_PREFIX) :] if ours.startswith(names.CANCEL_PREFIX) else ours


def owner_try(tags: Mapping[str, str]) -> int | None:
    """The try that owns the job: its owner mark, else the try that submitted it."""
    owner = str(tags.get(names.TAG_OWNER_TRY) or tags.get(names.TAG_TRY_NUMBER) or "")
    return int(owner) if owner.isdigit() else None


def read_owner(jobs: TrainingJobs, seen: JobCache, handle: JobHandle) -> OwnerRead:
    """ListTags on the job now (DescribeTrainingJob first when the handle lacks its ARN); what was read
    serves the next poll too."""
    arn = str(handle.extra.get("job_arn") or "")
    if not arn:
        job = jobs.describe(handle.job_id, attempts=PATIENT_ATTEMPTS)
        if job is None:
            return OwnerRead(owner_try=None, exists=False)
        arn = str(job["TrainingJobArn"])
    try:
        tags = jobs.list_tags(arn)
    except Exception as err:
        if not_found(err):
            return OwnerRead(owner_try=None, exists=False)
        raise
    seen.set_tags(handle.job_id, tags)
    return OwnerRead(owner_try=owner_try(tags))


def job_arn(jobs: TrainingJobs, handle: JobHandle) -> str:
    """The job's ARN: from the handle, else DescribeTrainingJob; :class:`GpuJobError` for a job gone."""
    arn = str(handle.extra.get("job_arn") or "")
    if arn:
        return arn
    job = jobs.describe(handle.job_id, attempts=PATIENT_ATTEMPTS)
    if job is None:
        raise GpuJobError(f"{SERVICE} no longer knows training job {handle.job_id}: it cannot be tagged or stopped")
    return str(job["TrainingJobArn"])


def stop(jobs: TrainingJobs, handle: JobHandle, reason: str) -> None:
    """Tag the job with the reason, then StopTrainingJob; a job stopping or ended already is left as it is."""
    arn = job_arn(jobs, handle)
    jobs.add_tags(arn, {TAG_STOP_REASON: encode_tag_text(names.CANCEL_PREFIX + reason)})
    try:
        jobs.stop(handle.job_id)
    except Exception as err:
        if error_code(err) != "ValidationException":
            raise
        job = jobs.describe(handle.job_id, attempts=PATIENT_ATTEMPTS)
        if job is not None and job.get("TrainingJobStatus") == "InProgress":
            raise
        # stopping or ended already (StopTrainingJob refuses a job that is not InProgress): nothing to do


def mark(jobs: TrainingJobs, seen: JobCache, handle: JobHandle, *, owner: int | None, collected: bool) -> None:
    """Tag the job (AddTags): the try that owns it, or that its outcome was collected."""
    tags = mark_tags(owner, collected)
    if not tags:
        return
    jobs.add_tags(job_arn(jobs, handle), tags)
    known = seen.get(handle.job_id)
    if known is not None:  # the next poll reports the mark without reading the tags again
        seen.set_tags(handle.job_id, {**known.tags, **tags})
