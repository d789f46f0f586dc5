"""Team quotas and priorities under a real Airflow 3 scheduler, on PostgreSQL.

One Airflow for the module: a temporary PostgreSQL cluster (Debian's packages, installed through
tests/system_packages.py when missing; initdb and pg_ctl as the `postgres` user when the tests run as
root) and `airflow standalone` on it (scheduler, DAG processor, triggerer and API server, LocalExecutor),
with fast heartbeats. GPU tasks run on the local backend; the DAGs are tests/integration/accept_dags.py.
The team pools come from a quota file through `gpu-provider pools sync`, as a deployment gets them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO
from tests.integration.test_real_airflow import _answers, _free_ports, wait_for
from tests.system_packages import ensure

HERE = Path(__file__).parent
PENALTY = 1000
JOB_S = 2.0
DEFERRED_JOB_S = 10.0

QUOTAS = """
teams:
  alpha: {gpus: 4}
  beta: {gpus: 2}
  prio: {gpus: 1}
  bf: {gpus: 1}
  params: {gpus: 1, max_priority: 50}
"""

JOB = """
import json, os, sys, time
out, name, gate, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
start = time.time()
with open(os.path.join(out, name + ".start"), "w") as f:
    f.write(str(start))
while gate != "-" and not os.path.exists(gate):
    time.sleep(0.1)
time.sleep(seconds)
record = {"start": start, "end": time.time(), "args": sys.argv[5:], "attempt": os.environ.get("GPU_PROVIDER_ATTEMPT")}
with open(os.path.join(out, name + ".json.tmp"), "w") as f:
    json.dump(record, f)
os.replace(os.path.join(out, name + ".json.tmp"), os.path.join(out, name + ".json"))
"""

GHOST_TEAM_DAG = """
from airflow.sdk import DAG
from gpu_provider.operators import GpuJobOperator

with DAG(dag_id="ghost_team", schedule=None) as dag:
    GpuJobOperator(task_id="train", command=["true"], team="ghost")
