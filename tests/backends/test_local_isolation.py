"""What the local backend isolates, shown with real processes (the isolation statement of docs/how-to/local.md).

These tests run as root (as CI does): ``run_as_user="nobody"`` needs a worker that can switch
users. Jobs that run as ``nobody`` use the system's ``/usr/bin/python3``: the test interpreter may
live where ``nobody`` cannot read it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_provider.backends.base import JobState, TaskKey
from gpu_provider.backends.local import LocalBackend, common
from gpu_provider.job import GpuResources
from tests.backends import test_local
from tests.backends.test_local import GRACE, Local, job, wait_for

local = test_local.local  # the fixture: a LocalBackend in a temporary state dir, cleaned up after the test

SYSTEM_PY = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]
NOBODY_UID = 65534


@pytest.fixture
def open_local(tmp_path: Path) -> Iterator[Local]:
    """Like ``local``, but the state directory's parent is open to everyone (0755), as a state
    directory under a shared path would be: what keeps other users out must be the backend's modes."""
    parent = Path(tempfile.mkdtemp(prefix="gpu-provider-open-"))
    parent.chmod(0o755)
    harness = Local(LocalBackend(state_dir=str(parent / "state"), grace_period=GRACE, gpus=[]), tmp_path)
    try:
        yield harness
    finally:
        harness.close()
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def worker_like() -> Iterator[tuple[int, str]]:
    """A process of the worker's user started with a secret in its environment (as an Airflow worker
    is started with its connections): its pid and the secret."""
    secret = "worker-" + secrets.token_hex(8)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "AWS_SECRET_ACCESS_KEY": secret}
    )
    try:
        yield proc.pid, secret
    finally:
        proc.kill()
        proc.wait()


def as_nobody_job(code: str, *args: str) -> tuple[str, ...]:
    return (SYSTEM_PY, "-c", textwrap.dedent(code), *args)


def files_under(root: Path) -> list[Path]:
    """Every regular file under ``root`` (the fork server's socket holds no bytes to read)."""
    paths = [Path(d) / name for d, _, names in os.walk(root) for name in names]
    return [p for p in paths if not p.is_socket()]


def test_env_values_never_reach_the_disk_and_reattach_needs_none(local: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    worker_secret = "worker-" + secrets.token_hex(8)
    job_secret = "job-" + secrets.token_hex(8)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", worker_secret)
    seen, release = local.tmp / "seen", local.tmp / "release"
    code = """
        import os, sys, time
        with open(sys.argv[1], "w") as fh:
            fh.write(os.environ.get("API_TOKEN", "<missing>"))
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.05)
    """
    handle = local.submit(job(code, str(seen), str(release)), env={"API_TOKEN": job_secret})
    local.wait(handle, JobState.RUNNING)
    assert wait_for("the job's report", lambda: seen.exists() and seen.read_text()) == job_secret

    job_dir = Path(handle.extra["job_dir"])
    request = json.loads((job_dir / common.REQUEST_FILE).read_text())
    assert request["env_keys"] == ["API_TOKEN"]
    assert "env" not in request and "base_env" not in request
    for path in files_under(local.backend.state_dir):
        data = path.read_bytes()
        assert job_secret.encode() not in data, path
        assert worker_secret.encode() not in data, path
    supervisor = local.supervisor_pid(handle)
    assert job_secret.encode() not in Path(f"/proc/{supervisor}/environ").read_bytes()

    # another worker (a new backend object) polls and cancels without the values
    restarted = LocalBackend.from_options(**local.backend.options())
    status = restarted.poll([handle])[handle.job_id]
    assert getattr(status, "state", None) is JobState.RUNNING
    release.touch()
    assert local.wait(handle).state is JobState.SUCCEEDED


NOSY_JOB = """
    import json, os, sys
    worker_pid, victim_dir, victim_node, state_dir = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

    def attempt(what, fn):
        try:
            fn()
            return "allowed"
        except PermissionError:
            return "denied"
        except OSError as err:
            return f"error {err.errno}"

    def read(path):
        with open(path, "rb") as fh:
            fh.read(1)

    out = os.environ["GPU_PROVIDER_OUTPUT_FILE"]
    tmp = os.path.join(os.path.dirname(out), ".tmp-out")
    with open(tmp, "w") as fh:
        fh.write("file:///results/run-7/")
    os.replace(tmp, out)
    report = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        "home": os.environ.get("HOME"),
        "user": os.environ.get("USER"),
        "worker environ": attempt("", lambda: read(f"/proc/{worker_pid}/environ")),
        "victim node environ": attempt("", lambda: read(f"/proc/{victim_node}/environ")),
        "victim folder": attempt("", lambda: os.listdir(victim_dir)),
        "victim request": attempt("", lambda: read(os.path.join(victim_dir, "request.json"))),
        "victim log": attempt("", lambda: read(os.path.join(victim_dir, "job.log"))),
        "state folder": attempt("", lambda: os.listdir(state_dir)),
        "signal the worker": attempt("", lambda: os.kill(int(worker_pid), 0)),
        "secret in my env": "VICTIM_TOKEN" in os.environ,
    }
    print("REPORT " + json.dumps(report), flush=True)
"""


def test_run_as_user_keeps_the_job_away_from_the_worker_and_other_jobs(
    open_local: Local, worker_like: tuple[int, str]
) -> None:
    local = open_local
    release = local.tmp / "release"
    victim = local.submit(
        job("import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)", str(release)),
        env={"VICTIM_TOKEN": secrets.token_hex(8)},
    )
    local.wait(victim, JobState.RUNNING)
    victim_node = wait_for("victim node pid", lambda: local.node_pids(victim))[0]

    nobody = LocalBackend.from_options(**{**local.backend.options(), "run_as_user": "nobody"})
    nobody.validate(GpuResources(gpus=1), "on-demand", multi_capacity=False)
    args = (str(worker_like[0]), victim.extra["job_dir"], str(victim_node), str(local.backend.state_dir))
    nosy = local.submit(as_nobody_job(NOSY_JOB, *args), backend=nobody, task=TaskKey("d", "nosy", "r"))
    status = local.wait(nosy, timeout=20)
    lines = [line for chunk in [local.backend.logs(nosy)] for line in chunk.lines]
    assert status.state is JobState.SUCCEEDED, (status, lines)
    report = json.loads(next(line.split("REPORT ", 1)[1] for line in lines if "REPORT " in line))
    assert report == {
        "uid": NOBODY_UID,
        "gid": NOBODY_UID,
        "groups": [NOBODY_UID],
        "home": "/nonexistent",
        "user": "nobody",
        "worker environ": "denied",
        "victim node environ": "denied",
        "victim folder": "denied",
        "victim request": "denied",
        "victim log": "denied",
        "state folder": "denied",
        "signal the worker": "denied",
        "secret in my env": False,
    }
    # what the job declared reached the worker; its work folder (outside the state dir) is gone
    assert status.output_uri == "file:///results/run-7/"
    request = json.loads((Path(nosy.extra["job_dir"]) / common.REQUEST_FILE).read_text())
    assert request["run_as"]["uid"] == NOBODY_UID
    assert not Path(request["work_dir"]).exists()

    # the worker reads every log; folders are 0700 and files 0600, owned by the worker
    for path in [local.backend.state_dir, *(Path(d) for d, _, _ in os.walk(local.backend.state_dir))]:
        info = path.lstat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.getuid()), path
    for path in files_under(local.backend.state_dir):
        info = path.lstat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.getuid()), path
    release.touch()
    assert local.wait(victim).state is JobState.SUCCEEDED


