"""Pruning old job folders never leaves the state directory, and reports only what it removed."""

from __future__ import annotations

import json
import os
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


def _old_job_folder(jobs: Path, name: str) -> Path:
    folder = jobs / name
    folder.mkdir()
    (folder / common.STATUS_FILE).write_text(json.dumps(LONG_AGO))
    return folder


def test_old_folders_are_pruned_once_per_interval_by_all_task_processes_together(local: Local) -> None:
    """Each Airflow task is a process of its own: a process's own memory of its last prune would have every
    task read every job folder's status before (now: after) starting its job. ``jobs/.pruned`` is shared."""
    from gpu_provider.backends.local import prune

    jobs = local.backend.state_dir / common.JOBS_DIR
    jobs.mkdir(parents=True, exist_ok=True)
    first = _old_job_folder(jobs, "gp-old-first-t1-a1")
    prune._pruned_at.clear()  # this process as a fresh task process: it has pruned nothing yet
    local.wait(local.submit(job("print('one')"), attempt=1))
    assert not first.exists()  # due, and pruned after that submit
    stamp = jobs / prune.PRUNED_STAMP
    assert stamp.is_file() and time.time() - stamp.stat().st_mtime < 60

    second = _old_job_folder(jobs, "gp-old-second-t1-a1")
    prune._pruned_at.clear()  # the next task's process, a minute later
    local.wait(local.submit(job("print('two')"), attempt=2))
    assert second.exists()  # another process pruned the state directory less than 10 minutes ago

    old = time.time() - prune.PRUNE_EVERY_S - 5
    os.utime(stamp, (old, old))
    prune._pruned_at.clear()
    local.wait(local.submit(job("print('three')"), attempt=3))
    assert not second.exists()  # the last prune is over 10 minutes old: this task's submit pruned
