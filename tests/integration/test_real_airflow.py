"""GpuJobOperator under a real Airflow: scheduler, DAG processor, triggerer and API server
(`airflow standalone`, LocalExecutor, SQLite), driven through the REST API as a person would.

What dag.test() cannot show: a deferred task waiting in the real triggerer, and a person marking a
running or a deferred task failed, which must cancel its job (worker on_kill / trigger on_kill).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.batch_world import BatchWorld, connection_env
from tests.harness import REPO, pid_alive
from tests.harness import wait_for as harness_wait_for

#: how often a wait here asks again: most ask the API server (REST), which spends a few ms of CPU on each call;
#: at the harness's 50 ms the API server was this module's biggest CPU consumer (24 of 120 CPU s in one run)
API_POLL_S = 0.5


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    """:func:`tests.harness.wait_for`, asking every :data:`API_POLL_S` seconds."""
    return harness_wait_for(predicate, timeout, what, interval=API_POLL_S)


#: the example pipeline's schedule, replaced in the copy the standalone Airflow loads
PIPELINE_SCHEDULE = 'schedule=CronDataIntervalTimetable("0 0 * * 1", timezone="UTC")'

#: the reaper DAGs' grace period (seconds): a job younger than this is never stopped
REAP_GRACE_S = 25.0

DAG_SOURCE = """
import os
import sys
from datetime import timedelta
from airflow.sdk import DAG
from gpu_provider.operators import GpuJobOperator, GpuReaperOperator
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

# the reaper's world: each scenario's task in its own DAG (one run each), on both landed backends
REAP_BACKENDS = {{
    "local": LocalBackend(state_dir=STATE, grace_period=1),
    "batch": BatchBackend(spot_queue={spot_queue!r}, on_demand_queue={on_demand_queue!r}),
}}
for where, backend in REAP_BACKENDS.items():
    for scenario, deferrable, retries in (
        ("failed-deferred", True, 0), ("deleted", True, 0), ("killed", False, 0),
        ("running", False, 0), ("deferred", True, 0), ("retry", False, 1),
    ):
        with DAG(dag_id=f"reap_{{where}}_{{scenario.replace('-', '_')}}", schedule=None, catchup=False) as reap_dag:
            GpuJobOperator(
                task_id="job",
                backend=backend,
                image="trainer:1",
                command=job(300) + [f"reap-{{where}}-{{scenario}}"],
                deferrable=deferrable,
                poll_interval=0.5,
                retries=retries,
                retry_delay=timedelta(hours=1),
            )
        globals()[reap_dag.dag_id] = reap_dag

for mode in ("dry", "live"):
    with DAG(dag_id=f"reaper_{{mode}}", schedule=None, catchup=False) as reaper_dag:
        GpuReaperOperator(
            task_id="reap",
            backends=list(REAP_BACKENDS.values()),
            dry_run=mode == "dry",
            grace_period=float(os.environ["REAP_GRACE_S"]),
        )
    globals()[reaper_dag.dag_id] = reaper_dag

with DAG(dag_id="fan_out", schedule=None, catchup=False) as fan_out:
    # jobs of 10 s: the executor has taken in the end of each task's first (deferring) run before the
    # trigger fires; with a 2 s job on a loaded machine Airflow 3.3's LocalExecutor can report that
    # stale end after the resumed run started, and the scheduler then fails the task (an Airflow race)
    GpuJobOperator.partial(
        task_id="job", backend=LocalBackend(state_dir=STATE), deferrable=True, poll_interval=0.5
    ).expand(command=[job(10) + [f"fan{{i}}"] for i in range(4)])

with DAG(dag_id="fan_out_batch", schedule=None, catchup=False) as fan_out_batch:
    # a sweep on a remote backend (the Batch emulator): each map index its own Batch job. Jobs of 20 s, for the
    # Airflow race above: under a loaded make test a task's deferring run took 15 s from its submit to its end
    # (the API server slow to record the deferral), its 10 s job had ended, the trigger fired, the scheduler
    # requeued the task, then took in that run's stale success and failed the task ("state mismatch")
    GpuJobOperator.partial(
        task_id="job",
        backend=BatchBackend(spot_queue={spot_queue!r}, on_demand_queue={on_demand_queue!r}),
        image="trainer:1",
        deferrable=True,
        poll_interval=0.5,
    ).expand(command=[job(20) + [f"bfan{{i}}"] for i in range(3)])
