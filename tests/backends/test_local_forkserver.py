"""The local backend's fork server: supervisors forked by it run exactly as spawned ones, outlive the worker
and the server, and a server that is missing, stale or refusing is never a reason for a second job or none.

Every test starts its own server in its own state directory and stops it (and every process its jobs
started) at teardown, pass or fail.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.base import JobHandle, JobState, TaskKey
from gpu_provider.backends.local import LocalBackend, common, folders, forkserver, frames, launch
from tests.backends.test_local import GRACE, PY, TASK, Local, running, wait_for

SECRET = "fork-server-secret-3f9a1c"


def ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


class Served:
    """A state directory with its fork server running (started as a worker starts it)."""

    def __init__(self, tmp: Path, idle_s: float = 120.0) -> None:
        self.state_dir = tmp / "state"
        self.state_dir.mkdir(parents=True)
        self.code_hash = forkserver.source_hash()
        self.name = forkserver.server_name(self.code_hash)
        self.folder = self.state_dir / forkserver.FOLDER
        self.idle_s = idle_s
        self.pids: list[int] = []
        self.folder_fd = -1

    def start(self) -> int:
        os.close(forkserver.open_folder(self.state_dir))
        launch._server_tries.pop((str(self.folder), self.name), None)
        launch._start_server(self.folder, self.name, self.code_hash, self.idle_s)
        return self.wait_ready()

    def wait_ready(self) -> int:
        info = wait_for("the fork server listening", lambda: common.read_json(self.folder / f"{self.name}.json"))
        pid = int(info["pid"])
        self.pids.append(pid)
        return pid

    @property
    def address(self) -> str:
        """The socket's address as a worker reaches it (through a folder handle when the path is long)."""
        if self.folder_fd < 0:
            self.folder_fd = forkserver.open_folder(self.state_dir)
        return forkserver.socket_address(self.folder, self.name, self.folder_fd)

    def stop(self) -> None:
        if self.folder_fd >= 0:
            os.close(self.folder_fd)
        for pid in self.pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        launch.reap_children()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, Local]]:
    server = Served(tmp_path)
    (tmp_path / "work").mkdir()
    backend = LocalBackend(
        state_dir=str(server.state_dir), grace_period=GRACE, gpus=[], working_dir=str(tmp_path / "work")
    )
    harness = Local(backend, tmp_path)
    try:
        yield server, harness
    finally:
        harness.close()
        server.stop()


# A job that writes what it and its supervisor see, then waits for a release file (if given).
PROBE = textwrap.dedent(
    """
    import json, os, re, sys, time
    def status(pid):
        text = open(f"/proc/{pid}/status").read()
        return {k: v.strip() for k, v in re.findall(r"^(Umask|SigIgn|SigBlk|SigCgt):(.*)$", text, re.M)}
    sup = os.getppid()
    info = {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "status": status(os.getpid()),
        "limits": open("/proc/self/limits").read(),
        "stdin": os.readlink("/proc/self/fd/0"),
        "sup": {
            "pid": sup,
            "ppid": int(open(f"/proc/{sup}/stat").read().rsplit(")", 1)[1].split()[1]),
            "status": status(sup),
            "limits": open(f"/proc/{sup}/limits").read(),
            "cwd": os.readlink(f"/proc/{sup}/cwd"),
            "fds": sorted(os.readlink(f"/proc/{sup}/fd/{fd}") for fd in os.listdir(f"/proc/{sup}/fd")),
            "sid": os.getsid(sup),
            "pgid": os.getpgid(sup),
            "cmdline": open(f"/proc/{sup}/cmdline", "rb").read().decode(errors="replace"),
            "environ": open(f"/proc/{sup}/environ", "rb").read().decode(errors="replace"),
        },
    }
    with open(sys.argv[1] + ".tmp", "w") as out:
        json.dump(info, out)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
    """
)


def probe(out: Path, release: Path | None = None) -> tuple[str, ...]:
    return (PY, "-c", PROBE, str(out), *([str(release)] if release else []))


