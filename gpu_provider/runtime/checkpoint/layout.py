"""The checkpoint layout's names: folder names and steps, checkpoint URIs, and the ``keep`` setting."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

from gpu_provider import names

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
