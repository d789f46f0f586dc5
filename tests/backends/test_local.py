"""LocalBackend with real processes: supervisor, node processes, GPU ledger, spot simulation.

Every job is a small ``python -c`` program. The ``local`` fixture kills every supervisor and node
process group its jobs started (and any pid a test registers) when the test ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpu_provider import names
from gpu_provider.backends.base import (
    JobHandle,
    JobIdentity,
    JobRequest,
    JobState,
    JobStatus,
    LogChunk,
    TaskKey,
    map_state,
    resolve_backend,
)
from gpu_provider.backends.local import STATE_TABLE, LocalBackend, common
from gpu_provider.backends.local import backend as local_module
from gpu_provider.job import GpuResources

PY = sys.executable
GRACE = 0.5
TASK = TaskKey("train_dag", "train", "manual__2024-03-04T00:00:00+00:00")
T = TypeVar("T")


# --- helpers -------------------------------------------------------------------------------------


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not), read independently of the code under test."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):  # gone before or while it was read
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


def job(code: str, *args: str) -> tuple[str, ...]:
    return (PY, "-c", textwrap.dedent(code), *args)


@dataclass
class Local:
    """Submits jobs to a LocalBackend in a temporary state dir and cleans up after them."""

    backend: LocalBackend
    tmp: Path
    handles: list[JobHandle] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def submit(
        self,
        command: tuple[str, ...],
        *,
        backend: LocalBackend | None = None,
        task: TaskKey = TASK,
        attempt: int = 1,
        capacity: str = "on-demand",
        gpus: float = 1,
        nodes: int = 1,
        env: dict[str, str] | None = None,
        max_runtime_s: float | None = None,
        image: str | None = None,
    ) -> JobHandle:
        request = JobRequest(
            identity=JobIdentity(task=task, try_number=1, attempt=attempt, capacity=capacity),
            command=command,
            env=env or {},
            resources=GpuResources(gpus=gpus, nodes=nodes),
            capacity=capacity,
            max_runtime_s=max_runtime_s,
            image=image,
        )
        handle = (backend or self.backend).submit(request)
        self.handles.append(handle)
        return handle

    def poll(self, handle: JobHandle) -> JobStatus:
        status = self.backend.poll([handle])[handle.job_id]
        assert isinstance(status, JobStatus), status
        return status

    def raw(self, handle: JobHandle) -> dict[str, Any]:
        return common.read_json(Path(handle.extra["job_dir"]) / common.STATUS_FILE) or {}

    def wait(self, handle: JobHandle, *states: JobState, timeout: float = 10.0) -> JobStatus:
        wanted = states or tuple(s for s in JobState if s.terminal)

        def check() -> JobStatus | None:
            status = self.poll(handle)
            return status if status.state in wanted else None

        return wait_for(f"{handle.job_id} in {[s.value for s in wanted]}", check, timeout)

    def node_pids(self, handle: JobHandle) -> list[int]:
        return [int(n["pid"]) for n in self.raw(handle).get("nodes") or []]

    def supervisor_pid(self, handle: JobHandle) -> int:
        return int(wait_for("supervisor pid", lambda: self.raw(handle).get("supervisor_pid")))

    def close(self) -> None:
        for handle in self.handles:
            status = self.raw(handle)
            pid = status.get("supervisor_pid") or (
                common.read_json(Path(handle.extra["job_dir"]) / common.SUPERVISOR_FILE) or {}
            ).get("pid")
            if pid and running(int(pid)):
                os.kill(int(pid), signal.SIGKILL)
            for node in status.get("nodes") or []:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(node["pid"]), signal.SIGKILL)
            if pid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(pid), os.WNOHANG)  # supervisors are children of this test process
        for pid in self.pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    harness = Local(LocalBackend(state_dir=str(tmp_path / "state"), grace_period=GRACE, gpus=[]), tmp_path)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path) -> str:
    """An nvidia-smi that reports 4 GPUs."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def fresh_log_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "_logged_once", set())


# --- the state table -----------------------------------------------------------------------------