"""


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        pytest.fail("the postgresql package is installed but no /usr/lib/postgresql/*/bin/initdb exists")
    return found[-1].parent


@dataclass
class Postgres:
    port: int
    data: Path
    bin: Path
    as_user: list[str]
    _connections: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/airflow"

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """One query, on this thread's connection (autocommit: each query sees what is committed now). A
        connection per query made PostgreSQL start a backend process for each of the waits' and the sampler's
        many reads; the connections end with the cluster (stopped in ``immediate`` mode)."""
        import psycopg2

        connection = getattr(self._connections, "connection", None)
        if connection is None or connection.closed:
            connection = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="airflow")
            connection.autocommit = True
            self._connections.connection = connection
        with connection.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())


@contextlib.contextmanager
def postgres_cluster() -> Iterator[Postgres]:
    """A PostgreSQL cluster of its own on a free port, removed afterwards (also on failure)."""
    reason = ensure(["postgresql"])
    if reason:
        pytest.skip(reason)
    pg_bin = _pg_bin()
    root = Path(tempfile.mkdtemp(prefix="gpu-provider-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster runs as the package's postgres user
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    data = root / "data"
    (port,) = _free_ports(1)
    pg = Postgres(port=port, data=data, bin=pg_bin, as_user=as_user)
    started = False
    try:
        subprocess.run(
            [*as_user, str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(
            [
                *as_user,
                str(pg_bin / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "pg.log"),
                "-o",
                options,
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        started = True
        subprocess.run(
            [*as_user, str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "airflow"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield pg
    finally:
        if started:
            subprocess.run(
                [*as_user, str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Airflow:
    url: str
    env: dict[str, str]
    pg: Postgres
    out: Path
    gates: Path
    quota_file: Path
    root: Path

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=90) as response:
            return json.loads(response.read() or b"null")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args], env=self.env, check=check, capture_output=True, text=True
        )

    def gpu_provider(self, *args: str) -> subprocess.CompletedProcess[str]:
        code = "import sys; from gpu_provider.cli import main; sys.exit(main(sys.argv[1:]))"
        return subprocess.run(
            [sys.executable, "-c", code, *args], env=self.env, capture_output=True, text=True, timeout=120
        )

    def unpause(self, dag_id: str) -> None:
        def done() -> bool:
            try:
                self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
                return True
            except urllib.error.HTTPError:  # the DAG processor has not serialized it yet
                errors = self.api("GET", "/importErrors?limit=100")["import_errors"]
                broken = [e["stack_trace"] for e in errors if e["filename"].endswith("accept_dags.py")]
                assert not broken, broken[0]
                time.sleep(1)
                return False

        wait_for(done, 120, f"DAG {dag_id} to be parsed")

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any] | None = None) -> None:
        self.unpause(dag_id)
        body: dict[str, Any] = {"dag_run_id": run_id, "logical_date": None}
        if conf is not None:
            body["conf"] = conf
        self.api("POST", f"/dags/{dag_id}/dagRuns", body)

    def tis(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's task instances, read from the metadata DB (polling the API would load the API server,
        which the tasks' own execution API calls need)."""
        rows = self.pg.query(
            "SELECT run_id, task_id, state, priority_weight, pool FROM task_instance WHERE dag_id = %s", dag_id
        )
        keys = ("dag_run_id", "task_id", "state", "priority_weight", "pool")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def runs(self, dag_id: str) -> dict[str, dict[str, Any]]:
        rows = self.pg.query(
            "SELECT run_id, run_type, data_interval_start, data_interval_end FROM dag_run WHERE dag_id = %s", dag_id
        )
        return {r[0]: {"run_type": r[1], "data_interval_start": r[2], "data_interval_end": r[3]} for r in rows}

    def wait_done(self, dag_id: str, count: int, timeout: float = 120) -> list[dict[str, Any]]:
        def done() -> list[dict[str, Any]] | None:
            tis = self.tis(dag_id)
            finished = [t for t in tis if t["state"] in ("success", "failed", "upstream_failed")]
            return tis if len(finished) >= count else None

        tis: list[dict[str, Any]] = wait_for(done, timeout, f"{count} task instances of {dag_id} to finish")
        return tis

    def logs(self, dag_id: str) -> str:
        """The task logs of a DAG (for a failure's message)."""
        folder = Path(self.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}"
        return "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted(folder.rglob("*.log")))

    def record(self, name: str) -> dict[str, Any]:
        return dict(json.loads((self.out / f"{name}.json").read_text()))

    def records(self, prefix: str) -> dict[str, dict[str, Any]]:
        return {p.name[: -len(".json")]: json.loads(p.read_text()) for p in self.out.glob(f"{prefix}*.json")}


