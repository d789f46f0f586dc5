"""GpuJobOperator under a real Airflow: scheduler, DAG processor, triggerer and API server
(`airflow standalone`, LocalExecutor, SQLite), driven through the REST API as a person would.

What dag.test() cannot show: a deferred task waiting in the real triggerer, and a person marking a
running or a deferred task failed, which must cancel its job (worker on_kill / trigger on_kill).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.batch_world import BatchWorld, connection_env
from tests.harness import pid_alive, wait_for

DAG_SOURCE = """
import sys
from airflow.sdk import DAG
from gpu_provider.operators import GpuJobOperator
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.batch import BatchBackend

STATE = {state!r}
PIDS = {pids!r}

def job(seconds):
    code = (
        "import os, sys, time; "
        f"open(os.path.join({{PIDS!r}}, os.environ['GPU_PROVIDER_ATTEMPT'] + '-' + sys.argv[1] + '.pid'), 'w')"
        ".write(str(os.getpid())); "
        f"time.sleep({{seconds}})"
    )
    return [sys.executable, "-c", code]

for deferrable in (True, False):
    name = "deferred" if deferrable else "sync"
    with DAG(dag_id=f"kill_{{name}}", schedule=None, catchup=False) as dag:
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir=STATE, grace_period=1),
            command=job(300) + [name],
            deferrable=deferrable,
            poll_interval=0.5,
        )
    globals()[f"kill_{{name}}"] = dag

with DAG(dag_id="kill_batch_deferred", schedule=None, catchup=False) as kill_batch_deferred:
    GpuJobOperator(
        task_id="job",
        backend=BatchBackend(spot_queue={spot_queue!r}, on_demand_queue={on_demand_queue!r}),
        image="trainer:1",
        command=job(300) + ["batch"],
        deferrable=True,
        poll_interval=0.5,
    )

with DAG(dag_id="fan_out", schedule=None, catchup=False) as fan_out:
    # jobs of 10 s: the executor has taken in the end of each task's first (deferring) run before the
    # trigger fires; with a 2 s job on a loaded machine Airflow 3.3's LocalExecutor can report that
    # stale end after the resumed run started, and the scheduler then fails the task (an Airflow race)
    GpuJobOperator.partial(
        task_id="job", backend=LocalBackend(state_dir=STATE), deferrable=True, poll_interval=0.5
    ).expand(command=[job(10) + [f"fan{{i}}"] for i in range(4)])
"""


@dataclass
class Airflow:
    url: str
    env: dict[str, str]
    pids: Path

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def cli(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "airflow", *args], env=self.env, check=True, capture_output=True)

    def trigger(self, dag_id: str, run_id: str) -> None:
        deadline = time.monotonic() + 90
        while True:  # the DAG processor needs a moment to find a new file
            try:
                self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.api("POST", f"/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None})

    def ti_state(self, dag_id: str, run_id: str, suffix: str = "") -> Any:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/job{suffix}").get("state")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _free_ports(count: int) -> list[int]:
    """Ports that were free a moment ago, all different (the sockets stay open until all are picked)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory, batch_emulator: BatchWorld) -> Iterator[Airflow]:
    root = tmp_path_factory.mktemp("standalone")
    dags, pids, state = root / "dags", root / "pids", root / "state"
    for folder in (dags, pids):
        folder.mkdir()
    source = DAG_SOURCE.format(
        state=str(state),
        pids=str(pids),
        spot_queue=batch_emulator.setup.spot_queue,
        on_demand_queue=batch_emulator.setup.on_demand_queue,
    )
    (dags / "real_airflow_dags.py").write_text(textwrap.dedent(source))
    port, worker_log_port, trigger_log_port = _free_ports(3)
    env = dict(os.environ)
    env.update(connection_env(batch_emulator.emulator))  # the Batch DAG's jobs go to the emulator
    env.update(
        {
            "AIRFLOW_HOME": str(root / "home"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__PORT": str(port),
            # the scheduler's and the triggerer's log servers: free ports too (another run may be going on)
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log_port),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log_port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    log = (root / "standalone.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow", "standalone"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    af = Airflow(url=f"http://127.0.0.1:{port}", env=env, pids=pids)
    try:
        wait_for(lambda: "Airflow is ready" in (root / "standalone.log").read_text(), 180, "airflow standalone")
        wait_for(lambda: _answers(f"{af.url}/api/v2/monitor/health"), 120, "the API server")
        yield af
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):  # what standalone left of its components
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        from gpu_provider.backends.local import LocalBackend

        backend = LocalBackend(state_dir=str(state), grace_period=0.5)
        for handle in backend.list_jobs():
            backend.cancel(handle, "test teardown")


def _job_pid(af: Airflow, name: str) -> int:
    path = af.pids / f"1-{name}.pid"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), 120, f"the {name} job to start"))