def read_probe(out: Path) -> dict[str, Any]:
    return json.loads(wait_for(f"{out} written", lambda: out.exists() and out.read_text()))  # type: ignore[arg-type]


def task(name: str) -> TaskKey:
    return TaskKey(TASK.dag_id, name, TASK.run_id)


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a fork server's: its waiting spare, the supervisors it forked)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if running(int(c))]


# --- parity --------------------------------------------------------------------------------------


def test_a_forked_supervisor_and_its_job_see_what_a_spawned_one_sees(
    served: tuple[Served, Local], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, local = served
    server_pid = server.start()
    # the worker now differs from the server it started: umask, a limit, an ignored signal, its environment
    monkeypatch.setenv("TZ", "Pacific/Auckland")
    mask = os.umask(0o027)
    ignored = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit[0], 512), limit[1]))
    try:
        forked = local.submit(probe(local.tmp / "forked.json"), task=task("forked"), env={"TOKEN": SECRET})
        seen_forked = read_probe(local.tmp / "forked.json")
        monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER", "false")
        spawned = local.submit(probe(local.tmp / "spawned.json"), task=task("spawned"), env={"TOKEN": SECRET})
        seen_spawned = read_probe(local.tmp / "spawned.json")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limit)
        signal.signal(signal.SIGUSR1, ignored)
        os.umask(mask)
    assert local.wait(forked).state is JobState.SUCCEEDED and local.wait(spawned).state is JobState.SUCCEEDED
    # one was forked by the server, the other spawned by this process
    assert seen_forked["sup"]["pid"] != seen_spawned["sup"]["pid"]
    assert local.supervisor_pid(forked) == seen_forked["sup"]["pid"]

    def same(info: dict[str, Any], handle: JobHandle) -> dict[str, Any]:
        job_dir = handle.extra["job_dir"]
        env = {k: v.replace(job_dir, "JOB") for k, v in info["env"].items() if k != "MASTER_PORT"}
        sup = info["sup"]
        fds = [re.sub(r"\[\d+\]", "[N]", fd.replace(job_dir, "JOB")) for fd in sup["fds"]]
        return {
            "env": env,
            "cwd": info["cwd"],
            "status": info["status"],
            "limits": info["limits"],
            "stdin": info["stdin"],
            "sup_status": sup["status"],
            "sup_limits": sup["limits"],
            "sup_cwd": sup["cwd"].replace(job_dir, "JOB"),
            "sup_fds": fds,
            "sup_session_and_group_of_its_own": sup["sid"] == sup["pgid"] == sup["pid"],
        }

    assert same(seen_forked, forked) == same(seen_spawned, spawned)
    parity = same(seen_forked, forked)
    assert parity["env"]["TOKEN"] == SECRET and parity["env"]["TZ"] == "Pacific/Auckland"
    assert parity["cwd"] == str(local.tmp / "work")  # the caller's working folder, not the server's
    assert parity["sup_cwd"] == "JOB" and parity["sup_session_and_group_of_its_own"]
    assert parity["sup_status"]["Umask"] == "0027" and parity["status"]["Umask"] == "0027"
    assert int(parity["status"]["SigIgn"], 16) & (1 << (signal.SIGUSR1 - 1))  # ignored by the worker: by the job too
    assert re.search(r"Max open files\s+512\s", parity["sup_limits"]) and re.search(
        r"Max open files\s+512\s", parity["limits"]
    )
    assert parity["stdin"] == "/dev/null"
    assert sorted(parity["sup_fds"])[:1] == ["/dev/null"]  # no socket of the server's left open in the supervisor
    assert not any(fd.startswith("socket:") for fd in parity["sup_fds"])

    # the job's environment values: in no command line, no process's initial environment, no file
    assert SECRET not in Path(f"/proc/{server_pid}/cmdline").read_text(errors="replace")
    assert SECRET not in seen_forked["sup"]["environ"] and SECRET not in seen_forked["sup"]["cmdline"]
    assert SECRET not in Path(f"/proc/{server_pid}/environ").read_text(errors="replace")
    for path in server.state_dir.rglob("*"):
        if path.is_file() and not path.is_socket():
            assert SECRET.encode() not in path.read_bytes(), path
        if path.parent == server.folder or path == server.folder:
            assert path.stat().st_mode & 0o077 == 0, f"{path} is open to others: {path.stat().st_mode:o}"


