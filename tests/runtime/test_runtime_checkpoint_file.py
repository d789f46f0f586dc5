"""Checkpoints on file://: layout, atomic publication, LATEST, pruning, fallback and restore."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_provider.runtime import (
    checkpoint_name,
    checkpoint_step,
    latest_checkpoint,
    parse_uri,
    restore_checkpoint,
    save_checkpoint,
    save_checkpoint_files,
)


def _folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "run" / "ckpts"


@pytest.fixture
def uri(root: Path) -> str:
    return root.as_uri()


def test_checkpoint_name_is_zero_padded_to_ten() -> None:
    assert checkpoint_name(40) == "ckpt-0000000040"
    assert checkpoint_name(0) == "ckpt-0000000000"
    assert checkpoint_name(12345678901) == "ckpt-12345678901"
    assert checkpoint_step("ckpt-0000000040") == 40
    assert checkpoint_step(".tmp-ckpt-0000000040-ab12") is None
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        checkpoint_name(-1)
    with pytest.raises(TypeError, match="step must be an int"):
        checkpoint_name(True)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///data/ckpts", ("file", None, "/data/ckpts")),
        ("file:///data/ckpts/", ("file", None, "/data/ckpts")),
        ("file://localhost/data/my%20run", ("file", None, "/data/my run")),
        ("s3://bucket/team/run-1/", ("s3", "bucket", "team/run-1")),
        ("s3://bucket", ("s3", "bucket", "")),
    ],
)
def test_parse_uri(uri: str, expected: tuple[str, str | None, str]) -> None:
    assert parse_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bucket/ckpts", "unsupported checkpoint URI 'gs://bucket/ckpts': allowed: file://, s3://"),
        ("/data/ckpts", "unsupported checkpoint URI '/data/ckpts': allowed: file://, s3://"),
        ("", "checkpoint URI must be a non-empty string"),
        ("file://server/share", "names host 'server'"),
        ("s3:///no-bucket", "has no bucket"),
    ],
)
def test_parse_uri_rejects(uri: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_uri(uri)
    assert message in str(info.value)


def test_save_publishes_folder_then_latest(uri: str, root: Path) -> None:
    with save_checkpoint(uri, 40) as folder:
        # the caller writes into a temporary folder inside the checkpoint URI, not into ckpt-...
        assert folder.parent == root
        assert folder.name.startswith(".tmp-ckpt-0000000040-")
        assert latest_checkpoint(uri) is None
        (folder / "model.bin").write_bytes(b"weights-40")
        (folder / "opt").mkdir()
        (folder / "opt" / "state.bin").write_bytes(b"adam-40")
    assert _folders(root) == ["ckpt-0000000040"]
    assert (root / "LATEST").read_text().strip() == "ckpt-0000000040"
    assert (root / "ckpt-0000000040" / "opt" / "state.bin").read_bytes() == b"adam-40"
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000040"
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_exception_inside_the_block_publishes_nothing(uri: str, root: Path) -> None:
    save_checkpoint_files(uri, 10, {"model.bin": b"10"})
    with pytest.raises(RuntimeError, match="out of memory"), save_checkpoint(uri, 20) as folder:
        (folder / "model.bin").write_bytes(b"partial")
        raise RuntimeError("out of memory")
    assert _folders(root) == ["ckpt-0000000010"]
    assert (root / "LATEST").read_text().strip() == "ckpt-0000000010"
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000010"


def test_process_killed_mid_save_leaves_previous_checkpoint_latest(
    uri: str,
    root: Path,
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    child_env: Callable[..., dict[str, str]],
) -> None:
    save_checkpoint_files(uri, 10, {"model.bin": b"10"})
    script = (
        "import os, sys\n"
        "from gpu_provider.runtime import save_checkpoint\n"
        "with save_checkpoint(sys.argv[1], 20) as folder:\n"
        "    (folder / 'model.bin').write_bytes(b'half')\n"
        "    os._exit(9)  # killed: no cleanup runs\n"
    )
    result = run_python(["-c", script, uri], env=child_env())
    assert result.returncode == 9, result.stderr
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(".tmp-ckpt-0000000020-")]
    assert len(leftovers) == 1  # the abandoned temporary folder ...
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000010"  # ... is never taken for a checkpoint
    (root / "LATEST").unlink()
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000010"


def test_empty_checkpoint_is_refused(uri: str, root: Path) -> None:
    with pytest.raises(ValueError, match="ckpt-0000000005 is empty"), save_checkpoint(uri, 5):
        pass
    assert _folders(root) == []
    assert latest_checkpoint(uri) is None


def test_keep_prunes_to_the_newest_steps(uri: str, root: Path) -> None:
    for step in (10, 20, 30, 40, 50):
        save_checkpoint_files(uri, step, {"model.bin": str(step).encode()}, keep=2)
    assert _folders(root) == ["ckpt-0000000040", "ckpt-0000000050"]
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000050"


def test_default_keep_comes_from_the_task_through_the_environment(
    uri: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPU_PROVIDER_CHECKPOINT_KEEP", raising=False)
    for step in (1, 2, 3, 4):
        save_checkpoint_files(uri, step, {"m": b"x"})
    assert len(_folders(root)) == 3  # no variable: 3
    monkeypatch.setenv("GPU_PROVIDER_CHECKPOINT_KEEP", "1")
    save_checkpoint_files(uri, 5, {"m": b"x"})
    assert _folders(root) == ["ckpt-0000000005"]
    monkeypatch.setenv("GPU_PROVIDER_CHECKPOINT_KEEP", "many")
    with pytest.raises(ValueError, match="GPU_PROVIDER_CHECKPOINT_KEEP='many' must be an integer >= 1"):
        save_checkpoint(uri, 6)


def test_keep_none_keeps_everything_and_bad_keep_is_refused(uri: str, root: Path) -> None:
    for step in range(5):
        save_checkpoint_files(uri, step, {"m": b"x"}, keep=None)
    assert len(_folders(root)) == 5
    with pytest.raises(ValueError, match="keep must be a positive int or None, got 0"):
        save_checkpoint(uri, 6, keep=0)


def test_resaving_a_step_replaces_it(uri: str, root: Path) -> None:
    save_checkpoint_files(uri, 30, {"model.bin": b"old", "stale.bin": b"gone soon"})
    save_checkpoint_files(uri, 40, {"model.bin": b"40"})
    result = save_checkpoint_files(uri, 30, {"model.bin": b"new"})
    assert result == f"{uri}/ckpt-0000000030"
    assert sorted(p.name for p in (root / "ckpt-0000000030").iterdir()) == ["model.bin"]
    assert (root / "ckpt-0000000030" / "model.bin").read_bytes() == b"new"
    # LATEST names the checkpoint written last: a job that rolled back resumes from its own branch
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000030"
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_latest_falls_back_to_highest_complete_folder(uri: str, root: Path) -> None:
    assert latest_checkpoint(uri) is None  # the folder does not even exist yet
    save_checkpoint_files(uri, 7, {"m": b"7"})
    save_checkpoint_files(uri, 100, {"m": b"100"}, keep=None)
    save_checkpoint_files(uri, 9, {"m": b"9"}, keep=None)
    (root / ".tmp-ckpt-0000000999-dead").mkdir()  # an abandoned save
    (root / "ckpt-0000000500").write_text("a file, not a folder")
    (root / "LATEST").write_text("ckpt-0000000042\n")  # names a folder that does not exist
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000100"
    (root / "LATEST").unlink()
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000100"
    (root / "LATEST").write_text(".tmp-ckpt-0000000999-dead")
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000100"


def test_layout_written_with_plain_file_operations_is_understood(uri: str, root: Path) -> None:
    (root / "ckpt-0000000003").mkdir(parents=True)
    (root / "ckpt-0000000003" / "w").write_bytes(b"3")
    (root / "LATEST").write_text("ckpt-0000000003")  # no trailing newline
    latest = latest_checkpoint(uri)
    assert latest == f"{uri}/ckpt-0000000003"
    assert (restore_checkpoint(latest) / "w").read_bytes() == b"3"


def test_restore_returns_the_local_folder(uri: str, root: Path) -> None:
    saved = save_checkpoint_files(uri, 1, {"a/b/c.bin": b"deep"})
    assert restore_checkpoint(saved) == root / "ckpt-0000000001"
    assert (restore_checkpoint(saved) / "a" / "b" / "c.bin").read_bytes() == b"deep"
    # a local mirror may be passed as a plain path
    assert restore_checkpoint(str(root / "ckpt-0000000001")) == root / "ckpt-0000000001"


def test_restore_missing_checkpoint_names_the_uri(uri: str) -> None:
    missing = f"{uri}/ckpt-0000000077"
    with pytest.raises(FileNotFoundError, match=f"checkpoint {missing} does not exist"):
        restore_checkpoint(missing)
    with pytest.raises(ValueError, match="resume_from is empty"):
        restore_checkpoint("")


@pytest.mark.parametrize("name", ["../escape.bin", "/abs.bin", ""])
def test_save_files_rejects_unsafe_names(uri: str, root: Path, name: str) -> None:
    with pytest.raises(ValueError, match="must be a relative path"):
        save_checkpoint_files(uri, 1, {name: b"x"})
    assert not root.exists() or _folders(root) == []


def test_published_folder_gets_normal_permissions(uri: str, root: Path) -> None:
    save_checkpoint_files(uri, 1, {"m": b"x"})
    mode = (root / "ckpt-0000000001").stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o777 & ~umask


@pytest.mark.parametrize(
    "content",
    ["AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "../../etc/passwd", "x" * 100_000],
)
def test_invalid_latest_is_reported_without_its_content(
    uri: str, root: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    save_checkpoint_files(uri, 4, {"m": b"4"})
    (root / "LATEST").write_text(content + "\n")
    with caplog.at_level(logging.DEBUG, logger="gpu_provider"):
        assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000004"
    messages = [record.getMessage() for record in caplog.records]
    assert any("LATEST is invalid" in m and "checkpoint folder name" in m for m in messages), messages
    assert not [m for m in messages if content[:20] in m]


def test_latest_naming_a_missing_checkpoint_says_which(uri: str, root: Path, caplog: pytest.LogCaptureFixture) -> None:
    save_checkpoint_files(uri, 4, {"m": b"4"})
    (root / "LATEST").write_text("ckpt-0000000042\n")
    with caplog.at_level(logging.WARNING, logger="gpu_provider"):
        assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000004"
    assert "ckpt-0000000042, which does not exist" in caplog.text


def test_the_checkpoint_an_attempt_resumed_from_is_never_pruned_under_it(
    uri: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that starts late (a slow host, a pod scheduled after rank 0) restores from GPU_PROVIDER_RESUME_FROM
    after rank 0 has saved newer checkpoints: pruning must not take it away (a multi-node node-fault run failed
    that way under load)."""
    for step in (1, 2):
        save_checkpoint_files(uri, step, {"m": str(step).encode()}, keep=2)
    monkeypatch.setenv("GPU_PROVIDER_RESUME_FROM", f"{uri}/ckpt-0000000002")
    for step in range(3, 7):
        save_checkpoint_files(uri, step, {"m": str(step).encode()}, keep=2)
    assert _folders(root) == ["ckpt-0000000002", "ckpt-0000000005", "ckpt-0000000006"]
    monkeypatch.delenv("GPU_PROVIDER_RESUME_FROM")
    save_checkpoint_files(uri, 7, {"m": b"7"}, keep=2)  # the next attempt resumed elsewhere: pruned as usual
    assert _folders(root) == ["ckpt-0000000006", "ckpt-0000000007"]
