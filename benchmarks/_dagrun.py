"""Run one DAG file with ``dag.test()`` in a child process under a private Airflow home (figures 4 and 5).

As a script (the child): ``python benchmarks/_dagrun.py DAG_FILE DAG_ID`` runs the DAG once and prints one
JSON line: the run's state and each task's state and try number.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def airflow_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """The children's environment: a private Airflow home and DAGs folder, this checkout on the path."""
    (home / "dags").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
    )
    env.update(extra)
    return env


def migrate(env: dict[str, str]) -> None:
    """Create the metadata database (SQLite) once per Airflow home."""
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def run_dag(dag_file: Path, dag_id: str, env: dict[str, str], *, timeout: float = 600) -> dict[str, Any]:
    """``dag.test()`` of ``dag_id`` in a child process; its JSON summary (the child's log on failure)."""
    proc = subprocess.run(
        [sys.executable, __file__, str(dag_file), dag_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"dag_run"')]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"dag.test() of {dag_id} failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    result["log"] = proc.stdout + proc.stderr
    return result


def _child(dag_file: str, dag_id: str) -> None:
    spec = importlib.util.spec_from_file_location(Path(dag_file).stem, dag_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.dag_id == dag_id, (dag.dag_id, dag_id)
    dr = dag.test()
    tasks = {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number} for ti in dr.get_task_instances()}
    print(json.dumps({"dag_run": str(dr.state), "tasks": tasks}), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
