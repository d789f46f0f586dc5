"""Which checkpoint a job restores at start: the newest one in its checkpoint store, found by the job itself.

The operator sets ``GPU_PROVIDER_RESUME_FROM`` when it submits an attempt. Services that restart an
interrupted job inside the same attempt (SageMaker managed spot training, a Kubernetes Job's pod
restarts) start it again with that same, now stale, value, while the job has saved newer
checkpoints since. So at start the job looks in ``GPU_PROVIDER_CHECKPOINT_URI`` itself and takes
whichever is newer, by step; the variable stays as a hint, used when the store holds nothing newer
or cannot be read.
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_provider.names import ENV_CHECKPOINT_URI, ENV_RESUME_FROM
from gpu_provider.runtime.checkpoint import checkpoint_step, latest_checkpoint
from gpu_provider.runtime.env import JobEnv, job_env

log = logging.getLogger(__name__)


def _step_of(location: str) -> int | None:
    """The step of a checkpoint URI or local path (its last component, ``ckpt-<step>``), else ``None``."""
    return checkpoint_step(location.rstrip("/").rsplit("/", 1)[-1])


def resume_checkpoint(env: JobEnv | None = None, *, s3_client: Any = None) -> str | None:
    """The checkpoint this job should restore at start, or ``None`` for a fresh start.

    Looks in ``env.checkpoint_uri`` (``LATEST``, else the complete ``ckpt-`` folder with the highest
    step) and compares with the hint ``env.resume_from`` (``GPU_PROVIDER_RESUME_FROM``, set when
    the attempt was submitted): the one with the higher step wins; on a tie, or when the store holds
    no checkpoint, the hint (it may be a local mirror, cheaper to read). When the store cannot be
    read, the hint is used and a warning says why. Call it once at start, before the first save,
    and pass the result to :func:`~gpu_provider.runtime.restore_checkpoint`.

    :param env: the job's environment; :func:`~gpu_provider.runtime.job_env` when ``None``.
    :param s3_client: a boto3 S3 client for an ``s3://`` store; ``boto3.client("s3")`` when ``None``.
    :return: a checkpoint URI (or local path, when the hint is one), or ``None``.
    """
    env = job_env() if env is None else env
    hint = env.resume_from
    if not env.checkpoint_uri:
        return hint
    try:
        found = latest_checkpoint(env.checkpoint_uri, s3_client=s3_client)
    except Exception as exc:  # any reason the store cannot be read: the hint is still a good start
        log.warning(
            "could not read the checkpoint store %s=%s (%s: %s); resuming from %s",
            ENV_CHECKPOINT_URI,
            env.checkpoint_uri,
            type(exc).__name__,
            exc,
            f"{ENV_RESUME_FROM}={hint}" if hint else "scratch (no checkpoint named at submission)",
        )
        return hint
    if found is None:
        return hint
    if hint is None:
        # a restart inside the job: the attempt started fresh, and has saved since
        log.info("resuming from %s, the newest checkpoint in %s", found, env.checkpoint_uri)
        return found
    found_step, hint_step = _step_of(found), _step_of(hint)
    if hint_step is not None and (found_step is None or found_step <= hint_step):
        return hint
    log.info(
        "resuming from %s: newer than %s=%s, which was set when the attempt was submitted "
        "(the job has been restarted since)",
        found,
        ENV_RESUME_FROM,
        hint,
    )
    return found