"""


@dataclass
class Airflow:
    url: str
    env: dict[str, str]
    pids: Path
    group: int = 0
    """The process group of `airflow standalone` and its components."""
    server_errors: list[str] = field(default_factory=list)
    """The 5xx answers `api` retried past (kept for a failure's message)."""

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST call. A 5xx is retried for up to a minute: standalone Airflow keeps its metadata in
        SQLite, and on a loaded machine a write can meet "database is locked" while the scheduler writes
        (CI saw a 500 on triggering a DAG run); the error's body is kept in the failure if it persists."""
        data = json.dumps(body).encode() if body is not None else None
        deadline = time.monotonic() + 60
        while True:
            request = urllib.request.Request(
                f"{self.url}/api/v2{path}", data=data, method=method, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError as err:
                if err.code < 500:
                    raise
                detail = err.read().decode(errors="replace")[:2000]
                if time.monotonic() > deadline:
                    raise AssertionError(f"{method} {path} kept answering {err.code}: {detail}") from err
                self.server_errors.append(f"{method} {path}: {err.code} {detail}")
                time.sleep(1)

    def ended_attempt(self, dag_id: str) -> dict[str, Any] | None:
        """The GPU page's ended attempt of ``dag_id`` (``/gpu/api/attempts``), once it has one."""
        with urllib.request.urlopen(f"{self.url}/gpu/api/attempts", timeout=30) as response:
            found = json.loads(response.read())["attempts"]
        return next((a for a in found if a["dag_id"] == dag_id and a["end"] is not None), None)

    def cli(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "airflow", *args], env=self.env, check=True, capture_output=True)

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any] | None = None) -> None:
        deadline = time.monotonic() + 90
        while True:  # the DAG processor needs a moment to find a new file
            try:
                self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        errors_before = len(self.server_errors)
        try:
            body = {"dag_run_id": run_id, "logical_date": None, **({"conf": conf} if conf else {})}
            self.api("POST", f"/dags/{dag_id}/dagRuns", body)
        except urllib.error.HTTPError as err:
            # a retried POST whose first try was committed before the 500 finds its own run: that is done
            if err.code != 409 or len(self.server_errors) == errors_before:
                raise

    def scheduler_loops(self, count: int = 3, timeout: float = 90) -> None:
        """Wait for ``count`` new scheduler heartbeats (one per loop at most): the loop that was going on
        when this was called is over. Airflow 3.3's scheduler dies if a DAG run it is scheduling is deleted
        under it (``ObjectDeletedError`` in ``_schedule_all_dag_runs``; seen on a loaded CI-like run)."""
        beats: list[str] = []

        def beat() -> bool:
            value = str(self.api("GET", "/monitor/health")["scheduler"]["latest_scheduler_heartbeat"])
            if not beats or beats[-1] != value:
                beats.append(value)
            return len(beats) > count

        wait_for(beat, timeout, f"{count} scheduler heartbeats")

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
    # the shipped example pipeline (unscheduled here: unpausing it starts no run of its own) and the DAG
    # scheduled on the asset its preprocess task publishes
    pipeline = (REPO / "dags" / "gpu_ml_pipeline.py").read_text()
    (dags / "gpu_ml_pipeline.py").write_text(pipeline.replace(PIPELINE_SCHEDULE, "schedule=None"))
    shutil.copy(REPO / "dags" / "gpu_retrain_on_new_data.py", dags)
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
            # a loaded CI machine answers the tasks' execution API calls slowly: wait, do not give up (a
            # supervisor whose task was SIGKILLed must get its UP_FOR_RETRY or FAILED through)
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10",
            # the reaper DAGs: jobs younger than this are never stopped
            "REAP_GRACE_S": str(REAP_GRACE_S),
            # the reaper asks this API server (no auth: every user is an admin here)
            "AIRFLOW_CONN_AIRFLOW_API": json.dumps({"conn_type": "http", "host": f"http://127.0.0.1:{port}"}),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            # the example pipeline's data, and its local jobs in the state folder the teardown cleans
            "GPU_PIPELINE_DATA_ROOT": (root / "pipeline_data").as_uri(),
            "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(state),
            # the GPU page prices local jobs ($0.01 per GPU-second) and reads the end of the Batch ones too
            "AIRFLOW__GPU_PROVIDER__LOCAL_GPU_HOUR_USD": "36",
            "AIRFLOW__GPU_PROVIDER__UI_BACKENDS": json.dumps(
                [
                    {"name": "local"},
                    {
                        "name": "batch",
                        "spot_queue": batch_emulator.setup.spot_queue,
                        "on_demand_queue": batch_emulator.setup.on_demand_queue,
                    },
                ]
            ),
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
    af = Airflow(url=f"http://127.0.0.1:{port}", env=env, pids=pids, group=proc.pid)
    try:
        wait_for(lambda: "Airflow is ready" in (root / "standalone.log").read_text(), 180, "airflow standalone")
        wait_for(lambda: _answers(f"{af.url}/api/v2/monitor/health"), 240, "the API server")
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
    # the local backend offers no "GPU job" link (its log is a file on the worker no browser can open);
    # the Batch test below checks a link that exists while its job runs
    links = airflow.api("GET", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job/links")
    assert links["extra_links"]["GPU job"] is None, links
    airflow.api("PATCH", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job", {"new_state": "failed"})
    # one poll interval (0.5 s) and the job's grace period (1 s), with room for a loaded machine
    wait_for(lambda: not pid_alive(pid), 20, "the job to be cancelled")
    # the GPU page: cancelled, who stopped it, its start, GPU-hours and cost from the job's own times (a
    # deferred task's record is not written by the triggerer: the page reads the end from the backend)
    ended = wait_for(lambda: airflow.ended_attempt(dag_id), 60, "the killed attempt on the GPU page")
    assert ended["end"] == "cancelled" and ended["state"] == "CANCELLED", ended
    assert f"Airflow task {dag_id}.job of run run1 was killed" in ended["reason"], ended
    assert ended["started_at"] and ended["gpu_hours"] > 0 and ended["cost_usd"] > 0, ended


def test_deferred_tasks_succeed_through_the_real_triggerer(airflow: Airflow) -> None:
    airflow.trigger("fan_out", "run1")

    def all_done() -> bool:
        tis = airflow.api("GET", "/dags/fan_out/dagRuns/run1/taskInstances")["task_instances"]
        return len(tis) == 4 and all(ti["state"] in ("success", "failed") for ti in tis)

    wait_for(all_done, 180, "the mapped tasks to finish")
    tis = airflow.api("GET", "/dags/fan_out/dagRuns/run1/taskInstances")["task_instances"]
    assert sorted(ti["state"] for ti in tis) == ["success"] * 4
    assert sorted(p.name for p in airflow.pids.glob("1-fan*.pid")) == [f"1-fan{i}.pid" for i in range(4)]


def test_a_mapped_task_on_batch_runs_each_map_index_as_its_own_job(airflow: Airflow, batch: BatchWorld) -> None:
    airflow.trigger("fan_out_batch", "run1")

    def all_done() -> bool:
        tis = airflow.api("GET", "/dags/fan_out_batch/dagRuns/run1/taskInstances")["task_instances"]
        return len(tis) == 3 and all(ti["state"] in ("success", "failed") for ti in tis)

    wait_for(all_done, 240, "the mapped Batch tasks to finish")
    tis = airflow.api("GET", "/dags/fan_out_batch/dagRuns/run1/taskInstances")["task_instances"]
    assert sorted(ti["state"] for ti in tis) == ["success"] * 3
    submits = [b for b in batch.bodies("SubmitJob") if b["jobName"].startswith("gp-fan-out-batch-job-")]
    assert len({b["jobName"] for b in submits}) == len(submits) == 3, [b["jobName"] for b in submits]
    assert sorted(b["tags"]["gpu-provider/map-index"] for b in submits) == ["0", "1", "2"]
    assert sorted(p.name for p in airflow.pids.glob("1-bfan*.pid")) == [f"1-bfan{i}.pid" for i in range(3)]


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
    ended = wait_for(lambda: airflow.ended_attempt(dag_id), 60, "the killed attempt on the GPU page")
    assert ended["end"] == "cancelled" and "was killed while deferred" in ended["reason"], ended
    assert ended["started_at"] and ended["gpu_hours"] > 0 and ended["cost_usd"] > 0, ended


def test_a_run_without_a_logical_date_publishes_data_and_an_asset_triggered_run_retrains(airflow: Airflow) -> None:
    """Through the REST API as the UI does: the example pipeline triggered with ``logical_date: null``
    succeeds, its preprocess task's asset event makes the scheduler create an asset-triggered run of
    gpu_retrain_on_new_data (no logical date either), which retrains on that very dataset."""
    assert PIPELINE_SCHEDULE in (REPO / "dags" / "gpu_ml_pipeline.py").read_text()
    airflow.api("POST", "/pools", {"name": "gpu_research", "slots": 8, "include_deferred": True})
    retrain_runs = "/dags/gpu_retrain_on_new_data/dagRuns"
    wait_for(lambda: _unpaused(airflow, "gpu_retrain_on_new_data"), 90, "the retraining DAG to be parsed")
    airflow.trigger("gpu_ml_pipeline", "nodate", conf={"epochs": 2, "step_delay": 0.0})
    run = "/dags/gpu_ml_pipeline/dagRuns/nodate"
    wait_for(lambda: airflow.api("GET", run)["state"] in ("success", "failed"), 420, "the pipeline run to end")
    found = airflow.api("GET", run)
    states = {t["task_id"]: t["state"] for t in airflow.api("GET", f"{run}/taskInstances")["task_instances"]}
    assert found["state"] == "success" and found["logical_date"] is None, (found, states)
    dataset = airflow.api("GET", f"{run}/taskInstances/preprocess/xcomEntries/return_value")["value"]
    dataset = json.loads(dataset) if isinstance(dataset, str) else dataset

    def retrain_ended() -> Any:
        runs = airflow.api("GET", retrain_runs)["dag_runs"]
        return [r for r in runs if r["state"] in ("success", "failed")]

    (retrain,) = wait_for(retrain_ended, 300, "the asset-triggered retraining run to end")
    assert retrain["run_type"] == "asset_triggered" and retrain["logical_date"] is None, retrain
    assert retrain["state"] == "success", retrain
    picked = airflow.api(
        "GET", f"{retrain_runs}/{retrain['dag_run_id']}/taskInstances/pick_dataset/xcomEntries/return_value"
    )
    picked = json.loads(picked["value"]) if isinstance(picked["value"], str) else picked["value"]
    assert picked["dataset"] == dataset["output_uri"]


def _unpaused(af: Airflow, dag_id: str) -> bool:
    try:
        af.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    except urllib.error.HTTPError:
        return False
    return True


# --- the reaper ---------------------------------------------------------------------------------

REAP_BACKENDS = ("local", "batch")
#: scenarios whose job no live task waits for (the reaper stops them), and those it must leave alone
ORPHANS = ("failed-deferred", "deleted", "killed")
LIVE = ("running", "deferred", "retry")
#: (backend, scenario): orphans on each landed backend; the live states on local, and deferred on Batch too
SCENARIOS = (
    [(where, s) for where in REAP_BACKENDS for s in ORPHANS] + [("local", s) for s in LIVE] + [("batch", "deferred")]
)


def _dag(where: str, scenario: str) -> str:
    return f"reap_{where}_{scenario.replace('-', '_')}"


@contextlib.contextmanager
def _triggerer_paused(af: Airflow) -> Iterator[None]:
    """SIGSTOP the triggerer's processes (and SIGCONT them after): deferred tasks stay deferred with
    no trigger running, which is the window between deferral and a triggerer taking the trigger up."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != af.group:
                continue
            if b"triggerer" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    assert pids, "no triggerer process found under airflow standalone"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _wait_state(af: Airflow, dag_id: str, state: str, timeout: float = 120) -> None:
    seen: list[str | None] = []

    def reached() -> bool:
        seen.append(af.ti_state(dag_id, "run1"))
        return seen[-1] == state

    try:
        wait_for(reached, timeout, f"{dag_id}'s task to be {state}")
    except AssertionError as err:
        raise AssertionError(f"{err}; its last state: {seen[-1] if seen else None}") from None


def _mark_failed(af: Airflow, dag_id: str) -> None:
    af.api("PATCH", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job", {"new_state": "failed"})


def _reaper_report(af: Airflow, dag_id: str, run_id: str) -> dict[str, Any]:
    af.trigger(dag_id, run_id)
    ti = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/reap"
    wait_for(lambda: af.api("GET", ti).get("state") in ("success", "failed"), 120, f"{dag_id} to finish")
    assert af.api("GET", ti)["state"] == "success"
    entry = af.api("GET", f"{ti}/xcomEntries/return_value")
    value = entry["value"]
    return dict(json.loads(value) if isinstance(value, str) else value)


def test_the_reaper_stops_orphaned_jobs_and_leaves_live_and_new_ones_alone(airflow: Airflow, batch: BatchWorld) -> None:
    """Orphans on each landed backend: a task marked failed while deferred before a triggerer took its
    trigger, a worker SIGKILLed with no retries left, a deleted DAG run. Left alone: running, deferred,
    up for retry, and a job submitted a moment ago. A dry run reports the same set and stops nothing."""
    from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, TaskKey
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.job import GpuResources

    pids: dict[str, int] = {}
    with _triggerer_paused(airflow):
        # a few at a time: a dozen tasks starting at once can time out against a loaded API server
        for start in range(0, len(SCENARIOS), 3):
            wave = SCENARIOS[start : start + 3]
            for where, scenario in wave:
                airflow.trigger(_dag(where, scenario), "run1")
            for where, scenario in wave:
                pids[f"{where}-{scenario}"] = _job_pid(airflow, f"reap-{where}-{scenario}")
        for where, scenario in SCENARIOS:
            state = "deferred" if scenario in ("failed-deferred", "deleted", "deferred") else "running"
            _wait_state(airflow, _dag(where, scenario), state)
        for where in REAP_BACKENDS:
            # the orphans: marked failed while deferred (no triggerer has the trigger), DAG run deleted,
            # the task's process SIGKILLed with no retries left (and, for "retry", with one left)
            _mark_failed(airflow, _dag(where, "failed-deferred"))
            # Airflow deletes only a run that is not running: a person fails it first, then deletes it
            deleted_run = f"/dags/{_dag(where, 'deleted')}/dagRuns/run1"
            airflow.api("PATCH", deleted_run, {"state": "failed"})
            airflow.scheduler_loops()  # no scheduler loop holds the run when it is deleted
            airflow.api("DELETE", deleted_run)
            for scenario, after in (("killed", "failed"), ("retry", "up_for_retry"))[: 2 if where == "local" else 1]:
                dag_id = _dag(where, scenario)
                task_pid = airflow.api("GET", f"/dags/{dag_id}/dagRuns/run1/taskInstances/job")["pid"]
                os.kill(int(task_pid), signal.SIGKILL)
                _wait_state(airflow, dag_id, after)
        assert all(pid_alive(pid) for pid in pids.values()), "every job still runs before the reaper"

        # every job is older than the grace period; then one more job is submitted a moment ago
        local = LocalBackend(state_dir=str(Path(airflow.pids).parent / "state"))
        batch_created = [j["createdAt"] / 1000 for j in batch.active_jobs() if j["jobName"].startswith("gp-reap-")]
        youngest = max([o.handle.submitted_at for o in local.list_owned()] + batch_created)
        wait_for(lambda: time.time() - youngest > REAP_GRACE_S, REAP_GRACE_S + 30, "the jobs to pass the grace")

        def fresh_job(run_id: str) -> JobHandle:
            """A job of a task instance Airflow does not know (it would be reaped), submitted just now."""
            return local.submit(
                JobRequest(
                    identity=JobIdentity(TaskKey("reap_new", "job", run_id), 1, 1, "on-demand"),
                    command=(sys.executable, "-c", "import time; time.sleep(120)"),
                    env={},
                    resources=GpuResources(gpus=1),
                    capacity="on-demand",
                )
            )

        fresh = fresh_job("manual__dry")
        dry = _reaper_report(airflow, "reaper_dry", "run1")
        assert dry["dry_run"] is True and dry["stopped"] == 0
        assert all(pid_alive(pid) for pid in pids.values()), "a dry run stopped a job"
        assert local.poll([fresh])[fresh.job_id].state.active
        local.cancel(fresh, "the dry run is over")  # by the live run it would be older than the grace period
        fresh = fresh_job("manual__live")
        live = _reaper_report(airflow, "reaper_live", "run1")
    assert live["dry_run"] is False

    def jobs(*scenarios: str) -> set[str]:
        return {f"reap-{where}-{s}" for where, s in SCENARIOS if s in scenarios}

    # the job names carry the DAG ids: map them back to scenarios
    def scenarios_of(report: dict[str, Any], key: str) -> set[str]:
        out = set()
        for verdict in report[key]:
            task = verdict["task"] or {}
            dag_id = task.get("dag_id", "")
            for where in REAP_BACKENDS:
                for scenario in ORPHANS + LIVE:
                    if dag_id == _dag(where, scenario) and (where, scenario) in SCENARIOS:
                        out.add(f"reap-{where}-{scenario}")
            if dag_id == "reap_new":
                out.add("new")
        return out

    assert scenarios_of(dry, "to_stop") == scenarios_of(live, "to_stop") == jobs(*ORPHANS), (dry, live)
    assert {v["job_id"] for v in dry["to_stop"]} == {v["job_id"] for v in live["to_stop"]}
    assert scenarios_of(dry, "kept") >= jobs(*LIVE) | {"new"}, dry
    assert scenarios_of(live, "kept") >= jobs(*LIVE) | {"new"}, live
    assert live["stopped"] == len(jobs(*ORPHANS)) and not live["errors"], live
    whys = {scenario: v["why"] for v in live["to_stop"] for scenario in scenarios_of({"x": [v]}, "x")}
    assert "is failed" in whys["reap-local-failed-deferred"] and "is failed" in whys["reap-batch-killed"]
    # believed only on the real API server's own not-found, for the task instance and again for its DAG run
    assert "does not exist (its DAG run was deleted: Airflow answered not found" in whys["reap-batch-deleted"]
    assert live["airflow_version"] and live["airflow_version"].startswith("3."), live
    kept = {scenario: v["why"] for v in live["kept"] for scenario in scenarios_of({"x": [v]}, "x")}
    assert "is deferred" in kept["reap-batch-deferred"] and "is up_for_retry" in kept["reap-local-retry"]
    assert "is running" in kept["reap-local-running"] and "within the grace period" in kept["new"]
    # the cost the reaper reports: Batch jobs at the default instance's price (g5.xlarge, $1.006/h in
    # us-east-1), local jobs at [gpu_provider] local_gpu_hour_usd (36 in this deployment, 1 GPU each)
    rates = {where: {v["usd_per_hour"] for v in live["to_stop"] if v["backend"] == where} for where in REAP_BACKENDS}
    assert rates == {"batch": {1.006}, "local": {36.0}}, live["to_stop"]
    stopped = [v["backend"] for v in live["to_stop"]]
    expected = stopped.count("batch") * 1.006 + stopped.count("local") * 36.0
    assert stopped.count("batch") == 3 and live["usd_per_hour"] == pytest.approx(expected), live

    for where in REAP_BACKENDS:
        for scenario in ORPHANS:
            pid = pids[f"{where}-{scenario}"]
            wait_for(lambda p=pid: not pid_alive(p), 30, f"the {where} {scenario} job to be stopped")
    for where, scenario in SCENARIOS:
        if scenario in LIVE:
            assert pid_alive(pids[f"{where}-{scenario}"]), f"the reaper stopped the live {where} {scenario} job"
    assert local.poll([fresh])[fresh.job_id].state.active, "the reaper stopped a job submitted a moment ago"
    local.cancel(fresh, "test done")
    # what the Batch emulator was told: TerminateJob for the three orphans, with the reaper's reason
    reasons = [b["reason"] for b in batch.bodies("TerminateJob")]
    assert len([r for r in reasons if "the GPU reaper" in r]) == 3, reasons
    for where, scenario in SCENARIOS:  # leave no live task behind for the tests after this one
        if scenario in LIVE:
            with contextlib.suppress(urllib.error.HTTPError):
                _mark_failed(airflow, _dag(where, scenario))