# --- the job outlives the worker and the server -------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, sys, time
    from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.job import GpuResources
    backend = LocalBackend(state_dir=sys.argv[1], gpus=[], grace_period=0.5)
    request = JobRequest(
        identity=JobIdentity(task=TaskKey(*json.loads(sys.argv[2])), try_number=1, attempt=1, capacity="on-demand"),
        command=json.loads(sys.argv[3]), env={}, resources=GpuResources(gpus=1, nodes=1), capacity="on-demand",
    )
    print("HANDLE", json.dumps(backend.submit(request).to_dict()), flush=True)
    time.sleep(600)
    """
)


def test_the_job_outlives_the_worker_and_the_fork_server_and_a_retry_reattaches(
    served: tuple[Served, Local],
) -> None:
    server, local = served
    server_pid = server.start()
    release = local.tmp / "release"
    out = local.tmp / "job.json"
    the_task = task("outlives")
    worker = subprocess.Popen(
        [
            PY,
            "-c",
            WORKER,
            str(server.state_dir),
            json.dumps([the_task.dag_id, the_task.task_id, the_task.run_id]),
            json.dumps(probe(out, release)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        line = next(line for line in worker.stdout if line.startswith("HANDLE "))
        handle = JobHandle.from_dict(json.loads(line.removeprefix("HANDLE ")))
        local.handles.append(handle)
        seen = read_probe(out)
        supervisor = seen["sup"]["pid"]
        assert ppid(supervisor) == server_pid  # forked by the server
        worker.kill()
        worker.wait()
        os.kill(server_pid, signal.SIGKILL)
        wait_for("the fork server gone", lambda: not running(server_pid))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    node = local.node_pids(handle)[0]
    assert running(supervisor) and running(node)
    assert ppid(supervisor) != server_pid  # reparented, still supervising
    # a retry in a new worker finds the attempt and reattaches: a submit of the same attempt adopts it
    retry = LocalBackend(state_dir=str(server.state_dir), gpus=[], grace_period=GRACE)
    assert [h.job_id for h in retry.find_existing(the_task)] == [handle.job_id]
    assert local.poll(handle).state is JobState.RUNNING
    release.touch()
    assert local.wait(handle).state is JobState.SUCCEEDED
    wait_for("the supervisor gone", lambda: not running(supervisor))


def test_a_forked_job_is_cancelled_like_a_spawned_one(served: tuple[Served, Local]) -> None:
    server, local = served
    server_pid = server.start()
    handle = local.submit(probe(local.tmp / "out.json", local.tmp / "never"))
    seen = read_probe(local.tmp / "out.json")
    assert seen["sup"]["ppid"] == server_pid
    node = local.node_pids(handle)[0]
    local.backend.cancel(handle, "test cancel")
    status = local.wait(handle)
    assert (status.state, status.reason) == (JobState.CANCELLED, "test cancel")
    wait_for("the node gone", lambda: not running(node))


# --- missing, stale or refusing servers -----------------------------------------------------------


def test_a_server_of_other_code_is_not_used(served: tuple[Served, Local], monkeypatch: pytest.MonkeyPatch) -> None:
    server, local = served
    server_pid = server.start()
    waiting = wait_for("the server's spare", lambda: children(server_pid))  # forked ahead of any request
    # asked directly for another hash: refused, nothing forked
    with pytest.raises(forkserver.Refused, match="this server runs other code"):
        forkserver.request_start(
            server.address,
            code_hash="0" * 64,
            job_dir=local.tmp,
            env={},
            secrets_payload={},
        )
    # the spare that took the request refused it and exits, having started nothing; the server forks the next
    waiting = wait_for(
        "the next spare, alone", lambda: (now := children(server_pid)) != waiting and len(now) == 1 and now
    )
    # a worker whose provider's source differs looks for another server: this one gets no request
    monkeypatch.setattr(forkserver, "source_hash", lambda root=None: "1" * 64)
    handle = local.submit(probe(local.tmp / "out.json"))
    seen = read_probe(local.tmp / "out.json")
    assert seen["sup"]["ppid"] == os.getpid()  # spawned by this process
    assert local.wait(handle).state is JobState.SUCCEEDED
    assert children(server_pid) == waiting, "nothing but its waiting spare: no request reached it"
    # the server started for that name saw the source on disk is not what it was asked for, and did not serve
    other = forkserver.server_name("1" * 64)
    log_file = server.folder / f"{other}.log"
    wait_for("the other server's word", lambda: log_file.exists() and "not serving" in log_file.read_text())
    assert not (server.folder / f"{other}.sock").exists()


def test_the_name_changes_with_the_served_source(tmp_path: Path) -> None:
    root = tmp_path / "copy"
    for rel in forkserver.SERVED_MODULES:
        target = root / "gpu_provider" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(forkserver.package_root() / "gpu_provider" / rel, target)
    before = forkserver.source_hash(root)
    assert before == forkserver.source_hash()
    with (root / "gpu_provider" / "backends/local/supervisor.py").open("a") as fh:
        fh.write("\n# upgraded\n")
    assert forkserver.source_hash(root) != before
    assert forkserver.server_name(forkserver.source_hash(root)) != forkserver.server_name(before)
    assert forkserver.server_name(before, executable="/other/python") != forkserver.server_name(before)


def test_the_source_hash_is_read_again_only_when_a_served_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch stats the served files; it reads and hashes them (about 100 KB) only when one of them changed."""
    root = tmp_path / "copy"
    for rel in forkserver.SERVED_MODULES:
        target = root / "gpu_provider" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(forkserver.package_root() / "gpu_provider" / rel, target)
    reads: list[str] = []
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self.name) or real_read(self))
    first = forkserver.source_hash(root)
    assert len(reads) == len(forkserver.SERVED_MODULES)
    reads.clear()
    assert forkserver.source_hash(root) == first and reads == []  # unchanged: nothing read
    served = root / "gpu_provider" / "backends/local/frames.py"
    same_size = served.read_text().replace("the peer's uid", "the peer's UID")  # an edit of the same length
    assert len(same_size) == len(served.read_text()) and same_size != served.read_text()
    served.write_text(same_size)
    later = served.stat().st_mtime_ns + 1_000_000_000
    os.utime(served, ns=(later, later))  # a file system with coarse timestamps still shows a new mtime
    reads.clear()
    assert forkserver.source_hash(root) != first and len(reads) == len(forkserver.SERVED_MODULES)


