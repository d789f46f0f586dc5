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
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from gpu_provider import names
from gpu_provider.runtime import _temp
from gpu_provider.runtime._temp import STALE_TEMP_AGE_S as STALE_TEMP_AGE_S

log = logging.getLogger(__name__)

#: name of the file that holds the newest complete checkpoint's folder name
LATEST = "LATEST"
#: prefix of every checkpoint folder
CHECKPOINT_PREFIX = "ckpt-"
#: prefix of folders and files that are being written or deleted; never a complete checkpoint
TEMP_PREFIX = ".tmp-"
#: URI schemes the helpers read and write
SCHEMES = ("file", "s3")
#: prefix of the local folders an ``s3://`` save stages its files in, under the system's temporary folder
S3_STAGING_PREFIX = "gpu-provider-staging-"

_STEP_DIGITS = 10
_COMPLETE = re.compile(r"ckpt-([0-9]+)")
#: ``LATEST`` holds a name of about 15 characters: never read more than this of it
_LATEST_MAX_BYTES = 256
_ALLOWED = "allowed: file://, s3://"

#: set by the operator from ``Checkpoint(keep=...)``; the default of every ``keep=`` below
ENV_CHECKPOINT_KEEP = names.ENV_CHECKPOINT_KEEP
_DEFAULT_KEEP = 3


class _KeepFromEnv:
    """Sentinel: take ``keep`` from ``GPU_PROVIDER_CHECKPOINT_KEEP`` (else 3)."""

    def __repr__(self) -> str:
        return "KEEP_FROM_ENV"


#: default of ``keep=``: what the task's ``Checkpoint(keep=...)`` says, through the environment
KEEP_FROM_ENV = _KeepFromEnv()


def _resolve_keep(keep: int | _KeepFromEnv | None) -> int | None:
    if not isinstance(keep, _KeepFromEnv):
        return keep
    raw = os.environ.get(ENV_CHECKPOINT_KEEP, "").strip()
    if not raw:
        return _DEFAULT_KEEP
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{ENV_CHECKPOINT_KEEP}={raw!r} must be an integer >= 1")
    return int(raw)


_S3_DELETE_BATCH = 1000


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint for ``step``.

    :param step: training step, ``>= 0``.
    :return: e.g. ``"ckpt-0000000040"`` for step 40.
    """
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{CHECKPOINT_PREFIX}{step:0{_STEP_DIGITS}d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a complete checkpoint folder name, or ``None`` when ``name`` is not one.

    :param name: a folder name such as ``"ckpt-0000000040"``.
    """
    match = _COMPLETE.fullmatch(name)
    return int(match.group(1)) if match else None


def parse_uri(uri: str) -> tuple[str, str | None, str]:
    """Split a checkpoint URI into scheme, bucket and path.

    ``file:///abs/path`` gives ``("file", None, "/abs/path")`` (percent-escapes decoded, as written
    by :meth:`pathlib.Path.as_uri`); ``s3://bucket/some/prefix/`` gives
    ``("s3", "bucket", "some/prefix")``; ``s3://bucket`` gives ``("s3", "bucket", "")``.

    :param uri: the URI.
    :raises ValueError: the scheme is not ``file`` or ``s3``, a ``file`` URI names a host or a
        relative path, or an ``s3`` URI has no bucket.
    """
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"checkpoint URI must be a non-empty string, got {uri!r} ({_ALLOWED})")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES or "://" not in uri:
        raise ValueError(f"unsupported checkpoint URI {uri!r}: {_ALLOWED}")
    if parts.query or parts.fragment:
        raise ValueError(f"checkpoint URI {uri!r} must not have a query or fragment")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {uri!r} names host {parts.netloc!r}: use file:///absolute/path")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"file URI {uri!r} must hold an absolute path: use file:///absolute/path")
        return "file", None, path.rstrip("/") or "/"
    if not parts.netloc:
        raise ValueError(f"s3 URI {uri!r} has no bucket: use s3://bucket/prefix")
    return "s3", parts.netloc, parts.path.strip("/")


def _join(uri: str, name: str) -> str:
    return f"{uri.rstrip('/')}/{name}"


def _is_folder_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


