"""What a checkpoint store must do (one implementation per URI scheme), and helpers both stores share."""

from __future__ import annotations

import logging
import shutil
from abc import ABC, abstractmethod
from pathlib import Path

from gpu_provider.runtime import _temp
from gpu_provider.runtime.checkpoint.layout import _LATEST_MAX_BYTES, checkpoint_step

log = logging.getLogger(__package__)  # "gpu_provider.runtime.checkpoint", as before the split


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


def _local_files(root: Path) -> list[tuple[Path, str]]:
    """Every file under ``root`` with its ``/``-separated relative name, sorted by name."""
    found = [(path, path.relative_to(root).as_posix()) for path in root.rglob("*") if path.is_file()]
    return sorted(found, key=lambda item: item[1])
