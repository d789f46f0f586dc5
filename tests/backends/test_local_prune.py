"""Pruning old job folders never leaves the state directory, and reports only what it removed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpu_provider.backends.base import JobState
from gpu_provider.backends.local import LocalBackend, common
from gpu_provider.exceptions import GpuJobError
from tests.backends import test_local
from tests.backends.test_local import Local, job

local = test_local.local  # the fixture: a LocalBackend in a temporary state dir, cleaned up after the test

LONG_AGO = {"state": common.SUCCEEDED, "ended_at": 1.0}  # ended in 1970: due for pruning


def outside_with_canary(tmp_path: Path) -> tuple[Path, Path]:
    """A folder outside the state directory that looks like an old job folder, with a canary file."""
    outside = tmp_path / "outside"
    fake_job = outside / "gp-fake-job-t1-a1"
    fake_job.mkdir(parents=True)
    (fake_job / common.STATUS_FILE).write_text(json.dumps(LONG_AGO))
    canary = fake_job / "canary"
    canary.write_text("must survive")
    (outside / "canary").write_text("must survive")
    return outside, canary


def test_a_symlinked_jobs_folder_is_not_followed(tmp_path: Path) -> None:
    outside, canary = outside_with_canary(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / common.JOBS_DIR).symlink_to(outside, target_is_directory=True)
    backend = LocalBackend(state_dir=str(state), gpus=[])
    assert backend.prune() == []
    assert canary.read_text() == "must survive" and (outside / "canary").exists()
    # lookups refuse it too, naming it, instead of reading job folders from outside
    for lookup in (backend.list_jobs, lambda: backend.find_existing(test_local.TASK)):
        with pytest.raises(GpuJobError, match=r"/jobs is a symbolic link or not a folder"):
            lookup()


def test_links_inside_jobs_are_neither_followed_nor_reported(local: Local, tmp_path: Path) -> None:
    outside, canary = outside_with_canary(tmp_path)
    done = local.submit(job("print('done')"))
    assert local.wait(done).state is JobState.SUCCEEDED
    jobs = local.backend.state_dir / common.JOBS_DIR
    # a job folder that is a link to a folder outside, and a real old job folder holding links outside
    (jobs / "gp-linked-job-t1-a1").symlink_to(outside / "gp-fake-job-t1-a1", target_is_directory=True)
    real = jobs / "gp-old-job-t1-a1"
    real.mkdir()
    (real / common.STATUS_FILE).write_text(json.dumps(LONG_AGO))
    (real / "escape").symlink_to(outside, target_is_directory=True)
    (real / "sub").mkdir()
    (real / "sub" / "escape-file").symlink_to(outside / "canary")

    week_later = time.time() + 7 * 86400 + 60
    removed = local.backend.prune(now=week_later)
    assert sorted(removed) == sorted([done.job_id, "gp-old-job-t1-a1"])  # the link is not reported
    assert not real.exists() and not Path(done.extra["job_dir"]).exists()
    assert (jobs / "gp-linked-job-t1-a1").is_symlink()  # not ours: left alone
    assert canary.read_text() == "must survive"
    assert (outside / "canary").read_text() == "must survive"
    assert local.backend.list_jobs() == []  # the link is not listed as a job either
