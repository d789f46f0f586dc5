"""Faults under the local backend: a full disk under the state directory, broken job files.

The full disk is real: a 2 MiB tmpfs mounted over a folder of the test (the tests run as root, as
CI does), unmounted when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_provider.backends.base import JobState, JobStatus, TaskKey
from gpu_provider.backends.local import LocalBackend, common
from gpu_provider.backends.local import launch as local_launch
from gpu_provider.exceptions import GpuJobError, GpuJobStatusError
from tests.backends import test_local
from tests.backends.test_local import GRACE, TASK, Local, job, running, wait_for

local = test_local.local  # the fixture: a LocalBackend in a temporary state dir, cleaned up after the test


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB file system (tmpfs) at ``tmp_path/disk``."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def disk_local(small_disk: Path, tmp_path: Path) -> Iterator[Local]:
    harness = Local(LocalBackend(state_dir=str(small_disk / "state"), grace_period=GRACE, gpus=[]), tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    return filler


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line mentions ``text`` (the processes a test's jobs started, and no other)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


WAIT_FOR_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"

CHATTY = """
    import os, sys, time
    for i in range(64):  # 4 MiB of output on a 2 MiB disk
        print(("%05d " % i) + "y" * 65530, flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
"""


def test_a_full_disk_ends_the_job_failed_with_the_reason_and_poll_keeps_answering(
    disk_local: Local, small_disk: Path
) -> None:
    local = disk_local
    release = local.tmp / "release"
    quiet = local.submit(
        job("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)", str(release))
    )
    local.wait(quiet, JobState.RUNNING)
    chatty = local.submit(job(CHATTY, str(release)), task=TaskKey(TASK.dag_id, "chatty", TASK.run_id))
    status = local.wait(chatty, timeout=20)
    assert status.state is JobState.FAILED
    log_file = Path(chatty.extra["job_dir"]) / common.LOG_FILE
    assert status.reason.startswith(f"could not write the job's log {log_file}: [Errno 28] No space left on device")
    wait_for("the job's processes gone", lambda: not any(running(p) for p in local.node_pids(chatty)), timeout=5)

    # the disk is still full: every poll answers, for each job, and the same for the failed one
    for _ in range(3):
        result = local.backend.poll([chatty, quiet])
        assert isinstance(result[chatty.job_id], JobStatus) and isinstance(result[quiet.job_id], JobStatus)
        assert (result[chatty.job_id].state, result[chatty.job_id].reason) == (status.state, status.reason)
        assert result[quiet.job_id].state is JobState.RUNNING
    release.touch()
    assert local.wait(quiet).state in (JobState.SUCCEEDED, JobState.FAILED)  # it may not record its end either


def test_a_submit_that_fails_on_a_full_disk_leaves_nothing_behind(disk_local: Local, small_disk: Path) -> None:
    local = disk_local
    warm = local.submit(job("pass"), task=TaskKey(TASK.dag_id, "warm", TASK.run_id))  # creates jobs/
    assert local.wait(warm).state is JobState.SUCCEEDED
    warm_supervisor = local.supervisor_pid(warm)
    wait_for("the first job's supervisor gone", lambda: not running(warm_supervisor))
    before = sorted(os.listdir(local.backend.state_dir / common.JOBS_DIR))
    filler = fill(small_disk)
    children = {id(proc) for proc in local_launch._children}
    with pytest.raises(GpuJobError, match=r"could not write its folder in .*No space left on device"):
        local.submit(job("print('never')"))
    assert sorted(os.listdir(local.backend.state_dir / common.JOBS_DIR)) == before  # no folder, not even half
    assert {id(proc) for proc in local_launch._children} <= children  # no supervisor started
    assert processes_mentioning(str(small_disk)) == []

    filler.unlink()
    handle = local.submit(job("print('now')"))  # the same attempt: nothing left over blocks it
    assert local.wait(handle).state is JobState.SUCCEEDED


def test_a_supervisor_that_cannot_record_the_end_leaves_its_reason(local: Local) -> None:
    """The supervisor's last words (fatal.json, preallocated at submit) reach poll when status.json
    cannot be written: the job ends FAILED with that reason, never in its last recorded state."""
    release = local.tmp / "release"
    handle = local.submit(
        job("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)", str(release))
    )
    local.wait(handle, JobState.RUNNING)
    supervisor = local.supervisor_pid(handle)
    job_dir = Path(handle.extra["job_dir"])
    # status.json cannot be replaced any more: its name is taken by a folder that is not empty
    (job_dir / "status.json").unlink()
    (job_dir / "status.json").mkdir()
    (job_dir / "status.json" / "x").touch()
    release.touch()  # the job succeeds; the supervisor cannot record it
    wait_for("the supervisor gone", lambda: not running(supervisor), timeout=10)
    status = local.wait(handle)
    assert status.state is JobState.FAILED
    assert status.reason.startswith(
        f"local supervisor error: could not record the job's state (succeeded) in {job_dir / 'status.json'}: "
    )
    again = LocalBackend.from_options(**local.backend.options()).poll([handle])[handle.job_id]
    assert isinstance(again, JobStatus) and (again.state, again.reason) == (status.state, status.reason)


def test_one_broken_job_spoils_no_other_poll_entry(local: Local) -> None:
    good = local.submit(job("pass"))
    broken = local.submit(job("pass"), task=TaskKey(TASK.dag_id, "broken", TASK.run_id))
    for handle in (good, broken):
        assert local.wait(handle).state is JobState.SUCCEEDED
    (Path(broken.extra["job_dir"]) / common.REQUEST_FILE).write_text("{ not json")
    result = local.backend.poll([good, broken])
    assert isinstance(result[good.job_id], JobStatus)
    error = result[broken.job_id]
    assert isinstance(error, GpuJobStatusError)
    assert f"local job {broken.job_id}: its state in {broken.extra['job_dir']} cannot be read" in str(error)
