"""The ``s3://`` store: files uploaded, then ``LATEST``; ``boto3`` imported only when no client is given."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from gpu_provider.runtime.checkpoint.layout import _LATEST_MAX_BYTES, LATEST, S3_STAGING_PREFIX, _join, checkpoint_step
from gpu_provider.runtime.checkpoint.store import _decode_latest, _local_files, _Storage

log = logging.getLogger(__package__)  # "gpu_provider.runtime.checkpoint", as before the split

_S3_DELETE_BATCH = 1000


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


@contextmanager
def _s3_errors(uri: str) -> Iterator[None]:
    """Re-raise botocore errors as ``OSError`` naming the checkpoint URI (no botocore import unless one occurs)."""
    try:
        yield
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in ("botocore", "boto3"):
            raise OSError(f"S3 request for checkpoint {uri} failed: {exc}") from exc
        raise
