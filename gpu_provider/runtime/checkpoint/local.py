"""The ``file://`` store: folders written under a temporary name, flushed to disk and renamed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpu_provider.runtime import _temp
from gpu_provider.runtime.checkpoint.layout import _LATEST_MAX_BYTES, LATEST, TEMP_PREFIX, checkpoint_step
from gpu_provider.runtime.checkpoint.store import _decode_latest, _Storage


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