class _Storage(ABC):
    """The few operations the layout needs, implemented once per scheme."""

    uri: str

    @abstractmethod
    def read_latest(self) -> str | None:
        """The folder name ``LATEST`` holds, or ``None`` without one."""

    @abstractmethod
    def write_latest(self, name: str) -> None:
        """Point ``LATEST`` at ``name`` (atomically where the storage allows)."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Whether the checkpoint folder ``name`` exists."""

    @abstractmethod
    def complete(self) -> list[str]:
        """Complete checkpoint folder names, oldest step first."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove the checkpoint folder ``name``."""

    @abstractmethod
    def staging(self, name: str) -> Path:
        """A fresh, empty local folder for the caller to write a checkpoint into."""

    @abstractmethod
    def publish(self, staging: Path, name: str) -> None:
        """Make ``staging`` the complete checkpoint ``name`` (without touching ``LATEST``)."""

    def __init__(self) -> None:
        self._locks: dict[Path, int | None] = {}

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)
        _temp.release(self._locks.pop(staging, None))

    def _new_staging(self, parent: Path, prefix: str, label: str, *, mode: int, where: str, shared: bool) -> Path:
        """Remove what killed saves left under ``parent``, then make and lock a fresh staging folder.

        :param shared: ``parent`` is shared with other users (the system's temporary folder): look
            only at this user's entries there.
        """
        try:
            _temp.remove_stale(parent, prefix, only_own_uid=shared, describe=where)
        except Exception:  # never let the cleanup of others' leftovers fail this save
            log.warning("could not look for leftover temporary folders under %s", where, exc_info=True)
        path = parent / _temp.temp_name(label)
        path.mkdir(mode=mode)
        try:
            self._locks[path] = _temp.lock(path)
        except BaseException:
            path.rmdir()
            raise
        return path

    @staticmethod
    def _sorted(names: list[str]) -> list[str]:
        return sorted(names, key=lambda n: (checkpoint_step(n) or 0, n))


def _decode_latest(raw: bytes) -> str:
    """``LATEST``'s content as text ("" when it cannot be a checkpoint name; it is never logged)."""
    if len(raw) > _LATEST_MAX_BYTES:
        return ""
    return raw.decode("utf-8", errors="replace").strip()


def _fsync_path(path: str, flags: int = os.O_RDONLY) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. directories cannot be opened on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            if not os.path.islink(path):
                _fsync_path(path)
        _fsync_path(dirpath)


def _local_files(root: Path) -> list[tuple[Path, str]]:
    """Every file under ``root`` with its ``/``-separated relative name, sorted by name."""
    found = [(path, path.relative_to(root).as_posix()) for path in root.rglob("*") if path.is_file()]
    return sorted(found, key=lambda item: item[1])


class _LocalStorage(_Storage):
    def __init__(self, uri: str, root: Path) -> None:
        super().__init__()
        self.uri = uri
        self.root = root

    def read_latest(self) -> str | None:
        try:
            with open(self.root / LATEST, "rb") as handle:
                return _decode_latest(handle.read(_LATEST_MAX_BYTES + 1))
        except FileNotFoundError:
            return None

    def write_latest(self, name: str) -> None:
        temp = self.root / _temp.temp_name(f"{TEMP_PREFIX}{LATEST}")
        try:
            with open(temp, "w", encoding="utf-8") as handle:
                handle.write(name + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.root / LATEST)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_path(str(self.root))

    def exists(self, name: str) -> bool:
        return (self.root / name).is_dir()

    def complete(self) -> list[str]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        return self._sorted([e.name for e in entries if checkpoint_step(e.name) is not None and e.is_dir()])

    def delete(self, name: str) -> None:
        # Rename first, so a half-deleted folder is never taken for a complete checkpoint.
        doomed = self.root / _temp.temp_name(f"{TEMP_PREFIX}del-{name}")
        os.rename(self.root / name, doomed)
        shutil.rmtree(doomed)

    def staging(self, name: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        # Inside the checkpoint folder itself, so the final rename stays on one file system; with
        # the umask's permissions (not tempfile.mkdtemp's 0700), since it becomes the checkpoint.
        return self._new_staging(
            self.root, TEMP_PREFIX, f"{TEMP_PREFIX}{name}", mode=0o777, where=self.uri, shared=False
        )

    def publish(self, staging: Path, name: str) -> None:
        _fsync_tree(staging)
        target = self.root / name
        replaced: Path | None = None
        if target.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            replaced = self.root / _temp.temp_name(f"{TEMP_PREFIX}old-{name}")
            os.rename(target, replaced)
        try:
            os.rename(staging, target)
        except BaseException:
            if replaced is not None:
                os.rename(replaced, target)
            raise
        _fsync_path(str(self.root))
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)