def test_state_table_maps_every_supervisor_state() -> None:
    assert set(STATE_TABLE) == set(common.SUPERVISOR_STATES)
    for state in common.SUPERVISOR_STATES:
        mapped = map_state(STATE_TABLE, state, backend="local")
        assert mapped.terminal == (state in common.TERMINAL_STATES), state
    with pytest.raises(ValueError, match="unknown remote job state 'exploded'"):
        map_state(STATE_TABLE, "exploded", backend="local")


def test_supervisor_does_not_import_airflow() -> None:
    code = (
        "import sys, gpu_provider.backends.local.supervisor; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'airflow'))"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "[]"


# --- options -------------------------------------------------------------------------------------


def test_options_round_trip(tmp_path: Path) -> None:
    backend = LocalBackend(
        state_dir=str(tmp_path), simulate_preemptions=[8, 5], grace_period=3, gpus=[0, 1], working_dir="/srv/jobs"
    )
    options = json.loads(json.dumps(backend.options()))
    assert options == {
        "state_dir": str(tmp_path),
        "simulate_preemptions": [8.0, 5.0],
        "grace_period": 3.0,
        "gpus": [0, 1],
        "nvidia_smi": "nvidia-smi",
        "retention_days": 7.0,
        "run_as_user": None,
        "working_dir": "/srv/jobs",
    }
    rebuilt = LocalBackend.from_options(**options)
    assert rebuilt == backend
    assert rebuilt.options() == options
    assert resolve_backend({"name": "local", **options}) == backend


def test_default_state_dir_is_resolved_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_subprocess(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the constructor must not start processes")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR", str(tmp_path / "configured"))
    backend = LocalBackend()
    monkeypatch.undo()
    assert not (tmp_path / "configured").exists()
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR", str(tmp_path / "configured"))
    assert backend.options()["state_dir"] == str(tmp_path / "configured")
    assert LocalBackend.from_options(**backend.options()) == backend

    # without the config option: $AIRFLOW_HOME/gpu_provider/local
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR", "")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    assert LocalBackend().options()["state_dir"] == str(tmp_path / "home" / "gpu_provider" / "local")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("8", (8.0,)),
        ("8,5", (8.0, 5.0)),
        (" 8, 5.5 ", (8.0, 5.5)),
        ("[8, 5]", (8.0, 5.0)),
        ("", ()),
        ("None", ()),
        (None, ()),
        ([8, "5"], (8.0, 5.0)),
        (8, (8.0,)),
    ],
)
def test_simulate_preemptions_from_template_strings(value: Any, expected: tuple[float, ...]) -> None:
    backend = LocalBackend.from_options(state_dir="/tmp/x", simulate_preemptions=value, grace_period="3")
    assert backend.simulate_preemptions == expected
    assert backend.grace_period == 3.0


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (
            {"simulate_preemptions": "-1"},
            ValueError,
            r"simulate_preemptions='-1'.*'-1' is not a number of seconds from 0 to 31622400",
        ),
        ({"simulate_preemptions": "8,soon"}, ValueError, r"simulate_preemptions='8,soon'.*'soon'.*e\.g\. \[8, 5\]"),
        ({"simulate_preemptions": "[8, "}, ValueError, r"simulate_preemptions='\[8, ' is not a list"),
        ({"simulate_preemptions": [float("nan")]}, ValueError, r"simulate_preemptions=\[nan\]"),
        ({"grace_period": "-2"}, ValueError, r"grace_period='-2' is not a number of seconds from 0 to 31622400"),
        ({"grace_period": 1e308}, ValueError, r"grace_period=1e\+308 is not a number of seconds from 0 to 31622400"),
        ({"grace_period": 10**400}, ValueError, r"grace_period=.* is not a number of seconds from 0 to 31622400"),
        ({"grace_period": "soon"}, ValueError, r"grace_period='soon'"),
        ({"gpus": "0,0"}, ValueError, r"gpus='0,0': device 0 is listed twice"),
        ({"gpus": "0,x"}, ValueError, r"gpus='0,x': 'x' is not a device index.*'auto'"),
        ({"gpus": 2}, TypeError, r"gpus=2 \(int\) is not a device list"),
        ({"nvidia_smi": " "}, ValueError, r"nvidia_smi=' ' must name the nvidia-smi binary"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        LocalBackend.from_options(**options)


def test_gpus_option_forms() -> None:
    assert LocalBackend(gpus="AUTO").gpus == "auto"
    assert LocalBackend(gpus="0,2").gpus == (0, 2)
    assert LocalBackend(gpus="[1, 3]").gpus == (1, 3)
    assert LocalBackend(gpus="none").gpus == ()


# --- running jobs --------------------------------------------------------------------------------

RENDEZVOUS = """
    import json, os, socket, sys, time
    rank = int(os.environ["NODE_RANK"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    received = ""
    if rank == 0:
        server = socket.create_server((addr, port))
        server.settimeout(10)
        conn, _ = server.accept()
        received = conn.recv(100).decode()
        conn.close()
    else:
        deadline = time.time() + 10
        while True:
            try:
                sock = socket.create_connection((addr, port), timeout=1)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        sock.sendall(b"hello from rank 1")
        sock.close()
    with open(os.path.join(sys.argv[1], f"node{rank}.json"), "w") as fh:
        json.dump({"env": dict(os.environ), "received": received, "cwd": os.getcwd()}, fh)
"""


def test_two_nodes_rendezvous_with_a_minimal_environment(local: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", "postgres://user:secret@db/x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("SOME_WORKER_SETTING", "worker-only")
    monkeypatch.chdir(local.tmp)
    env = {"MY_SETTING": "42", "GPU_PROVIDER_ATTEMPT": "1"}
    handle = local.submit(job(RENDEZVOUS, str(local.tmp)), nodes=2, env=env)
    status = local.wait(handle)
    assert status.state is JobState.SUCCEEDED, status
    assert status.exit_code == 0

    nodes = [json.loads((local.tmp / f"node{r}.json").read_text()) for r in (0, 1)]
    assert nodes[0]["received"] == "hello from rank 1"  # the two processes really talked
    envs = [n["env"] for n in nodes]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert {e["NNODES"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    job_dir = Path(handle.extra["job_dir"])
    contract = {
        "NNODES",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "GPU_PROVIDER_OUTPUT_FILE",
        "PYTHONUNBUFFERED",
    }
    for e in envs:
        assert set(e) <= set(common.BASE_ENV_KEYS) | set(env) | contract, set(e)
        assert e["MY_SETTING"] == "42"
        assert e["PATH"] == os.environ["PATH"]
        assert e["CUDA_VISIBLE_DEVICES"] == ""
        assert e["GPU_PROVIDER_OUTPUT_FILE"] == str(job_dir / "output_uri")
        assert e["PYTHONUNBUFFERED"] == "1"
        assert not any(k.startswith(("AIRFLOW", "AWS_")) for k in e)
        assert "SOME_WORKER_SETTING" not in e
    assert {n["cwd"] for n in nodes} == {str(local.tmp)}  # the submitting worker's cwd
    assert not any("do-not-leak" in p.read_text(errors="replace") for p in job_dir.iterdir() if p.is_file())


def test_success_output_uri_and_gpu_seconds(local: Local) -> None:
    code = """
        import os, time
        time.sleep(0.3)
        with open(os.environ["GPU_PROVIDER_OUTPUT_FILE"], "w") as fh:
            fh.write("s3://models/run-1/\\n")
    """
    handle = local.submit(job(code), gpus=2, nodes=2)
    status = local.wait(handle)
    assert status.state is JobState.SUCCEEDED
    assert status.output_uri == "s3://models/run-1/"
    assert status.started_at is not None and status.ended_at is not None
    assert status.ended_at - status.started_at >= 0.3
    # 2 GPUs x 2 nodes for the time the job ran (requested GPUs count even on a CPU-only machine)
    assert status.gpu_seconds == pytest.approx(4 * (status.ended_at - status.started_at))
    assert local.backend.console_url(handle) is None  # a file on the worker: no browser opens it from the UI


def test_failing_node_stops_the_others(local: Local) -> None:
    code = """
        import os, sys, time
        if os.environ["NODE_RANK"] == "1":
            time.sleep(0.2)
            sys.exit(3)
        time.sleep(60)
    """
    handle = local.submit(job(code), nodes=2)
    status = local.wait(handle, timeout=10)
    assert status.state is JobState.FAILED
    assert status.reason == "node 1 exited with code 3"
    assert status.exit_code == 3
    assert status.ended_at is not None and status.started_at is not None
    assert status.ended_at - status.started_at < 0.2 + GRACE + 2  # rank 0 did not run its 60 s
    assert not any(running(pid) for pid in local.node_pids(handle))
    assert local.raw(handle)["exit_codes"] == [128 + signal.SIGTERM, 3]


def test_max_runtime_is_enforced(local: Local) -> None:
    handle = local.submit(job("import time; time.sleep(60)"), max_runtime_s=0.5)
    status = local.wait(handle)
    assert status.state is JobState.FAILED
    assert status.reason == "exceeded max_runtime of 0.5s"
    assert status.ended_at is not None and status.started_at is not None
    assert 0.5 <= status.ended_at - status.started_at < 0.5 + GRACE + 2
    assert not any(running(pid) for pid in local.node_pids(handle))


SPOT_JOB = """
    import os, signal, sys, time
    def on_term(signum, frame):
        with open(sys.argv[1], "w") as fh:
            fh.write("SIGTERM")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    print("working", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_simulated_spot_interruptions(local: Local) -> None:
    spot = LocalBackend.from_options(**{**local.backend.options(), "simulate_preemptions": "0.5"})
    first_marker = local.tmp / "first.term"
    first = local.submit(job(SPOT_JOB, str(first_marker), "60"), backend=spot, capacity="spot")
    status = local.wait(first)
    assert status.state is JobState.PREEMPTED
    assert status.reason == "simulated spot interruption 0.5s after start (LocalBackend simulate_preemptions)"
    assert first_marker.read_text() == "SIGTERM"  # SIGTERM came first, the handler ran
    assert status.started_at is not None and status.ended_at is not None
    assert 0.5 <= status.ended_at - status.started_at < 0.5 + GRACE + 2

    # the second spot attempt is beyond the list; an on-demand attempt is never interrupted
    second_marker, on_demand_marker = local.tmp / "second.term", local.tmp / "on-demand.term"
    second = local.submit(job(SPOT_JOB, str(second_marker), "1.2"), backend=spot, capacity="spot", attempt=2)
    other_task = TaskKey("train_dag", "evaluate", TASK.run_id)
    on_demand = local.submit(job(SPOT_JOB, str(on_demand_marker), "1.2"), backend=spot, task=other_task)
    for handle in (second, on_demand):
        assert local.wait(handle).state is JobState.SUCCEEDED
    assert not second_marker.exists() and not on_demand_marker.exists()


CANCEL_JOB = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL after the grace period stops us
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(str(child.pid))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
"""


def test_cancel_kills_nodes_and_their_children(local: Local) -> None:
    pid_file = local.tmp / "grandchild.pid"
    handle = local.submit(job(CANCEL_JOB, str(pid_file)))
    local.wait(handle, JobState.RUNNING)
    grandchild = int(wait_for("grandchild pid", lambda: pid_file.exists() and pid_file.read_text()))
    local.pids.append(grandchild)
    assert local.backend.job_pids(handle) == local.node_pids(handle) != []
    pids = [*local.node_pids(handle), grandchild, local.supervisor_pid(handle)]
    assert all(running(pid) for pid in pids)

    cancelled_at = time.monotonic()
    local.backend.cancel(handle, "stopped by the on_kill of task train")
    local.backend.cancel(handle, "a second cancel changes nothing")
    wait_for("all job processes gone", lambda: not any(running(pid) for pid in pids), timeout=GRACE + 3)
    assert time.monotonic() - cancelled_at < GRACE + 1.5
    status = local.wait(handle)
    assert status.state is JobState.CANCELLED
    assert status.reason == "stopped by the on_kill of task train"
    local.backend.cancel(handle, "cancel after the end is a no-op")
    assert local.poll(handle).state is JobState.CANCELLED


def test_cancel_while_waiting_for_gpus(local: Local, fake_nvidia_smi: str) -> None:
    backend = LocalBackend.from_options(**{**local.backend.options(), "gpus": "auto", "nvidia_smi": fake_nvidia_smi})
    release = local.tmp / "release"
    hold = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
    holder = local.submit(job(hold), backend=backend, gpus=4)
    local.wait(holder, JobState.RUNNING)
    waiting = local.submit(job("pass"), backend=backend, task=TaskKey("dag", "waiting", "run"), gpus=1)
    wait_for("queued for GPUs", lambda: local.raw(waiting).get("state") == common.WAITING_FOR_GPUS)
    backend.cancel(waiting, "not needed any more")
    status = local.wait(waiting)
    assert (status.state, status.reason) == (JobState.CANCELLED, "not needed any more")
    assert status.started_at is None
    release.touch()
    assert local.wait(holder).state is JobState.SUCCEEDED


def test_killed_supervisor_is_reported_and_its_nodes_killed(local: Local) -> None:
    handle = local.submit(job("import time; time.sleep(60)"), nodes=2)
    local.wait(handle, JobState.RUNNING)
    nodes = wait_for("node pids", lambda: local.node_pids(handle))
    supervisor = local.supervisor_pid(handle)
    os.kill(supervisor, signal.SIGKILL)
    status = local.wait(handle, JobState.FAILED)
    assert status.reason == f"local supervisor process {supervisor} disappeared"
    wait_for("node processes gone", lambda: not any(running(pid) for pid in nodes), timeout=3)
    # the verdict is recorded: a restarted worker sees the same
    again = LocalBackend.from_options(**local.backend.options())
    assert again.poll([handle])[handle.job_id].state is JobState.FAILED


def test_gpu_allocation(local: Local, fake_nvidia_smi: str) -> None:
    backend = LocalBackend.from_options(**{**local.backend.options(), "gpus": "auto", "nvidia_smi": fake_nvidia_smi})
    code = """
        import os, sys, time
        tag = sys.argv[1]
        with open(f"{tag}.{os.environ['NODE_RANK']}.cvd", "w") as fh:
            fh.write(os.environ["CUDA_VISIBLE_DEVICES"])
        deadline = time.time() + 20
        while not os.path.exists(f"{tag}.release") and time.time() < deadline:
            time.sleep(0.05)
    """

    def devices(tag: str, rank: int = 0) -> set[int]:
        path = local.tmp / f"{tag}.{rank}.cvd"
        text = wait_for(f"{path.name}", lambda: path.exists() and path.read_text())
        return {int(d) for d in text.split(",")}

    def start(tag: str, **kwargs: Any) -> JobHandle:
        task = TaskKey(TASK.dag_id, tag, TASK.run_id)  # one task per job: the same identity would adopt the first
        return local.submit(job(code, str(local.tmp / tag)), backend=backend, task=task, **kwargs)

    a, b = start("a", gpus=2), start("b", gpus=2)
    assert len(devices("a")) == len(devices("b")) == 2
    assert devices("a").isdisjoint(devices("b"))
    assert devices("a") | devices("b") == {0, 1, 2, 3}

    c = start("c", gpus=2)
    wait_for("c waiting", lambda: local.raw(c).get("state") == common.WAITING_FOR_GPUS)
    status = local.poll(c)
    assert (status.state, status.reason) == (JobState.QUEUED, "waiting for GPUs: 4 of 4 busy, 2 needed")
    assert status.queued_since == pytest.approx(c.submitted_at, abs=1)

    too_big = start("big", gpus=8)
    status = local.wait(too_big)
    assert status.state is JobState.FAILED
    assert "asks for 8 GPU(s) (8 per node x 1 node(s)) but this machine has 4" in status.reason

    (local.tmp / "a.release").touch()
    assert local.wait(a).state is JobState.SUCCEEDED
    local.wait(c, JobState.RUNNING)
    assert devices("c") == devices("a")  # a's GPUs went to c
    for tag in ("b", "c"):
        (local.tmp / f"{tag}.release").touch()
    for handle in (b, c):
        assert local.wait(handle).state is JobState.SUCCEEDED

    # multi-node: each node gets its own devices; fractional jobs share one device, whole GPUs do not
    d = start("d", gpus=2, nodes=2)
    assert devices("d", 0) | devices("d", 1) == {0, 1, 2, 3}
    assert len(devices("d", 0)) == 2 and devices("d", 0).isdisjoint(devices("d", 1))
    (local.tmp / "d.release").touch()
    assert local.wait(d).state is JobState.SUCCEEDED
    halves = [start(tag, gpus=0.5) for tag in ("h1", "h2")]
    whole = start("w", gpus=1)
    assert devices("h1") == devices("h2") and len(devices("h1")) == 1
    assert devices("w").isdisjoint(devices("h1"))
    for tag in ("h1", "h2", "w"):
        (local.tmp / f"{tag}.release").touch()
    for handle in (*halves, whole):
        assert local.wait(handle).state is JobState.SUCCEEDED
    ledger = json.loads((Path(backend.options()["state_dir"]) / common.ALLOC_FILE).read_text())
    assert ledger == {}  # everything given back


def test_no_gpu_runs_cpu_only_and_says_so_once(
    local: Local, caplog: pytest.LogCaptureFixture, fresh_log_once: None
) -> None:
    backend = LocalBackend.from_options(
        **{**local.backend.options(), "gpus": "auto", "nvidia_smi": str(local.tmp / "no-such-nvidia-smi")}
    )
    code = "import os, sys; open(sys.argv[1], 'w').write(repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    with caplog.at_level(logging.INFO, logger="gpu_provider.backends.local"):
        handles = [
            local.submit(
                job(code, str(local.tmp / f"cvd{i}")),
                backend=backend,
                task=TaskKey(TASK.dag_id, f"t{i}", TASK.run_id),
                gpus=2,
                image="trainer:1",
            )
            for i in range(2)
        ]
        for handle in handles:
            assert local.wait(handle).state is JobState.SUCCEEDED
    assert [(local.tmp / f"cvd{i}").read_text() for i in range(2)] == ["''", "''"]
    no_gpu = [r.getMessage() for r in caplog.records if "no NVIDIA GPU found" in r.getMessage()]
    assert len(no_gpu) == 1
    assert "no-such-nvidia-smi" in no_gpu[0] and no_gpu[0].endswith("running jobs CPU-only")
    image = [r.getMessage() for r in caplog.records if "image 'trainer:1' is not used" in r.getMessage()]
    assert len(image) == 1


def test_find_existing_from_a_restarted_worker(local: Local) -> None:
    # "train-dag" and "train_dag" look alike in a name; the run hash covers the full ids, so the
    # prefixes differ, and find_existing must tell them apart either way
    lookalike = TaskKey("train-dag", TASK.task_id, TASK.run_id)
    assert lookalike.prefix.rsplit("-", 1)[0] == TASK.prefix.rsplit("-", 1)[0]
    assert lookalike.prefix != TASK.prefix
    second = local.submit(job("pass"), attempt=2, capacity="spot")
    first = local.submit(job("pass"), attempt=1)
    local.submit(job("pass"), task=lookalike)
    local.submit(job("pass"), task=TaskKey(TASK.dag_id, TASK.task_id, TASK.run_id, map_index=0))

    restarted = LocalBackend.from_options(**local.backend.options())
    found = restarted.find_existing(TASK)
    assert found == [first, second]
    assert [JobHandle.from_dict(json.loads(json.dumps(h.to_dict()))) for h in found] == found
    statuses = restarted.poll(found)
    for handle in found:
        assert local.wait(handle).state is JobState.SUCCEEDED
    assert set(statuses) == {first.job_id, second.job_id}
    assert restarted.find_existing(TaskKey("other", "task", "run")) == []
    assert restarted.list_jobs() == local.handles  # every job, oldest first


def test_logs_paging(local: Local) -> None:
    code = "import sys\nfor i in range(5):\n    print(f'line {i}')\nprint('oops', file=sys.stderr)"
    handle = local.submit(job(code))
    assert local.wait(handle).state is JobState.SUCCEEDED
    chunk = local.backend.logs(handle)
    node_lines = [line for line in chunk.lines if line.startswith("[node 0] ")]
    assert node_lines[:5] == [f"[node 0] line {i}" for i in range(5)]
    assert "[node 0] oops" in node_lines
    assert not chunk.more
    log_file = Path(handle.extra["job_dir"]) / "job.log"
    assert chunk.cursor == str(log_file.stat().st_size)

    assert local.backend.logs(handle, chunk.cursor) == LogChunk([], chunk.cursor, False)
    with open(log_file, "ab") as fh:
        fh.write(b"[node 0] part")
    assert local.backend.logs(handle, chunk.cursor).lines == []  # only complete lines
    with open(log_file, "ab") as fh:
        fh.write(b"ial\n[node 0] next\n")
    later = local.backend.logs(handle, chunk.cursor)
    assert later.lines == ["[node 0] partial", "[node 0] next"]
    assert later.cursor == str(log_file.stat().st_size)
    with pytest.raises(ValueError, match="cursor='-1' is not a cursor of the local backend's logs"):
        local.backend.logs(handle, "-1")


def test_poll_of_a_vanished_job_dir(local: Local) -> None:
    handle = JobHandle("local", "gp-x-1", "gp-x", 1, "spot", time.time(), {"job_dir": str(local.tmp / "gone")})
    status = local.backend.poll([handle])[handle.job_id]
    assert isinstance(status, JobStatus)
    assert (status.state, status.interruption) == (JobState.FAILED, names.LOST)
    assert "its folder" in status.reason and "is gone" in status.reason
    local.backend.cancel(handle, "nothing to cancel")  # no error


def test_sigterm_to_the_supervisor_cancels(local: Local) -> None:
    handle = local.submit(job("import time; time.sleep(60)"))
    local.wait(handle, JobState.RUNNING)
    nodes = wait_for("node pids", lambda: local.node_pids(handle))
    os.kill(local.supervisor_pid(handle), signal.SIGTERM)
    status = local.wait(handle)
    assert (status.state, status.reason) == (JobState.CANCELLED, "local supervisor received SIGTERM")
    assert not any(running(pid) for pid in nodes)


def test_command_that_cannot_start(local: Local) -> None:
    handle = local.submit((str(local.tmp / "no-such-program"),), nodes=2)
    status = local.wait(handle)
    assert status.state is JobState.FAILED
    assert status.reason.startswith("could not start node 0: [Errno 2] No such file or directory")
    assert status.exit_code == 127


def test_old_finished_job_folders_are_pruned_and_running_ones_kept(local: Local) -> None:
    done = local.submit(job("print('done')"))
    local.wait(done)
    running_job = local.submit(job("import time; time.sleep(30)"), task=TaskKey("dag", "other", "run"))
    local.wait(running_job, JobState.RUNNING)
    week_later = time.time() + 7 * 86400 + 60
    assert local.backend.prune(now=time.time()) == []  # nothing is 7 days old yet
    assert local.backend.prune(now=week_later) == [done.job_id]
    assert not Path(done.extra["job_dir"]).exists()
    assert Path(running_job.extra["job_dir"]).exists()
    assert local.backend.find_existing(TASK) == []
    forever = LocalBackend(state_dir=str(local.backend.state_dir), retention_days=0)
    assert forever.prune(now=week_later * 2) == []
    assert LocalBackend.from_options(**local.backend.options()).retention_days == 7.0