def test_a_served_module_list_that_misses_a_module_is_caught() -> None:
    """The hash covers every module of the provider the server has imported when it serves."""
    code = (
        "import sys, json; import gpu_provider.backends.local.forkserver as f; f.preload(); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'gpu_provider')))"
    )
    out = subprocess.run([PY, "-S", "-c", code], capture_output=True, text=True, check=True, timeout=30)
    imported = json.loads(out.stdout)
    files = {m.removeprefix("gpu_provider").lstrip(".").replace(".", "/") for m in imported}
    listed = {rel.removesuffix(".py").removesuffix("__init__").rstrip("/") for rel in forkserver.SERVED_MODULES}
    assert files == listed


def test_a_stale_socket_falls_back_to_spawning_and_a_server_takes_its_place(served: tuple[Served, Local]) -> None:
    server, local = served
    os.close(forkserver.open_folder(server.state_dir))
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(server.address)  # a dead server's socket file: nobody listens
    dead.close()
    first = local.submit(probe(local.tmp / "first.json"), task=task("first"))
    assert read_probe(local.tmp / "first.json")["sup"]["ppid"] == os.getpid()
    server_pid = server.wait_ready()  # the launch started a server for the next ones
    second = local.submit(probe(local.tmp / "second.json"), task=task("second"))
    assert read_probe(local.tmp / "second.json")["sup"]["ppid"] == server_pid
    assert local.wait(first).state is JobState.SUCCEEDED and local.wait(second).state is JobState.SUCCEEDED