@pytest.fixture(scope="module")
def airflow() -> Iterator[Airflow]:
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(postgres_cluster())
        root = Path(tempfile.mkdtemp(prefix="gpu-provider-accept-"))
        if not os.environ.get("GPU_ACCEPT_KEEP"):  # keep its logs to look at a failure
            stack.callback(shutil.rmtree, root, True)
        dags, out, gates, state = root / "dags", root / "out", root / "gates", root / "state"
        for folder in (dags, out, gates):
            folder.mkdir()
        (root / "job.py").write_text(JOB)
        quota_file = root / "quotas.yaml"
        quota_file.write_text(QUOTAS)
        config = {
            "state": str(state),
            "job": str(root / "job.py"),
            "out": str(out),
            "gates": str(gates),
            "job_s": JOB_S,
            "deferred_job_s": DEFERRED_JOB_S,
        }
        (root / "config.json").write_text(json.dumps(config))
        shutil.copy(HERE / "accept_dags.py", dags / "accept_dags.py")
        shutil.copy(REPO / "dags" / "gpu_pool_sync.py", dags / "gpu_pool_sync.py")
        (dags / "ghost_team.py").write_text(GHOST_TEAM_DAG)
        port, worker_log_port, trigger_log_port = _free_ports(3)
        env = dict(os.environ)
        env.update(
            {
                "AIRFLOW_HOME": str(root / "home"),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg.url,
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "32",
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_log_port),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_log_port),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "30",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
                # a loaded CI machine answers the tasks' execution API calls slowly: wait, do not fail them
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
                "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10",
                "AIRFLOW__GPU_PROVIDER__QUOTA_FILE": str(quota_file),
                "AIRFLOW__GPU_PROVIDER__BACKFILL_PRIORITY_PENALTY": str(PENALTY),
                "AIRFLOW_CONN_AIRFLOW_API": json.dumps({"conn_type": "http", "host": f"http://127.0.0.1:{port}"}),
                "GPU_ACCEPT_CONFIG": str(root / "config.json"),
                "GPU_POOL_SYNC_EVERY_MIN": "100000",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            }
        )
        af = Airflow(
            url=f"http://127.0.0.1:{port}", env=env, pg=pg, out=out, gates=gates, quota_file=quota_file, root=root
        )
        log = stack.enter_context((root / "standalone.log").open("w"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", "standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def stop() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # what standalone left of its components
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            from gpu_provider.backends.local import LocalBackend

            backend = LocalBackend(state_dir=str(state), grace_period=0.5)
            for handle in backend.list_jobs():
                backend.cancel(handle, "test teardown")

        stack.callback(stop)
        try:
            wait_for(lambda: _answers(f"{af.url}/api/v2/monitor/health"), 240, "the API server")
        except AssertionError:
            raise AssertionError((root / "standalone.log").read_text()[-5000:]) from None
        # the team pools, as a deployment gets them
        done = af.gpu_provider("pools", "sync", "--api-url", af.url, "--quota-file", str(quota_file))
        assert done.returncode == 0, done.stdout + done.stderr
        yield af


def _max_overlap(intervals: list[tuple[float, float, int]]) -> int:
    """The most GPUs held at once by jobs that ran over `intervals` (start, end, GPUs)."""
    events = sorted([(s, g) for s, _, g in intervals] + [(e, -g) for _, e, g in intervals], key=lambda x: (x[0], x[1]))
    most = held = 0
    for _, delta in events:
        held += delta
        most = max(most, held)
    return most


def test_three_runs_wanting_12_gpus_never_hold_more_than_the_teams_4_deferred_included(airflow: Airflow) -> None:
    samples: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def sample() -> None:  # the scheduler's own view: slots of the pool's queued, running and deferred tasks
        while not stop.is_set():
            (row,) = airflow.pg.query(
                "SELECT coalesce(sum(pool_slots) FILTER (WHERE state IN ('queued', 'running', 'deferred')), 0),"
                " count(*) FILTER (WHERE state = 'deferred'), count(*) FILTER (WHERE state = 'scheduled')"
                " FROM task_instance WHERE pool = 'gpu_alpha'"
            )
            samples.append((int(row[0]), int(row[1]), int(row[2])))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for i in range(3):
            airflow.trigger("cap_alpha", f"run{i}")
        airflow.trigger("cap_beta", "run0")
        alpha = airflow.wait_done("cap_alpha", 6, timeout=240)
        beta = airflow.wait_done("cap_beta", 1)
    finally:
        stop.set()
        sampler.join(timeout=10)
    assert sorted(t["state"] for t in alpha) == ["success"] * 6, airflow.logs("cap_alpha")
    assert beta[0]["state"] == "success", airflow.logs("cap_beta")
    held = max(s[0] for s in samples)
    assert held == 4, f"the pool never filled or overflowed: the most slots held at once was {held}"
    assert any(s[1] > 0 and s[0] == 4 for s in samples), "no sample counted a deferred task in the full pool"
    assert any(s[2] > 0 for s in samples), "no task ever waited for the pool"
    # the jobs' own clocks: never more than 4 of team alpha's GPUs busy at once
    jobs = airflow.records("alpha")
    assert len(jobs) == 6
    assert _max_overlap([(j["start"], j["end"], 2) for j in jobs.values()]) <= 4
    # team beta ran meanwhile: its job started before team alpha's last job did
    (beta_job,) = airflow.records("beta").values()
    assert beta_job["start"] < max(j["start"] for j in jobs.values())


def test_with_the_pool_full_a_high_priority_task_gets_the_next_slot_before_earlier_low_ones(airflow: Airflow) -> None:
    airflow.trigger("prio_hog", "hog")
    wait_for(lambda: list(airflow.out.glob("priohog-*.start")), 120, "the hog's job to hold team prio's GPU")
    for i in range(3):
        airflow.trigger("prio_low", f"low{i}")
    wait_for(lambda: len([t for t in airflow.tis("prio_low") if t["state"] == "scheduled"]) == 3, 90, "3 low tasks")
    airflow.trigger("prio_high", "high")
    wait_for(lambda: [t for t in airflow.tis("prio_high") if t["state"] == "scheduled"], 90, "the high task to wait")
    (airflow.gates / "prio").touch()
    lows = airflow.wait_done("prio_low", 3, timeout=180)
    (high,) = airflow.wait_done("prio_high", 1)
    assert high["state"] == "success" and {t["state"] for t in lows} == {"success"}
    assert high["priority_weight"] == 10 and {t["priority_weight"] for t in lows} == {1}
    high_start = airflow.record("high-high")["start"]
    low_starts = sorted(airflow.record(f"low-low{i}")["start"] for i in range(3))
    assert high_start < low_starts[0], (high_start, low_starts)


def _sunday_before(moment: datetime) -> datetime:
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=(day.weekday() + 1) % 7)


def test_a_backfill_runs_at_the_lower_priority_behind_the_scheduled_run_each_with_its_own_interval(
    airflow: Airflow,
) -> None:
    airflow.trigger("bf_hog", "hog")
    wait_for(lambda: list(airflow.out.glob("bfhog-*.start")), 120, "the hog's job to hold team bf's GPU")
    sunday = _sunday_before(datetime.now(timezone.utc))
    weeks = [sunday - timedelta(weeks=n) for n in (4, 3, 2)]  # the scheduled run has the week before `sunday`
    airflow.unpause("weekly")  # the scheduler creates the latest week's scheduled run (catchup=False)
    done = airflow.cli(
        "backfill",
        "create",
        "--dag-id",
        "weekly",
        "--from-date",
        weeks[0].isoformat(),
        "--to-date",
        weeks[-1].isoformat(),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    def waiting() -> list[dict[str, Any]] | None:
        tis = [t for t in airflow.tis("weekly") if t["state"] == "scheduled"]
        return tis if len(tis) == 4 else None

    # 240 s: beside two CPU-bound processes the scheduler once took over 120 s to have all four waiting
    wait_for(waiting, 240, "the scheduled run and 3 backfill runs to wait for team bf's GPU")
    (airflow.gates / "bf").touch()
    tis = airflow.wait_done("weekly", 4, timeout=180)
    runs = airflow.runs("weekly")
    assert {t["state"] for t in tis} == {"success"}
    kinds = {t["dag_run_id"]: runs[t["dag_run_id"]]["run_type"] for t in tis}
    assert sorted(kinds.values()) == ["backfill", "backfill", "backfill", "scheduled"], kinds
    weights = {kinds[t["dag_run_id"]]: t["priority_weight"] for t in tis}
    assert weights == {"scheduled": 5, "backfill": 5 - PENALTY}
    starts = {}
    for run_id, run in runs.items():
        record = airflow.record(f"weekly-{run_id.replace(':', '-').replace('+', '_')}")
        begin, end = run["data_interval_start"].date().isoformat(), run["data_interval_end"].date().isoformat()
        assert record["args"] == [f"s3://features/{begin}/", f"s3://models/{end}/"], (run_id, record)
        starts[run_id] = record["start"]
    backfilled = sorted(runs[r]["data_interval_start"].date().isoformat() for r in runs if kinds.get(r) == "backfill")
    assert backfilled == [w.date().isoformat() for w in weeks]
    (scheduled,) = [r for r in runs if kinds[r] == "scheduled"]
    assert starts[scheduled] < min(s for r, s in starts.items() if r != scheduled), starts


def test_a_run_triggered_through_the_rest_api_with_json_conf_runs_with_those_params(airflow: Airflow) -> None:
    airflow.trigger("with_params", "form", conf={"epochs": 3, "dataset": "big"})
    with pytest.raises(urllib.error.HTTPError) as refused:  # the form's values are untrusted: checked first
        airflow.api("POST", "/dags/with_params/dagRuns", {"logical_date": None, "conf": {"epochs": "3; rm -rf /"}})
    assert refused.value.code == 400, refused.value.read()
    (ti,) = airflow.wait_done("with_params", 1)
    assert ti["state"] == "success"
    assert airflow.record("params-form")["args"] == ["3", "big"]


def test_pools_sync_against_the_running_airflow(airflow: Airflow) -> None:
    def pools() -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in airflow.api("GET", "/pools?limit=100")["pools"]}

    # by hand: a team pool with drift, a pool of no team; a task waiting for a pool nobody made
    airflow.api("POST", "/pools", {"name": "gpu_delta", "slots": 1, "include_deferred": False})
    airflow.api("POST", "/pools", {"name": "gpu_legacy", "slots": 3, "include_deferred": True})
    airflow.trigger("ghost_pool", "stuck")
    wait_for(lambda: [t for t in airflow.tis("ghost_pool") if t["state"] == "scheduled"], 90, "the ghost task")
    quota_file = airflow.root / "quotas-more.yaml"
    quota_file.write_text(QUOTAS + "  gamma: {gpus: 2}\n  delta: {gpus: 3}\n")
    before = pools()
    args = ("pools", "sync", "--api-url", airflow.url, "--quota-file", str(quota_file))

    dry = airflow.gpu_provider(*args, "--dry-run")
    assert dry.returncode == 3, dry.stdout + dry.stderr  # a task waits for a missing pool
    assert pools() == before, "a dry run changed a pool"
    assert "gpu_gamma: would create with 2 slots, include_deferred=True" in dry.stdout
    assert "gpu_delta: drift (slots: 1 -> 3; include_deferred: False -> True); would update" in dry.stdout
    assert "gpu_legacy: no team in the quota file; kept" in dry.stdout
    assert "task ghost_pool.wait of run stuck waits for pool gpu_ghost, which does not exist" in dry.stdout
    assert "gpu_alpha: in sync (4 slots, include_deferred=True)" in dry.stdout

    real = airflow.gpu_provider(*args, "--fail-stuck", "--json")
    assert real.returncode == 0, real.stdout + real.stderr
    report = json.loads(real.stdout)
    actions = {c["pool"]: c["action"] for c in report["changes"]}
    assert actions["gpu_gamma"] == "create" and actions["gpu_delta"] == "update"
    assert actions["gpu_legacy"] == "unmanaged" and actions["gpu_alpha"] == "ok"
    after = pools()
    assert (after["gpu_gamma"]["slots"], after["gpu_gamma"]["include_deferred"]) == (2, True)
    assert (after["gpu_delta"]["slots"], after["gpu_delta"]["include_deferred"]) == (3, True)
    assert after["gpu_legacy"]["slots"] == 3, "the sync changed a pool of no team"
    assert set(before) <= set(after), "the sync deleted a pool"
    ghost = airflow.api("GET", "/dags/ghost_pool/dagRuns/stuck/taskInstances/wait")
    assert ghost["state"] == "failed" and "pool gpu_ghost, which does not exist" in ghost["note"], ghost
    again = airflow.gpu_provider(*args)
    assert again.returncode == 0 and "would" not in again.stdout and "drift" not in again.stdout, again.stdout

    # a GPU task of a team not in the quota file: the DAG does not load, and the UI says why
    def import_error() -> str | None:
        errors = airflow.api("GET", "/importErrors?limit=100")["import_errors"]
        return next((e["stack_trace"] for e in errors if e["filename"].endswith("ghost_team.py")), None)

    trace = wait_for(import_error, 90, "the ghost team's import error")
    assert "team='ghost' is not in the quota file" in trace

    # the maintenance DAG, dry run: the same report in XCom, nothing changed
    airflow.trigger("gpu_pool_sync", "manual_dry", conf={"dry_run": True})
    ti = "/dags/gpu_pool_sync/dagRuns/manual_dry/taskInstances/sync"

    def dry_run_done() -> dict[str, Any] | None:  # unpausing also starts a scheduled run: ours is manual_dry
        ours = [t for t in airflow.tis("gpu_pool_sync") if t["dag_run_id"] == "manual_dry"]
        return ours[0] if ours and ours[0]["state"] in ("success", "failed") else None

    sync = wait_for(dry_run_done, 120, "the sync DAG's dry run")
    assert sync["state"] == "success", airflow.logs("gpu_pool_sync")
    value = airflow.api("GET", f"{ti}/xcomEntries/return_value")["value"]
    dag_report = json.loads(value) if isinstance(value, str) else value
    assert dag_report["dry_run"] is True
    assert {c["pool"] for c in dag_report["changes"]} >= {"gpu_alpha", "gpu_gamma", "gpu_legacy"}
