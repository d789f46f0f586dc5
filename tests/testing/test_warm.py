"""The warm server behind ``DagRunner``: a forked run is a process of its own, with the run's environment
and nothing of another run's; killing it is a worker crash; the server outlives a killed run, and nothing
outlives the server. Runs start fresh when it is turned off."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_provider.testing import warm
from gpu_provider.testing.dagrun import pid_alive, wait_for
from tests.harness import Harness

PROBE_DAG = """
import gc
import os
from airflow.sdk import DAG, Variable
from airflow.providers.standard.operators.python import PythonOperator

def probe():
    return {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "ppid": os.getppid(),
        "token": Variable.get("token"),
        "env_token": os.environ.get("AIRFLOW_VAR_TOKEN"),
        "other": os.environ.get("OTHER_RUN_ONLY"),
        "frozen": gc.get_freeze_count(),
    }

with DAG(dag_id="probe", schedule=None) as dag:
    PythonOperator(task_id="probe", python_callable=probe)
"""

SLEEP_DAG = """
import time
from pathlib import Path
from airflow.sdk import DAG
from airflow.providers.standard.operators.python import PythonOperator

def sleep(marker):
    Path(marker).write_text("running")
    time.sleep(600)

with DAG(dag_id="sleeper", schedule=None) as dag:
    PythonOperator(task_id="sleep", python_callable=sleep, op_args=[{marker!r}])
"""


def _dag(harness: Harness, name: str, source: str) -> Path:
    path = harness.home / "dags" / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_a_warm_run_is_its_own_process_with_its_own_environment(harness: Harness) -> None:
    dag = _dag(harness, "probe", PROBE_DAG)
    first = harness.run(dag, "probe", extra_env={"AIRFLOW_VAR_TOKEN": "tok-first-7f3a", "OTHER_RUN_ONLY": "x"})
    proc = harness.started[-1]
    assert isinstance(proc, warm.WarmChild), "DagRunner forks from the warm server by default"
    seen = first.task("probe")["xcom"]
    assert first.task("probe")["state"] == "success", first.log[-3000:]
    assert seen["pid"] == seen["pgid"] == proc.pid, "a session and process group of its own"
    assert (seen["token"], seen["env_token"], seen["other"]) == ("tok-first-7f3a", "tok-first-7f3a", "x")
    # what the server's warm-up made is frozen: the run's collections do not walk it (Airflow's imports: far more
    # than 100,000 objects)
    assert seen["frozen"] > 100_000, seen["frozen"]

    # the next run, from the same server, sees its own values and nothing the first run was given
    second = harness.run(
        dag, "probe", extra_env={"AIRFLOW_VAR_TOKEN": "tok-second-91bc"}, logical_date="2026-01-06T00:00:00+00:00"
    )
    again = second.task("probe")["xcom"]
    assert harness.started[-1].pid != proc.pid
    assert again["ppid"] == seen["ppid"], "both runs were forked by one server"
    assert (again["token"], again["env_token"], again["other"]) == ("tok-second-91bc", "tok-second-91bc", None)
    # the server was started without any run's values: a job reading its environ finds none of them
    server_environ = Path(f"/proc/{seen['ppid']}/environ").read_bytes()
    assert b"tok-first-7f3a" not in server_environ and b"OTHER_RUN_ONLY" not in server_environ


def test_killing_a_warm_run_is_a_worker_crash_and_the_server_runs_the_next(harness: Harness) -> None:
    marker = harness.tmp / "running"
    dag = _dag(harness, "sleeper", SLEEP_DAG.format(marker=str(marker)))
    proc, _, _ = harness.start(dag, "sleeper")
    wait_for(marker.exists, 120, "the task to start")
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the exit status a Popen would give"
    assert not pid_alive(proc.pid)

    probe = harness.run(_dag(harness, "probe", PROBE_DAG), "probe", extra_env={"AIRFLOW_VAR_TOKEN": "t"})
    assert probe.task("probe")["state"] == "success", probe.log[-3000:]


def test_nothing_of_a_run_outlives_its_server(harness: Harness) -> None:
    """The server killed outright (no chance to stop its runs): the test process's handle stops the run."""
    marker = harness.tmp / "running"
    dag = _dag(harness, "sleeper", SLEEP_DAG.format(marker=str(marker)))
    env = harness.child_env(dag)
    server = warm.WarmServer(env)  # a server of this test's own, not the one the other tests share
    try:
        assert server._ready()
        args = [str(dag), "sleeper", "2026-01-05T00:00:00+00:00", "{}", str(harness.tmp / "o.json")]
        child = server.start(args, env, harness.tmp / "s.log")
        wait_for(marker.exists, 120, "the task to start")
        os.killpg(server.process.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: not pid_alive(child.pid), 10, "the run to be stopped")
    finally:
        server.close()


def test_with_warm_off_each_run_is_a_fresh_interpreter(harness: Harness) -> None:
    dag = _dag(harness, "probe", PROBE_DAG)
    run = harness.run(dag, "probe", extra_env={"AIRFLOW_VAR_TOKEN": "t-off", warm.ENABLE_VARIABLE: "0"})
    assert isinstance(harness.started[-1], subprocess.Popen)
    seen = run.task("probe")["xcom"]
    assert run.task("probe")["state"] == "success", run.log[-3000:]
    assert seen["ppid"] == os.getpid() and seen["token"] == "t-off"


def test_the_warm_server_is_on_by_default_on_linux_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    assert warm.enabled({}) and not warm.enabled({warm.ENABLE_VARIABLE: "0"})
    assert not warm.enabled({warm.ENABLE_VARIABLE: "off"})
    monkeypatch.setattr(sys, "platform", "darwin")  # fork after macOS's system libraries is not safe
    assert not warm.enabled({}) and warm.enabled({warm.ENABLE_VARIABLE: "1"})


def test_the_warm_up_does_the_first_use_work_each_run_repeated(airflow_home: Path) -> None:
    """Every forked run configured the ORM's mappers on its first query and parsed the metrics YAML on its first
    metric (about 0.5 s of CPU a run): the server now does both once, before it forks."""
    probe = (
        "from airflow.models.taskinstance import TaskInstance\n"
        "from airflow._shared.observability.metrics import stats\n"
        "from airflow.sdk._shared.observability.metrics import stats as sdk_stats\n"
        "def state(): return [TaskInstance.__mapper__.configured, stats._registry is not None,"
        " sdk_stats._registry is not None]\n"
        "before = state()\n"
        "from gpu_provider.testing import warm\n"
        "warm._warm_first_use()\n"
        "print(before, state())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = done.stdout.splitlines()[-1].split("] [")
    # mappers and the core metrics registry were left to the runs before; the SDK's registry Airflow may load itself
    assert before.startswith("[False, False,") and after == "True, True, True]", done.stdout + done.stderr[-2000:]