def test_a_server_that_hangs_up_costs_neither_the_job_nor_a_second_one(served: tuple[Served, Local]) -> None:
    server, local = served
    os.close(forkserver.open_folder(server.state_dir))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server.address)
    listener.listen()
    stop = threading.Event()

    def hang_up() -> None:
        while not stop.is_set():
            conn, _ = listener.accept()
            conn.recv(1 << 16)
            conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        marks = local.tmp / "marks"
        handle = local.submit((PY, "-c", f"open({str(marks)!r}, 'a').write('ran\\n')"))
        assert local.wait(handle).state is JobState.SUCCEEDED
    finally:
        stop.set()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as poke:
            poke.connect(server.address)
        thread.join(5)
        listener.close()
    assert marks.read_text() == "ran\n"  # run once
    assert local.raw(handle)["supervisor_pid"] and not (server.folder / f"{server.name}.json").exists()


def test_a_forked_child_that_never_gets_the_environment_starts_nothing(served: tuple[Served, Local]) -> None:
    """A worker asks before it writes the job's folder; one that gives up then (the attempt taken, its folder
    failed, the worker died) leaves the child that took the request to exit having started nothing."""
    server, local = served
    server_pid = server.start()
    (spare,) = wait_for("the server's spare", lambda: children(server_pid))
    job_dir = local.tmp / "job"
    job_dir.mkdir()
    (job_dir / common.SUPERVISOR_LOG_FILE).touch()
    asked = forkserver.Asked(server.address, code_hash=server.code_hash, job_dir=job_dir, env={})
    asked.abandon()
    wait_for("the forked child gone", lambda: not running(spare))
    assert sorted(p.name for p in job_dir.iterdir()) == [common.SUPERVISOR_LOG_FILE]  # nothing written, nothing ran
    assert (job_dir / common.SUPERVISOR_LOG_FILE).read_text() == ""


# --- settings and life ----------------------------------------------------------------------------


def test_the_fork_server_can_be_turned_off(served: tuple[Served, Local], monkeypatch: pytest.MonkeyPatch) -> None:
    server, local = served
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER", "false")
    for name in ("a", "b"):
        handle = local.submit(probe(local.tmp / f"{name}.json"), task=task(name))
        assert read_probe(local.tmp / f"{name}.json")["sup"]["ppid"] == os.getpid()
        assert local.wait(handle).state is JobState.SUCCEEDED
    assert not server.folder.exists()
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER", "maybe")
    with pytest.raises(ValueError, match=r"local_fork_server='maybe' is not a boolean; allowed: true, false"):
        local.submit(probe(local.tmp / "c.json"), task=task("c"))
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER", "true")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER_IDLE_S", "soon")
    with pytest.raises(ValueError, match=r"local_fork_server_idle_s='soon' is not a number of seconds"):
        local.submit(probe(local.tmp / "d.json"), task=task("d"))


def test_the_server_exits_when_idle_or_when_its_socket_is_gone(tmp_path: Path) -> None:
    idle = Served(tmp_path / "idle", idle_s=0.5)
    try:
        pid = idle.start()
        wait_for("the idle server gone", lambda: not running(pid))
        assert not (idle.folder / f"{idle.name}.sock").exists()
        assert "exits: idle for" in (idle.folder / f"{idle.name}.log").read_text()
    finally:
        idle.stop()
    gone = Served(tmp_path / "gone")
    try:
        pid = gone.start()
        (gone.folder / f"{gone.name}.sock").unlink()  # its socket deleted (as with its state directory)
        wait_for("the server without a socket gone", lambda: not running(pid))
        assert "exits: its socket is gone" in (gone.folder / f"{gone.name}.log").read_text()
        assert not (gone.folder / f"{gone.name}.json").exists()
    finally:
        gone.stop()


# --- the spare: the next supervisor forked ahead of its request ---------------------------------------