class _S3Storage(_Storage):
    def __init__(self, uri: str, client: Any, bucket: str, prefix: str) -> None:
        super().__init__()
        self.uri = uri
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _folder(self, name: str = "") -> str:
        key = self._key(name)
        return f"{key}/" if key else ""

    def _keys(self, name: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        keys: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._folder(name)):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def read_latest(self) -> str | None:
        from botocore.exceptions import ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(LATEST))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        body: bytes = response["Body"].read(_LATEST_MAX_BYTES + 1)
        response["Body"].close()
        return _decode_latest(body)

    def write_latest(self, name: str) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(LATEST), Body=(name + "\n").encode("utf-8"), ContentType="text/plain"
        )

    def exists(self, name: str) -> bool:
        response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._folder(name), MaxKeys=1)
        return bool(response.get("KeyCount", 0))

    def complete(self) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        base = self._folder()
        names: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(base) :].rstrip("/")
                if checkpoint_step(name) is not None:
                    names.append(name)
        return self._sorted(names)

    def _delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), _S3_DELETE_BATCH):
            batch = keys[start : start + _S3_DELETE_BATCH]
            response = self.client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise OSError(
                    f"could not delete {len(errors)} object(s) under {self.uri}, "
                    f"first s3://{self.bucket}/{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )

    def delete(self, name: str) -> None:
        self._delete_keys(self._keys(name))

    def staging(self, name: str) -> Path:
        # A local folder, private to this user (0700, like tempfile.mkdtemp) in the shared temporary folder.
        parent = Path(tempfile.gettempdir())
        return self._new_staging(
            parent,
            S3_STAGING_PREFIX,
            f"{S3_STAGING_PREFIX}{name}",
            mode=0o700,
            where=f"{parent} (staging for {self.uri})",
            shared=True,
        )

    def publish(self, staging: Path, name: str) -> None:
        previous = set(self._keys(name))
        uploaded: list[str] = []
        try:
            for path, relative in _local_files(staging):
                key = self._key(name, relative)
                self.client.upload_file(str(path), self.bucket, key)
                uploaded.append(key)
        except BaseException:
            if not previous:  # a new folder: leave nothing half-uploaded behind
                try:
                    self._delete_keys(uploaded)
                except Exception:
                    log.warning("could not remove the partial upload of %s", _join(self.uri, name), exc_info=True)
            raise
        # Re-saving a step: files the new checkpoint no longer has must not linger in it.
        self._delete_keys(sorted(previous - set(uploaded)))

    def download(self, name: str, destination: Path) -> int:
        base = self._folder(name)
        count = 0
        for key in self._keys(name):
            relative = key[len(base) :]
            if not relative or relative.endswith("/"):
                continue  # folder placeholder objects
            parts = PurePosixPath(relative).parts
            if ".." in parts or PurePosixPath(relative).is_absolute():
                raise ValueError(f"refusing to download s3://{self.bucket}/{key}: it escapes the checkpoint folder")
            local = destination.joinpath(*parts)
            local.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, key, str(local))
            count += 1
        return count


def _s3_client(s3_client: Any) -> Any:
    if s3_client is not None:
        return s3_client
    try:
        import boto3
    except ImportError as err:  # a training image with the runtime helper only (pip install --no-deps)
        raise ImportError(
            "s3:// checkpoints need boto3 in the job's environment (the runtime helper itself needs nothing "
            "else): pip install boto3"
        ) from err
    return boto3.client("s3")


def _storage(uri: str, s3_client: Any) -> _Storage:
    scheme, bucket, path = parse_uri(uri)
    if scheme == "file":
        return _LocalStorage(uri, Path(path))
    assert bucket is not None
    return _S3Storage(uri, _s3_client(s3_client), bucket, path)


@contextmanager
def _s3_errors(uri: str) -> Iterator[None]:
    """Re-raise botocore errors as ``OSError`` naming the checkpoint URI (no botocore import unless one occurs)."""
    try:
        yield
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in ("botocore", "boto3"):
            raise OSError(f"S3 request for checkpoint {uri} failed: {exc}") from exc
        raise


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
            kept = set(complete[-keep:]) | {self.name}
            for name in complete:
                if name not in kept:
                    storage.delete(name)
                    log.info("removed old checkpoint %s", _join(self.uri, name))
        except Exception:
            log.warning("could not prune old checkpoints under %s", self.uri, exc_info=True)


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
