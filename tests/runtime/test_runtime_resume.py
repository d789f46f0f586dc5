"""At start the job resumes from the newest checkpoint in its store; GPU_PROVIDER_RESUME_FROM is only a hint."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.runtime import job_env, resume_checkpoint, save_checkpoint_files

# A job as a user writes it: find the checkpoint, restore it, report the step it continues from.
JOB = """
from gpu_provider.runtime import job_env, restore_checkpoint, resume_checkpoint
resume = resume_checkpoint(job_env())
step = int((restore_checkpoint(resume) / "step").read_text()) if resume else 0
print(f"resumed from {resume} at step {step}")
"""


@pytest.fixture
def store(tmp_path: Path) -> str:
    return (tmp_path / "ckpts").as_uri()


def _save(uri: str, *steps: int, **kwargs: Any) -> list[str]:
    return [save_checkpoint_files(uri, s, {"step": str(s).encode()}, keep=None, **kwargs) for s in steps]


def test_job_restarted_inside_its_attempt_resumes_from_the_newest_checkpoint(
    store: str,
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    child_env: Callable[..., dict[str, str]],
) -> None:
    ten, _, thirty = _save(store, 10, 20, 30)  # saved by the job after it was submitted with step 10
    env = child_env(GPU_PROVIDER_CHECKPOINT_URI=store, GPU_PROVIDER_RESUME_FROM=ten)
    result = run_python(["-c", JOB], env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"resumed from {thirty} at step 30"


def test_first_start_of_a_restarted_job_without_a_hint_finds_its_checkpoint(store: str) -> None:
    (thirty,) = _save(store, 30)
    assert resume_checkpoint(job_env({"GPU_PROVIDER_CHECKPOINT_URI": store})) == thirty


def test_hint_wins_when_it_is_as_new_or_newer(store: str, tmp_path: Path) -> None:
    _ten, twenty = _save(store, 10, 20)
    same = job_env({"GPU_PROVIDER_CHECKPOINT_URI": store, "GPU_PROVIDER_RESUME_FROM": twenty})
    assert resume_checkpoint(same) == twenty
    mirror = str(tmp_path / "mirror" / "ckpt-0000000020")  # a local mirror of the same step: cheaper to read
    assert resume_checkpoint(job_env({"GPU_PROVIDER_CHECKPOINT_URI": store, "GPU_PROVIDER_RESUME_FROM": mirror})) == (
        mirror
    )
    newer = str(tmp_path / "mirror" / "ckpt-0000000040")
    assert resume_checkpoint(job_env({"GPU_PROVIDER_CHECKPOINT_URI": store, "GPU_PROVIDER_RESUME_FROM": newer})) == (
        newer
    )


def test_empty_store_or_no_store_keeps_the_hint(store: str) -> None:
    hint = f"{store}/ckpt-0000000010"
    assert resume_checkpoint(job_env({"GPU_PROVIDER_CHECKPOINT_URI": store, "GPU_PROVIDER_RESUME_FROM": hint})) == hint
    assert resume_checkpoint(job_env({"GPU_PROVIDER_RESUME_FROM": hint})) == hint
    assert resume_checkpoint(job_env({"GPU_PROVIDER_CHECKPOINT_URI": store})) is None
    assert resume_checkpoint(job_env({})) is None


def test_s3_store_newer_than_the_hint(s3_client: Any, bucket: str) -> None:
    uri = f"s3://{bucket}/run"
    ten, thirty = _save(uri, 10, 30, s3_client=s3_client)
    env = job_env({"GPU_PROVIDER_CHECKPOINT_URI": uri, "GPU_PROVIDER_RESUME_FROM": ten})
    assert resume_checkpoint(env, s3_client=s3_client) == thirty


def test_unreadable_store_falls_back_to_the_hint_and_says_why(s3_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    uri = "s3://no-such-bucket-gpu-provider-resume/run"
    hint = f"{uri}/ckpt-0000000010"
    env = job_env({"GPU_PROVIDER_CHECKPOINT_URI": uri, "GPU_PROVIDER_RESUME_FROM": hint})
    with caplog.at_level(logging.WARNING, logger="gpu_provider"):
        assert resume_checkpoint(env, s3_client=s3_client) == hint
    assert f"could not read the checkpoint store GPU_PROVIDER_CHECKPOINT_URI={uri}" in caplog.text
    assert f"resuming from GPU_PROVIDER_RESUME_FROM={hint}" in caplog.text