@pytest.mark.parametrize("mode", ["deferred", "sync"])
def test_marking_a_task_failed_cancels_its_job(airflow: Airflow, mode: str) -> None:
    dag_id = f"kill_{mode}"
    airflow.trigger(dag_id, "run1")
    pid = _job_pid(airflow, mode)
    expected = "deferred" if mode == "deferred" else "running"
    wait_for(lambda: airflow.ti_state(dag_id, "run1") == expected, 60, f"the task to be {expected}")
    if mode == "deferred":
        # the triggerer picks new triggers up every few seconds; until then there is no trigger to kill
        # (that window is what the reaper is for), so wait until ours runs
        log_dir = Path(airflow.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}"
        wait_for(
            lambda: any("Waiting for local job" in f.read_text() for f in log_dir.rglob("*.log")),
            60,
            "the trigger to run in the triggerer",
        )
    assert pid_alive(pid)
    # the task's "GPU job" extra link points at the job (for the local backend: its log file)
    links = airflow.api("GET", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job/links")
    url = links["extra_links"]["GPU job"]
    assert url.startswith("file://") and url.endswith("/job.log"), links
    airflow.api("PATCH", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job", {"new_state": "failed"})
    # one poll interval (0.5 s) and the job's grace period (1 s), with room for a loaded machine
    wait_for(lambda: not pid_alive(pid), 20, "the job to be cancelled")


def test_deferred_tasks_succeed_through_the_real_triggerer(airflow: Airflow) -> None:
    airflow.trigger("fan_out", "run1")

    def all_done() -> bool:
        tis = airflow.api("GET", "/dags/fan_out/dagRuns/run1/taskInstances")["task_instances"]
        return len(tis) == 4 and all(ti["state"] in ("success", "failed") for ti in tis)

    wait_for(all_done, 180, "the mapped tasks to finish")
    tis = airflow.api("GET", "/dags/fan_out/dagRuns/run1/taskInstances")["task_instances"]
    assert sorted(ti["state"] for ti in tis) == ["success"] * 4
    assert sorted(p.name for p in airflow.pids.glob("1-fan*.pid")) == [f"1-fan{i}.pid" for i in range(4)]


def test_marking_a_deferred_batch_task_failed_terminates_its_job(airflow: Airflow, batch: BatchWorld) -> None:
    """The real triggerer reads the AWS connection from a thread, polls Batch, and on kill terminates."""
    dag_id = "kill_batch_deferred"
    airflow.trigger(dag_id, "run1")
    pid = _job_pid(airflow, "batch")
    wait_for(lambda: airflow.ti_state(dag_id, "run1") == "deferred", 60, "the task to be deferred")
    log_dir = Path(airflow.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}"
    wait_for(
        lambda: any("Waiting for batch job" in f.read_text() for f in log_dir.rglob("*.log")),
        60,
        "the trigger to run in the triggerer",
    )
    wait_for(lambda: batch.bodies("DescribeJobs"), 30, "the triggerer to poll Batch")
    links = airflow.api("GET", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job/links")["extra_links"]
    (submit,) = batch.bodies("SubmitJob")
    job_id = batch.bodies("DescribeJobs")[-1]["jobs"][0]  # the only job this test's triggerer waits on
    assert links["GPU job"].endswith(f"#jobs/detail/{job_id}"), links
    assert "logsV2:log-groups" in links["GPU job logs"], links
    assert pid_alive(pid)
    airflow.api("PATCH", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job", {"new_state": "failed"})
    (terminate,) = wait_for(lambda: batch.bodies("TerminateJob"), 30, "TerminateJob")
    assert terminate["jobId"] == job_id
    assert terminate["reason"] == (f"gpu-provider: Airflow task {dag_id}.job of run run1 was killed while deferred"), (
        terminate
    )
    assert submit["jobName"].startswith("gp-kill-batch-def-job-")
    wait_for(lambda: not pid_alive(pid), 20, "the job process to stop")
