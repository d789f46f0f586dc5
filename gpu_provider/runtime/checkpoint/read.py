"""Finding and restoring checkpoints: the published one, the newest complete one, a local copy of one."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from gpu_provider.runtime.checkpoint.layout import LATEST, _is_folder_name, _join, checkpoint_step, parse_uri
from gpu_provider.runtime.checkpoint.local import _LocalStorage
from gpu_provider.runtime.checkpoint.s3 import _s3_client, _s3_errors, _S3Storage
from gpu_provider.runtime.checkpoint.store import _Storage

log = logging.getLogger(__package__)  # "gpu_provider.runtime.checkpoint", as before the split


def _storage(uri: str, s3_client: Any) -> _Storage:
    scheme, bucket, path = parse_uri(uri)
    if scheme == "file":
        return _LocalStorage(uri, Path(path))
    assert bucket is not None
    return _S3Storage(uri, _s3_client(s3_client), bucket, path)


def published_checkpoint(uri: str, *, s3_client: Any = None) -> tuple[str, int] | None:
    """The checkpoint ``<uri>/LATEST`` names, as ``("<uri>/ckpt-...", step)``, or ``None`` when none is published.

    Unlike :func:`latest_checkpoint` there is no fallback: only what the writer published counts
    (what a sensor waits for).

    :param uri: the checkpoint URI (``file:///...`` or ``s3://bucket/prefix``).
    :param s3_client: a boto3 S3 client for ``s3://`` (``boto3.client("s3")`` when ``None``).
    :raises OSError: the storage could not be read (S3 errors are re-raised as ``OSError`` naming the URI).
    """
    storage = _storage(uri, s3_client)
    with _s3_errors(uri):
        name = storage.read_latest()
        step = None if name is None else checkpoint_step(name)
        if name is None or step is None or not storage.exists(name):
            return None
    return f"{uri.rstrip('/')}/{name}", step


def latest_checkpoint(uri: str, *, s3_client: Any = None) -> str | None:
    """The URI of the newest complete checkpoint under ``uri``, or ``None`` when there is none.

    Reads ``LATEST``. When it is missing, does not hold a checkpoint folder name (a warning says it
    is invalid, without its content), or names a folder that does not exist, falls back to the
    complete ``ckpt-`` folder with the highest step.

    :param uri: the checkpoint URI (``file:///...`` or ``s3://bucket/prefix``).
    :param s3_client: a boto3 S3 client; ``boto3.client("s3")`` when ``None`` and ``uri`` is ``s3://``.
    :return: ``"<uri>/<checkpoint folder>"`` or ``None``.
    """
    storage = _storage(uri, s3_client)
    with _s3_errors(uri):
        name = storage.read_latest()
        if name is not None:
            if checkpoint_step(name) is None:
                # Say that it is invalid, not what it holds: whatever is there is not ours to print.
                log.warning(
                    "%s is invalid: it does not hold a checkpoint folder name (ckpt-<step>); "
                    "using the complete checkpoint with the highest step",
                    _join(uri, LATEST),
                )
            elif storage.exists(name):
                return _join(uri, name)
            else:
                log.warning(
                    "%s names %s, which does not exist; using the complete checkpoint with the highest step",
                    _join(uri, LATEST),
                    name,
                )
        complete = storage.complete()
    return _join(uri, complete[-1]) if complete else None


def restore_checkpoint(
    resume_from: str, *, local_dir: str | os.PathLike[str] | None = None, s3_client: Any = None
) -> Path:
    """Make a checkpoint available as a local folder.

    :param resume_from: a checkpoint folder: ``file:///.../ckpt-...``, ``s3://bucket/.../ckpt-...``,
        or an absolute local path (a local mirror, as some backends pass in ``GPU_PROVIDER_RESUME_FROM``);
        usually what :func:`~gpu_provider.runtime.resume_checkpoint` returned.
    :param local_dir: where to download an ``s3://`` checkpoint; a new temporary folder when ``None``.
        Ignored for local checkpoints, which are returned in place.
    :param s3_client: a boto3 S3 client; ``boto3.client("s3")`` when ``None`` and the URI is ``s3://``.
    :return: the local folder holding the checkpoint's files.
    :raises FileNotFoundError: the checkpoint does not exist (the message names the URI).
    :raises ValueError: the URI is not supported.
    """
    if not resume_from:
        raise ValueError("resume_from is empty: there is no checkpoint to restore")
    if resume_from.startswith("/"):
        scheme, path = "file", resume_from
    else:
        scheme, _bucket, path = parse_uri(resume_from)
    if scheme == "file":
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint {resume_from} does not exist or is not a folder")
        return folder

    parent_uri, _, name = resume_from.rstrip("/").rpartition("/")
    if not _is_folder_name(name) or parent_uri.endswith(":/"):
        raise ValueError(f"checkpoint URI {resume_from!r} does not name a checkpoint folder under a bucket")
    storage = _storage(parent_uri, s3_client)
    assert isinstance(storage, _S3Storage)
    destination = Path(local_dir) if local_dir is not None else Path(tempfile.mkdtemp(prefix="gpu-provider-restore-"))
    destination.mkdir(parents=True, exist_ok=True)
    with _s3_errors(resume_from):
        count = storage.download(name, destination)
    if count == 0:
        raise FileNotFoundError(f"checkpoint {resume_from} does not exist (no objects under it)")
    log.info("restored checkpoint %s into %s (%d files)", resume_from, destination, count)
    return destination
