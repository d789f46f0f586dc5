"""Checkpoints on s3:// against a real moto S3 server on loopback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.runtime import latest_checkpoint, restore_checkpoint, save_checkpoint, save_checkpoint_files


def _keys(s3_client: Any, bucket: str) -> list[str]:
    response = s3_client.list_objects_v2(Bucket=bucket)
    return sorted(obj["Key"] for obj in response.get("Contents", []))


def _latest(s3_client: Any, bucket: str, prefix: str) -> str:
    body: bytes = s3_client.get_object(Bucket=bucket, Key=f"{prefix}/LATEST")["Body"].read()
    return body.decode()


def test_save_uploads_every_file_before_latest(s3_client: Any, bucket: str) -> None:
    writes: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        writes.append(params["Key"])

    s3_client.meta.events.register("before-parameter-build.s3.PutObject", record)
    uri = f"s3://{bucket}/team/run-1"
    with save_checkpoint(uri, 40, s3_client=s3_client) as folder:
        assert not str(folder).startswith("s3:")
        (folder / "model.bin").write_bytes(b"weights")
        (folder / "opt").mkdir()
        (folder / "opt" / "state.bin").write_bytes(b"adam")
    assert not folder.exists()  # the local staging folder is cleaned up

    assert _keys(s3_client, bucket) == [
        "team/run-1/LATEST",
        "team/run-1/ckpt-0000000040/model.bin",
        "team/run-1/ckpt-0000000040/opt/state.bin",
    ]
    assert writes[-1] == "team/run-1/LATEST"  # LATEST is written last
    assert sorted(writes[:-1]) == ["team/run-1/ckpt-0000000040/model.bin", "team/run-1/ckpt-0000000040/opt/state.bin"]
    assert _latest(s3_client, bucket, "team/run-1").strip() == "ckpt-0000000040"
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000040"


def test_restore_downloads_the_folder(s3_client: Any, bucket: str, tmp_path: Path) -> None:
    uri = f"s3://{bucket}/ckpts/"
    saved = save_checkpoint_files(uri, 3, {"model.bin": b"m3", "nested/x.json": b"{}"}, s3_client=s3_client)
    assert saved == f"s3://{bucket}/ckpts/ckpt-0000000003"
    local = restore_checkpoint(saved, local_dir=tmp_path / "restore", s3_client=s3_client)
    assert local == tmp_path / "restore"
    assert (local / "model.bin").read_bytes() == b"m3"
    assert (local / "nested" / "x.json").read_bytes() == b"{}"
    temp_local = restore_checkpoint(saved, s3_client=s3_client)  # into a fresh temporary folder
    assert (temp_local / "model.bin").read_bytes() == b"m3"


def test_exception_inside_the_block_uploads_nothing(s3_client: Any, bucket: str) -> None:
    uri = f"s3://{bucket}/p"
    save_checkpoint_files(uri, 1, {"m": b"1"}, s3_client=s3_client)
    with pytest.raises(KeyError), save_checkpoint(uri, 2, s3_client=s3_client) as folder:
        (folder / "m").write_bytes(b"2")
        raise KeyError("boom")
    assert _keys(s3_client, bucket) == ["p/LATEST", "p/ckpt-0000000001/m"]
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000001"


def test_failed_upload_leaves_no_partial_folder_and_names_the_uri(s3_client: Any, bucket: str) -> None:
    uri = f"s3://{bucket}/p"
    save_checkpoint_files(uri, 1, {"m": b"1"}, s3_client=s3_client)
    calls = {"n": 0}

    def fail_second_upload(params: dict[str, Any], **_: Any) -> None:
        if params["Key"].startswith("p/ckpt-0000000002/"):
            calls["n"] += 1
            if calls["n"] == 2:
                params["Bucket"] = "no-such-bucket-gpu-provider"

    s3_client.meta.events.register("before-parameter-build.s3.PutObject", fail_second_upload)
    with pytest.raises(OSError, match=f"S3 request for checkpoint {uri}/ckpt-0000000002 failed"):
        save_checkpoint_files(uri, 2, {"a": b"a", "b": b"b"}, s3_client=s3_client)
    assert _keys(s3_client, bucket) == ["p/LATEST", "p/ckpt-0000000001/m"]


def test_keep_prunes_and_resave_drops_stale_files(s3_client: Any, bucket: str) -> None:
    uri = f"s3://{bucket}/p"
    for step in (1, 2, 3, 4):
        save_checkpoint_files(uri, step, {"m": b"x", "extra": b"y"}, keep=2, s3_client=s3_client)
    assert _keys(s3_client, bucket) == [
        "p/LATEST",
        "p/ckpt-0000000003/extra",
        "p/ckpt-0000000003/m",
        "p/ckpt-0000000004/extra",
        "p/ckpt-0000000004/m",
    ]
    save_checkpoint_files(uri, 4, {"m": b"new"}, keep=2, s3_client=s3_client)
    assert "p/ckpt-0000000004/extra" not in _keys(s3_client, bucket)
    assert s3_client.get_object(Bucket=bucket, Key="p/ckpt-0000000004/m")["Body"].read() == b"new"


def test_latest_fallback_and_empty_prefix(s3_client: Any, bucket: str) -> None:
    uri = f"s3://{bucket}"
    assert latest_checkpoint(uri, s3_client=s3_client) is None
    save_checkpoint_files(uri, 5, {"m": b"5"}, s3_client=s3_client)
    save_checkpoint_files(uri, 50, {"m": b"50"}, s3_client=s3_client)
    s3_client.put_object(Bucket=bucket, Key=".tmp-ckpt-0000000099-x/m", Body=b"tmp")
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000050"
    s3_client.put_object(Bucket=bucket, Key="LATEST", Body=b"ckpt-0000000077\n")  # dangling
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000050"
    s3_client.delete_object(Bucket=bucket, Key="LATEST")
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000050"
    s3_client.put_object(Bucket=bucket, Key="LATEST", Body=b"ckpt-0000000005")  # a rollback
    assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000005"


def test_restore_missing_checkpoint_names_the_uri(s3_client: Any, bucket: str, tmp_path: Path) -> None:
    missing = f"s3://{bucket}/p/ckpt-0000000001"
    with pytest.raises(FileNotFoundError, match=f"checkpoint {missing} does not exist"):
        restore_checkpoint(missing, local_dir=tmp_path, s3_client=s3_client)
    with pytest.raises(ValueError, match="does not name a checkpoint folder"):
        restore_checkpoint(f"s3://{bucket}", s3_client=s3_client)


def test_client_is_created_lazily_from_the_environment(
    aws_env: None, moto_endpoint: str, s3_client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    uri = f"s3://{bucket}/lazy"
    saved = save_checkpoint_files(uri, 8, {"m": b"8"})
    assert latest_checkpoint(uri) == saved
    assert s3_client.get_object(Bucket=bucket, Key="lazy/ckpt-0000000008/m")["Body"].read() == b"8"


def test_invalid_latest_is_reported_without_its_content(
    s3_client: Any, bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"s3://{bucket}/p"
    save_checkpoint_files(uri, 4, {"m": b"4"}, s3_client=s3_client)
    secret = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
    s3_client.put_object(Bucket=bucket, Key="p/LATEST", Body=secret.encode())
    with caplog.at_level(logging.DEBUG, logger="gpu_provider"):
        assert latest_checkpoint(uri, s3_client=s3_client) == f"{uri}/ckpt-0000000004"
    assert "LATEST is invalid" in caplog.text
    assert secret not in caplog.text
