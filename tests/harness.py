"""Fixture `harness`: run DAGs with GpuJobOperator tasks in child processes (dag.test), and clean up
every job they start. Registered for the whole suite by tests/conftest.py.

The runner is gpu_provider.testing's (:class:`~gpu_provider.testing.dagrun.DagRunner`, the one behind the
plugin's ``run_gpu_dag``); this module adds what only this repository's tests use: DAG files written from
a template that imports every backend, and the toy job of tests/operators/toy_job.py.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_provider.testing.dagrun import DagRun, DagRunner, pid_alive, wait_for

__all__ = ["REPO", "DagRun", "Harness", "harness", "pid_alive", "wait_for"]

HERE = Path(__file__).resolve().parent / "operators"
TOY_JOB = HERE / "toy_job.py"
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


class Harness(DagRunner):
    """The package's DAG runner, with DAG files from :data:`DAG_TEMPLATE` and the toy job."""

    def write_dag(self, dag_id: str, body: str) -> Path:
        path = self.home / "dags" / f"{dag_id}.py"
        path.write_text(DAG_TEMPLATE.format(dag_id=dag_id, body=textwrap.indent(textwrap.dedent(body), "    ")))
        return path

    def toy_args(self, out: str, steps: int = 10, delay: float = 0.1, *extra: str) -> list[str]:
        """The command line of tests/operators/toy_job.py."""
        return [sys.executable, str(TOY_JOB), "--steps", str(steps), "--delay", str(delay), "--out", out, *extra]

    def toy_command(self, out: str, steps: int = 10, delay: float = 0.1, *extra: str) -> str:
        """The same, as Python source for a DAG file."""
        return repr(self.toy_args(out, steps, delay, *extra))


@pytest.fixture
def harness(airflow_home: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(home=airflow_home, tmp=tmp_path, state_dir=tmp_path / "state")
    try:
        yield h
    finally:
        # every child killed and every job any test started cancelled, also when the test failed
        h.cleanup()