def test_a_launch_is_answered_by_the_spare_forked_before_it(served: tuple[Served, Local]) -> None:
    """The fork is off the launch path: the server forks the next request's child while nobody waits, and
    that child becomes the supervisor (the same parity as one forked on demand: see the parity test)."""
    server, local = served
    server_pid = server.start()
    (spare,) = wait_for("the server's spare", lambda: children(server_pid))
    handle = local.submit(probe(local.tmp / "out.json"), task=task("spare"))
    seen = read_probe(local.tmp / "out.json")
    assert seen["sup"]["pid"] == spare and seen["sup"]["ppid"] == server_pid
    assert seen["sup"]["sid"] == spare == seen["sup"]["pgid"]  # its own session, as a spawned supervisor's
    assert local.wait(handle).state is JobState.SUCCEEDED
    (following,) = wait_for("the next spare", lambda: [c for c in children(server_pid) if c != spare] or None)
    # the server gone (killed: no word to anyone), its waiting spare reads EOF and exits, having started nothing
    os.kill(server_pid, signal.SIGKILL)
    wait_for("the spare gone with its server", lambda: not running(following))


def test_a_dead_spare_costs_neither_the_job_nor_a_second_one(served: tuple[Served, Local]) -> None:
    server, local = served
    server_pid = server.start()
    (spare,) = wait_for("the server's spare", lambda: children(server_pid))
    os.kill(spare, signal.SIGKILL)
    wait_for("the spare gone", lambda: spare not in children(server_pid))
    handle = local.submit(probe(local.tmp / "out.json"), task=task("dead-spare"))
    seen = read_probe(local.tmp / "out.json")
    assert seen["sup"]["pid"] != spare and seen["sup"]["ppid"] == server_pid  # forked on demand
    assert local.wait(handle).state is JobState.SUCCEEDED
    assert [h.job_id for h in local.backend.list_jobs()] == [handle.job_id], "one job"


# --- the launch path: the spare answers itself, the request goes ahead of the folder ---------------------