def test_without_run_as_user_a_job_reads_what_the_worker_user_can(local: Local, worker_like: tuple[int, str]) -> None:
    """The docs' statement of what the local backend does NOT isolate, checked."""
    worker_pid, worker_secret = worker_like
    code = """
        import sys
        environ = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
        print("worker secret readable:", sys.argv[2].encode() in environ, flush=True)
    """
    handle = local.submit(job(code, str(worker_pid), worker_secret))
    assert local.wait(handle).state is JobState.SUCCEEDED
    assert "[node 0] worker secret readable: True" in local.backend.logs(handle).lines


def test_run_as_user_is_refused_when_the_worker_cannot_switch_users(tmp_path: Path, local: Local) -> None:
    check = textwrap.dedent(
        """
        from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
        from gpu_provider.backends.local import LocalBackend
        from gpu_provider.job import GpuResources
        backend = LocalBackend(state_dir="/nonexistent/state", run_as_user="root", gpus=[])
        # parsing a DAG as an unprivileged DAG processor is fine; only running the job is refused
        backend.validate(GpuResources(gpus=1), "on-demand", multi_capacity=False)
        identity = JobIdentity(TaskKey("d", "t", "r"), try_number=1, attempt=1, capacity="on-demand")
        request = JobRequest(identity, ("true",), {}, GpuResources(gpus=1), "on-demand")
        try:
            backend.submit(request)
        except ValueError as err:
            print(err)
        """
    )
    # the worker here is an unprivileged process (nobody), importing this repository's package
    out = subprocess.run(
        [SYSTEM_PY, "-c", check],
        user=NOBODY_UID,
        group=NOBODY_UID,
        extra_groups=[],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == (
        "run_as_user='root': the Airflow worker runs as uid 65534, not as root, so it cannot start processes as "
        "another user. Run the worker as root (as Airflow's own run_as_user impersonation needs sudo), or leave "
        "run_as_user unset"
    )
    backend = LocalBackend(state_dir=str(tmp_path), run_as_user="no-such-user-here", gpus=[])
    backend.validate(GpuResources(gpus=1), "on-demand", multi_capacity=False)
    with pytest.raises(ValueError, match="run_as_user='no-such-user-here': there is no such user on this machine"):
        local.submit(job("print('never')"), backend=backend)
    assert not list(tmp_path.glob("jobs/*")), "a refused submit leaves nothing behind"
    with pytest.raises(ValueError, match=r"run_as_user='\.\./x' is not a user name"):
        LocalBackend(run_as_user="../x")


def test_run_as_user_from_the_config_and_options_that_never_come_from_templates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert {"nvidia_smi", "state_dir", "run_as_user"} <= LocalBackend.fixed_options
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_RUN_AS_USER", "nobody")
    backend = LocalBackend(state_dir=str(tmp_path))
    assert backend.run_as_user == "nobody"
    assert LocalBackend.from_options(**backend.options()).run_as_user == "nobody"
    assert LocalBackend(state_dir=str(tmp_path), run_as_user="daemon").run_as_user == "daemon"


def test_nvidia_smi_runs_with_a_minimal_environment(local: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret-value")
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", "postgres://user:pw@db/x")
    dump = local.tmp / "smi-env"
    smi = local.tmp / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nenv > {dump}\nprintf '0\\n'\n")
    smi.chmod(0o755)
    backend = LocalBackend.from_options(**{**local.backend.options(), "gpus": "auto", "nvidia_smi": str(smi)})
    handle = local.submit(job("pass"), backend=backend)
    assert local.wait(handle).state is JobState.SUCCEEDED
    seen = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    # what sh adds itself (PWD, SHLVL, _) aside, only PATH and the C locale
    assert set(seen) - {"PWD", "SHLVL", "_"} == {"PATH", "LC_ALL"}
    assert seen["LC_ALL"] == "C"
    assert "worker-secret-value" not in dump.read_text()
