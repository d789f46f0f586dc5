"""Checkpoint save, find and restore on ``file://`` and ``s3://``, in the one layout every backend shares.

::

    <checkpoint uri>/ckpt-<step, zero-padded to 10>/...   one complete checkpoint
    <checkpoint uri>/LATEST                               the name of the newest complete ckpt- folder

A checkpoint becomes visible only once complete: on ``file://`` it is written into a temporary
folder inside ``<checkpoint uri>`` (named ``.tmp-ckpt-...``), flushed to disk and renamed; on
``s3://`` every file is uploaded before ``LATEST`` is written. ``LATEST`` is always written last
(on ``file://`` through a temporary file and an atomic replace), so a job killed mid-save leaves
``LATEST`` naming the previous checkpoint. Folders whose names start with ``.tmp-`` are never
complete.

A save killed mid-write (SIGKILL at the end of a spot interruption's grace period) cannot clean
up, so every temporary name records its writer (host, pid, process start, creation time) and the
folder being written is locked (``flock``) while its writer lives. Each save first removes the
temporary entries whose writer is gone: unlocked, and made on this host by a process that no longer
runs, or, when the owner cannot be checked from here (another host), older than
:data:`STALE_TEMP_AGE_S`. A live writer's folder is never removed (see ``_temp``).

S3 has no rename: a ``ckpt-`` folder on S3 is complete once ``LATEST`` has named it. The writer
removes what it uploaded when an upload fails, but a process killed mid-upload can leave a partial
folder that only :func:`latest_checkpoint`'s fallback (used when ``LATEST`` is missing) could pick;
saving that step again replaces it, and pruning removes it once ``keep`` newer steps exist. Large
files go up as multipart uploads, whose unfinished parts S3 keeps (and bills) until they are
aborted: give the bucket a lifecycle rule that aborts incomplete multipart uploads after a day. The
local folder an ``s3://`` save stages its files in (``gpu-provider-staging-...`` in the temporary
folder) is cleaned like a ``file://`` one.

Typical use inside a training loop::

    env = job_env()
    resume = resume_checkpoint(env)  # the newest checkpoint in the store, or the submit-time hint
    if resume:
        state = load(restore_checkpoint(resume) / "state.pt")
    ...
    with save_checkpoint(env.checkpoint_uri, step) as folder:
        save(state, folder / "state.pt")

``boto3`` is imported only when an ``s3://`` URI is used and no client is given.

The modules of this package: :mod:`~gpu_provider.runtime.checkpoint.layout` (names, steps, URIs,
``keep``), :mod:`~gpu_provider.runtime.checkpoint.store` (what a store does),
:mod:`~gpu_provider.runtime.checkpoint.local` and :mod:`~gpu_provider.runtime.checkpoint.s3` (the two
stores), :mod:`~gpu_provider.runtime.checkpoint.read` (find and restore) and
:mod:`~gpu_provider.runtime.checkpoint.writer` (save and prune). Import the names from here.
"""

from __future__ import annotations

from gpu_provider.runtime._temp import STALE_TEMP_AGE_S
from gpu_provider.runtime.checkpoint.layout import (
    CHECKPOINT_PREFIX,
    ENV_CHECKPOINT_KEEP,
    KEEP_FROM_ENV,
    LATEST,
    S3_STAGING_PREFIX,
    SCHEMES,
    TEMP_PREFIX,
    checkpoint_name,
    checkpoint_step,
    parse_uri,
)
from gpu_provider.runtime.checkpoint.read import latest_checkpoint, published_checkpoint, restore_checkpoint
from gpu_provider.runtime.checkpoint.writer import CheckpointWriter, save_checkpoint, save_checkpoint_files

__all__ = [
    "CHECKPOINT_PREFIX",
    "ENV_CHECKPOINT_KEEP",
    "KEEP_FROM_ENV",
    "LATEST",
    "S3_STAGING_PREFIX",
    "SCHEMES",
    "STALE_TEMP_AGE_S",
    "TEMP_PREFIX",
    "CheckpointWriter",
    "checkpoint_name",
    "checkpoint_step",
    "latest_checkpoint",
    "parse_uri",
    "published_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
    "save_checkpoint_files",
]