def minor_faults(pid: int) -> int:
    """The page faults ``pid`` took without disk reads (a forked process copying a page it shares, among them)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[7])


def catches(pid: int, sig: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)  # type: ignore[union-attr]
    return bool(caught & (1 << (sig - 1)))


def test_a_launch_is_taken_by_the_spare_while_the_server_sleeps(served: tuple[Served, Local]) -> None:
    """The spare accepts the worker's connection itself: a server that does not run (stopped here; busy, or
    waiting for a core, on a loaded machine) is not on the launch's path."""
    server, local = served
    server_pid = server.start()
    (spare,) = wait_for("the server's spare", lambda: children(server_pid))
    os.kill(server_pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        handle = local.submit(probe(local.tmp / "out.json"), task=task("server-asleep"))
        took = time.monotonic() - started
        seen = read_probe(local.tmp / "out.json")
    finally:
        os.kill(server_pid, signal.SIGCONT)
    assert seen["sup"]["pid"] == spare and seen["sup"]["ppid"] == server_pid  # not spawned by this process
    assert took < forkserver.IO_TIMEOUT_S, f"the launch waited {took:.1f}s for the server"
    assert local.wait(handle).state is JobState.SUCCEEDED


def test_the_spare_sets_itself_up_while_the_worker_writes_the_job_folder(
    served: tuple[Served, Local], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker asks the fork server before it writes the job's folder, and the child takes on the spawned
    supervisor's settings (signal handlers among them) meanwhile; it starts nothing before the folder is there."""
    server, local = served
    server_pid = server.start()
    (spare,) = wait_for("the server's spare", lambda: children(server_pid))
    # a waiting spare: every signal at its default, once it reset what it inherited from the server (a just
    # forked spare still has the server's handlers for a moment, longer on a loaded machine)
    assert wait_for("the spare at rest", lambda: not catches(spare, signal.SIGINT), timeout=10)
    seen: dict[str, Any] = {}
    real = folders.create_job_dir

    def create_job_dir(jobs: Path, job_dir: Path, record: dict[str, Any]) -> JobHandle | None:
        # the child got the request and set itself up (SIGINT raises KeyboardInterrupt in a new interpreter)
        seen["set up first"] = wait_for("the child set up", lambda: catches(spare, signal.SIGINT), timeout=10)
        seen["folder then"] = job_dir.exists()
        return real(jobs, job_dir, record)

    monkeypatch.setattr(folders, "create_job_dir", create_job_dir)
    handle = local.submit(probe(local.tmp / "out.json"), task=task("ahead"))
    assert seen == {"set up first": True, "folder then": False}
    assert read_probe(local.tmp / "out.json")["sup"]["pid"] == spare
    assert local.wait(handle).state is JobState.SUCCEEDED


def test_an_adopted_attempt_leaves_the_asked_child_to_start_nothing(served: tuple[Served, Local]) -> None:
    server, local = served
    server_pid = server.start()
    marks = local.tmp / "marks"
    command = (PY, "-c", f"open({str(marks)!r}, 'a').write('ran\\n')")
    first = local.submit(command, task=task("twice"))
    assert local.wait(first).state is JobState.SUCCEEDED
    (spare,) = wait_for("the next spare", lambda: [c for c in children(server_pid) if c != local.supervisor_pid(first)])
    again = local.submit(command, task=task("twice"))  # the same attempt: adopted, after the server was asked
    assert again.job_id == first.job_id
    wait_for("the asked spare gone", lambda: not running(spare))
    assert marks.read_text() == "ran\n"  # run once


def test_a_child_that_recorded_itself_is_the_supervisor_though_its_word_is_lost(served: tuple[Served, Local]) -> None:
    """A worker that gets no word from the child after handing it the environment starts a supervisor itself only
    where none is recorded: here a stand-in for the server's child records a pid and hangs up without a word."""
    server, local = served
    os.close(forkserver.open_folder(server.state_dir))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server.address)
    listener.listen()
    stand_in = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    local.pids.append(stand_in.pid)

    def child() -> None:
        conn, _ = listener.accept()
        with conn:
            request = frames.recv(conn)
            frames.recv(conn)  # the job's environment
            with common.supervisor_record(Path(request["job_dir"]) / common.SUPERVISOR_FILE) as (_, record):
                record(stand_in.pid, common.process_start_time(stand_in.pid))

    thread = threading.Thread(target=child, daemon=True)
    thread.start()
    spawned_before = {id(p) for p in launch._children}
    try:
        handle = local.submit((PY, "-c", "print('ran')"), task=task("word-lost"))
    finally:
        thread.join(10)
        listener.close()
    recorded = common.read_json(Path(handle.extra["job_dir"]) / common.SUPERVISOR_FILE) or {}
    assert recorded["pid"] == stand_in.pid  # not replaced by a supervisor of the worker's own
    assert [p.pid for p in launch._children if id(p) not in spawned_before] == [], "no supervisor spawned here"
    stand_in.kill()
    stand_in.wait()


def test_the_spare_copies_the_servers_pages_its_launch_writes_before_the_launch(served: tuple[Served, Local]) -> None:
    """A forked process copies each page it shares with the server on its first write to it (reference counts
    included). The spare walks the launch's code once while it waits, so its launch copies few pages."""
    server, local = served
    server_pid = server.start()
    (spare,) = wait_for("the server's spare", lambda: children(server_pid))
    # done with its walk: blocked in select(), waiting for a connection
    wait_for("the spare waiting", lambda: "poll_schedule" in Path(f"/proc/{spare}/wchan").read_text())
    before = minor_faults(spare)
    release = local.tmp / "release"
    handle = local.submit(probe(local.tmp / "out.json", release), task=task("pages"))
    assert read_probe(local.tmp / "out.json")["sup"]["pid"] == spare
    launch_faults = minor_faults(spare) - before
    release.touch()
    assert local.wait(handle).state is JobState.SUCCEEDED
    # about 430 without the walk on this project's machines, 140 with it
    assert launch_faults < 300, f"the launch copied {launch_faults} pages"
