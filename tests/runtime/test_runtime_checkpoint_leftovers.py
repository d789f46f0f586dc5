"""Temporary folders left by a save that did not finish are removed by a later save, never a live writer's."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.runtime import latest_checkpoint, save_checkpoint_files
from gpu_provider.runtime._temp import STALE_TEMP_AGE_S, this_host

REPO_ROOT = Path(__file__).resolve().parents[2]

# A child that starts a save, writes 1 MiB into its temporary folder, says so through a marker file,
# and then waits: for SIGKILL, or for a line on stdin telling it to finish the save.
WRITER = """
import sys
from pathlib import Path
from gpu_provider.runtime import save_checkpoint
uri, step, marker = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
with save_checkpoint(uri, step) as folder:
    (folder / "model.bin").write_bytes(b"w" * (1 << 20))
    marker.write_text(folder.name)
    sys.stdin.readline()
print("published", flush=True)
"""

# A child that holds an exclusive lock on a folder, as a live writer on another host would.
LOCKER = """
import fcntl, os, sys
from pathlib import Path
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
Path(sys.argv[2]).write_text("locked")
sys.stdin.readline()
"""


def _temps(root: Path, prefix: str = ".tmp-") -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(prefix)) if root.exists() else []


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        if proc.poll() is not None:
            raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.02)
    raise AssertionError(f"child did not get ready within {timeout}s")


@pytest.fixture
def children(child_env: Callable[..., dict[str, str]]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(script: str, *args: str, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            env=child_env(**env),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ckpts"


def test_save_killed_with_sigkill_leaves_a_folder_that_the_next_save_removes(
    root: Path, tmp_path: Path, children: Callable[..., subprocess.Popen[str]], caplog: pytest.LogCaptureFixture
) -> None:
    uri = root.as_uri()
    save_checkpoint_files(uri, 10, {"model.bin": b"10"})
    writer = children(WRITER, uri, "20", str(tmp_path / "ready"))
    name = _wait_for(tmp_path / "ready", writer)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    assert _temps(root) == [name]  # the killed save's folder, at full size
    assert (root / name / "model.bin").stat().st_size == 1 << 20
    assert name.startswith(".tmp-ckpt-0000000020-") and f"@{this_host()}@{writer.pid}@" in name

    with caplog.at_level(logging.INFO, logger="gpu_provider"):
        save_checkpoint_files(uri, 30, {"model.bin": b"30"})
    assert _temps(root) == []
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000030"
    assert f"{name}, left by a checkpoint save that did not finish" in caplog.text
    assert f"process {writer.pid} on this host, is gone" in caplog.text


def test_a_live_writers_folder_is_kept_and_it_still_publishes(
    root: Path, tmp_path: Path, children: Callable[..., subprocess.Popen[str]]
) -> None:
    uri = root.as_uri()
    writer = children(WRITER, uri, "20", str(tmp_path / "ready"))
    name = _wait_for(tmp_path / "ready", writer)
    save_checkpoint_files(uri, 30, {"model.bin": b"30"})  # a concurrent save cleans up ...
    assert _temps(root) == [name]  # ... but not the folder a live process is writing
    out, err = writer.communicate("finish\n", timeout=20)
    assert writer.returncode == 0, err
    assert out.strip() == "published"
    assert (root / "ckpt-0000000020" / "model.bin").stat().st_size == 1 << 20
    assert _temps(root) == []


def _foreign(root: Path, label: str, created: float) -> Path:
    """A temporary folder named as if a writer on another host had made it at ``created``."""
    path = root / f".tmp-{label}-0badc0de@another-host.example@4242@123456@{int(created)}"
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(b"x" * 1024)
    return path


def test_lock_protects_an_old_folder_of_a_live_writer_elsewhere(
    root: Path, tmp_path: Path, children: Callable[..., subprocess.Popen[str]]
) -> None:
    uri = root.as_uri()
    old = _foreign(root, "ckpt-0000000020", time.time() - STALE_TEMP_AGE_S - 60)
    locker = children(LOCKER, str(old), str(tmp_path / "locked"))
    _wait_for(tmp_path / "locked", locker)
    save_checkpoint_files(uri, 30, {"m": b"30"})
    assert old.exists()  # older than the age limit, but a process still holds its lock

    locker.communicate("done\n", timeout=10)  # the writer ends: its lock is gone with it
    save_checkpoint_files(uri, 40, {"m": b"40"})
    assert not old.exists()
    assert _temps(root) == []


def test_unlocked_folder_of_another_host_is_removed_only_when_old(root: Path) -> None:
    uri = root.as_uri()
    fresh = _foreign(root, "ckpt-0000000020", time.time())
    stale = _foreign(root, "old-ckpt-0000000010", time.time() - STALE_TEMP_AGE_S - 1)
    assert stale.exists()
    unnamed_fresh = root / ".tmp-ckpt-0000000021-abcd"  # an older version's name: judged by its age
    unnamed_old = root / ".tmp-ckpt-0000000022-abcd"
    for path in (unnamed_fresh, unnamed_old):
        path.mkdir()
    old_time = time.time() - STALE_TEMP_AGE_S - 1
    os.utime(unnamed_old, (old_time, old_time))
    (root / ".tmp-LATEST-0badc0de@another-host.example@4242@123456@1").write_text("ckpt-0000000099")

    save_checkpoint_files(uri, 30, {"m": b"30"})
    assert _temps(root) == sorted([fresh.name, unnamed_fresh.name])
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000030"


def test_pid_reused_by_a_later_process_does_not_keep_a_folder(root: Path) -> None:
    # this process's pid, but a start time it never had: the writer is gone and the pid was reused
    uri = root.as_uri()
    path = root / f".tmp-ckpt-0000000005-0badc0de@{this_host()}@{os.getpid()}@1@{int(time.time())}"
    path.mkdir(parents=True)
    save_checkpoint_files(uri, 6, {"m": b"6"})
    if Path("/proc/self/stat").exists():  # start times are read from /proc (Linux)
        assert not path.exists()
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000006"


def test_link_named_like_a_leftover_is_removed_without_touching_its_target(root: Path, tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "data").write_bytes(b"keep me")
    root.mkdir()
    link = root / ".tmp-ckpt-0000000001-0badc0de@another-host.example@1@1@1"
    link.symlink_to(target, target_is_directory=True)
    save_checkpoint_files(root.as_uri(), 2, {"m": b"2"})
    assert not os.path.lexists(link)
    assert (target / "data").read_bytes() == b"keep me"


def test_s3_staging_folder_of_a_killed_save_is_removed_by_the_next_save(
    s3_client: Any,
    bucket: str,
    moto_endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    children: Callable[..., subprocess.Popen[str]],
) -> None:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    uri = f"s3://{bucket}/run"
    writer = children(
        WRITER,
        uri,
        "20",
        str(tmp_path / "ready"),
        TMPDIR=str(scratch),
        AWS_ENDPOINT_URL_S3=moto_endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    name = _wait_for(tmp_path / "ready", writer)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    assert _temps(scratch, "gpu-provider-staging-") == [name]
    assert (scratch / name).stat().st_mode & 0o777 == 0o700  # private in a shared temporary folder

    save_checkpoint_files(uri, 30, {"m": b"30"}, s3_client=s3_client)
    assert _temps(scratch, "gpu-provider-staging-") == []
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000030"
