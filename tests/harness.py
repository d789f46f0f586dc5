"""Fixture `harness`: run DAGs with GpuJobOperator tasks in child processes (dag.test), and clean up
every job they start. Registered for the whole suite by tests/conftest.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent / "operators"
TOY_JOB = HERE / "toy_job.py"
RUN_DAG = HERE / "run_dag.py"
REPO = HERE.parent.parent

DAG_TEMPLATE = """
import sys
from datetime import timedelta
from airflow.sdk import DAG
from gpu_provider import Checkpoint, GpuResources, OnDemand, Spot, SpotFallback
from gpu_provider.operators import GpuJobOperator
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.sagemaker import SageMakerBackend

with DAG(dag_id={dag_id!r}, schedule=None, catchup=False) as dag:
{body}
"""


@dataclass
class DagRun:
    """A finished child run: its JSON dump and its whole log."""

    returncode: int
    result: dict[str, Any]
    log: str

    def task(self, task_id: str = "job") -> dict[str, Any]:
        return dict(self.result["tasks"][task_id])


@dataclass
class Harness:
    home: Path
    tmp: Path
    state_dir: Path

    def write_dag(self, dag_id: str, body: str) -> Path:
        path = self.home / "dags" / f"{dag_id}.py"
        path.write_text(DAG_TEMPLATE.format(dag_id=dag_id, body=textwrap.indent(textwrap.dedent(body), "    ")))
        return path

    def start(
        self,
        dag_file: Path,
        dag_id: str,
        *,
        logical_date: str = "2026-01-05T00:00:00+00:00",
        conf: dict[str, Any] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> tuple[subprocess.Popen[str], Path, Path]:
        out = self.tmp / f"{dag_id}-{time.monotonic_ns()}.json"
        log = out.with_suffix(".log")
        env = dict(os.environ)
        env.update(extra_env or {})
        proc = subprocess.Popen(
            [sys.executable, str(RUN_DAG), str(dag_file), dag_id, logical_date, json.dumps(conf or {}), str(out)],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            start_new_session=True,
        )
        _started.append(proc)
        return proc, out, log

    def run(self, dag_file: Path, dag_id: str, *, timeout: float = 180, **kwargs: Any) -> DagRun:
        return self.finish(*self.start(dag_file, dag_id, **kwargs), timeout=timeout)

    def finish(self, proc: subprocess.Popen[str], out: Path, log: Path, *, timeout: float = 180) -> DagRun:
        """Wait for a run :meth:`start` began, and read its result."""
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            _kill(proc)
        text = log.read_text()
        if not out.exists():
            raise AssertionError(f"dag.test child exited {rc} without a result; log tail:\n{text[-4000:]}")
        return DagRun(rc, json.loads(out.read_text()), text)

    def toy_args(self, out: str, steps: int = 10, delay: float = 0.1, *extra: str) -> list[str]:
        """The command line of tests/operators/toy_job.py."""
        return [sys.executable, str(TOY_JOB), "--steps", str(steps), "--delay", str(delay), "--out", out, *extra]

    def toy_command(self, out: str, steps: int = 10, delay: float = 0.1, *extra: str) -> str:
        """The same, as Python source for a DAG file."""
        return repr(self.toy_args(out, steps, delay, *extra))


_started: list[subprocess.Popen[str]] = []


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.fixture
def harness(airflow_home: Path, tmp_path: Path) -> Iterator[Harness]:
    state_dir = tmp_path / "state"
    h = Harness(home=airflow_home, tmp=tmp_path, state_dir=state_dir)
    yield h
    for proc in _started:
        _kill(proc)
    _started.clear()
    # every job any test started is cancelled, also when the test failed
    from gpu_provider.backends.local import LocalBackend

    backend = LocalBackend(state_dir=str(state_dir), grace_period=0.5)
    for handle in backend.list_jobs():
        backend.cancel(handle, "test teardown")


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        # the state follows the command name in parentheses, which may itself hold spaces
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
