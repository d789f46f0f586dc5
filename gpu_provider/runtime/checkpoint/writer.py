"""Saving checkpoints: the writer that publishes one atomically, then prunes beyond ``keep``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

from gpu_provider.names import ENV_RESUME_FROM
from gpu_provider.runtime.checkpoint.layout import (
    KEEP_FROM_ENV,
    _join,
    _KeepFromEnv,
    _resolve_keep,
    checkpoint_name,
    parse_uri,
)
from gpu_provider.runtime.checkpoint.read import _storage
from gpu_provider.runtime.checkpoint.s3 import _s3_errors
from gpu_provider.runtime.checkpoint.store import _local_files, _Storage

log = logging.getLogger(__package__)  # "gpu_provider.runtime.checkpoint", as before the split


class CheckpointWriter(AbstractContextManager[Path]):
    """Context manager that publishes one checkpoint atomically; see :func:`save_checkpoint`.

    :param uri: the checkpoint URI (``file:///...`` or ``s3://bucket/prefix``).
    :param step: the training step; the folder is ``ckpt-<step zero-padded to 10>``.
    :param keep: how many complete checkpoints to keep, newest steps first (the one just written is
        always kept); ``None`` keeps all. Default: ``GPU_PROVIDER_CHECKPOINT_KEEP`` (set from the
        task's ``Checkpoint(keep=...)``), else 3.
    :param s3_client: a boto3 S3 client; ``boto3.client("s3")`` when ``None`` and ``uri`` is ``s3://``.
    """

    def __init__(
        self, uri: str, step: int, *, keep: int | _KeepFromEnv | None = KEEP_FROM_ENV, s3_client: Any = None
    ) -> None:
        parse_uri(uri)
        self.name = checkpoint_name(step)
        keep = _resolve_keep(keep)
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be a positive int or None, got {keep!r}")
        self.uri = uri
        self.step = step
        self.keep = keep
        #: the URI of the checkpoint this writer publishes
        self.checkpoint_uri = _join(uri, self.name)
        self._s3_client = s3_client
        self._storage: _Storage | None = None
        self._staging: Path | None = None

    def __enter__(self) -> Path:
        if self._staging is not None:
            raise RuntimeError(f"the writer for {self.checkpoint_uri} is already in use")
        self._storage = _storage(self.uri, self._s3_client)
        self._staging = self._storage.staging(self.name)
        return self._staging

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        storage, staging = self._storage, self._staging
        self._staging = None
        if storage is None or staging is None:
            return
        try:
            if exc_type is None:
                self._publish(storage, staging)
        finally:
            storage.discard(staging)

    def _publish(self, storage: _Storage, staging: Path) -> None:
        if not _local_files(staging):
            raise ValueError(f"checkpoint {self.checkpoint_uri} is empty: write at least one file into {staging}")
        with _s3_errors(self.checkpoint_uri):
            storage.publish(staging, self.name)
            storage.write_latest(self.name)
        log.info("saved checkpoint %s", self.checkpoint_uri)
        if self.keep is not None:
            self._prune(storage, self.keep)

    def _prune(self, storage: _Storage, keep: int) -> None:
        # The checkpoint is safe at this point: a failure to delete old ones is logged, not raised.
        try:
            complete = storage.complete()
            kept = set(complete[-keep:]) | {self.name, _resumed_from()}
            for name in complete:
                if name not in kept:
                    storage.delete(name)
                    log.info("removed old checkpoint %s", _join(self.uri, name))
        except Exception:
            log.warning("could not prune old checkpoints under %s", self.uri, exc_info=True)


def _resumed_from() -> str:
    """The name of the checkpoint this attempt resumed from (``GPU_PROVIDER_RESUME_FROM``): never pruned while the
    attempt runs, since a node that starts late (a slow host, a pod scheduled minutes after rank 0) still restores
    from it after rank 0 has written newer ones."""
    hint = os.environ.get(ENV_RESUME_FROM, "").rstrip("/")
    return hint.rsplit("/", 1)[-1] if hint else ""


def save_checkpoint(
    uri: str, step: int, *, keep: int | _KeepFromEnv | None = KEEP_FROM_ENV, s3_client: Any = None
) -> CheckpointWriter:
    """Save one checkpoint: yields a fresh, empty local folder; on a normal exit it is published.

    On ``file://`` the folder lies inside ``uri`` (``.tmp-ckpt-...``); its files are flushed to disk
    and it is renamed to ``ckpt-<step>``. On ``s3://`` it is a local temporary folder whose files are
    uploaded under ``<prefix>/ckpt-<step>/``. Then ``LATEST`` is written, and older checkpoints beyond
    ``keep`` are removed. If the block raises, nothing is published and the folder is removed.
    Saving a step that already exists replaces it: on ``file://`` the old folder is moved aside
    before the new one is renamed into place, so no reader sees a mix of the two; on ``s3://`` the
    new files are uploaded over the old ones and files the new checkpoint lacks are deleted.

    :param uri: the checkpoint URI (``file:///...`` or ``s3://bucket/prefix``).
    :param step: the training step, ``>= 0``.
    :param keep: how many complete checkpoints to keep (highest steps, plus always this one); ``None`` keeps all;
        default ``GPU_PROVIDER_CHECKPOINT_KEEP``, else 3.
    :param s3_client: a boto3 S3 client; ``boto3.client("s3")`` when ``None`` and ``uri`` is ``s3://``.
    :return: a context manager yielding the folder as a :class:`~pathlib.Path`.
    :raises ValueError: bad URI, step or keep; or (on exit) the folder was left empty.
    """
    return CheckpointWriter(uri, step, keep=keep, s3_client=s3_client)


def save_checkpoint_files(
    uri: str,
    step: int,
    files: Mapping[str, bytes],
    *,
    keep: int | _KeepFromEnv | None = KEEP_FROM_ENV,
    s3_client: Any = None,
) -> str:
    """Save a checkpoint made of the given files, in one call.

    :param uri: the checkpoint URI (``file:///...`` or ``s3://bucket/prefix``).
    :param step: the training step, ``>= 0``.
    :param files: relative ``/``-separated file names (sub-folders allowed) and their contents.
    :param keep: how many complete checkpoints to keep; ``None`` keeps all.
    :param s3_client: a boto3 S3 client; ``boto3.client("s3")`` when ``None`` and ``uri`` is ``s3://``.
    :return: the URI of the saved checkpoint, ``"<uri>/ckpt-<step>"``.
    :raises ValueError: a file name is empty, absolute or contains ``..``; or ``files`` is empty.
    """
    relative: dict[tuple[str, ...], bytes] = {}
    for name, content in files.items():
        path = PurePosixPath(name)
        if not name or path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"checkpoint file name {name!r} must be a relative path without '..'")
        relative[path.parts] = bytes(content)
    if not relative:
        raise ValueError(f"no files given for checkpoint step {step} under {uri}")
    writer = save_checkpoint(uri, step, keep=keep, s3_client=s3_client)
    with writer as folder:
        for parts, content in relative.items():
            target = folder.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    return writer.checkpoint_uri
