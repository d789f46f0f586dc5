"""The child side of :mod:`gpu_provider.testing.dagrun`: run one DAG with ``dag.test()`` and write what each
task did as JSON.

Run as ``python -m gpu_provider.testing.dagrun DAG_FILE DAG_ID LOGICAL_DATE CONF_JSON OUT_JSON``, or called
by the child a warm server forks (:mod:`gpu_provider.testing.warm`). It imports neither of those modules,
so the runner (which starts warm servers) and the warm server (which runs this) do not import each other.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the child's LOGICAL_DATE argument for a run without a logical date
NO_LOGICAL_DATE = "none"


def load_dags(dag_file: str | os.PathLike[str]) -> dict[str, Any]:
    """The DAGs of one file by id, found as Airflow's DAG processor finds them (its ``DagBag`` on that file):
    ``with DAG(...):`` with or without ``as``, ``@dag`` functions called in the file, several DAGs per file.

    :raises SystemExit: the file does not import (Airflow's import error, in one message)
    """
    from airflow.dag_processing.dagbag import DagBag

    path = Path(dag_file)
    if not path.is_file():
        raise SystemExit(f"{dag_file}: no such file")
    bag = DagBag(dag_folder=str(path), safe_mode=False)
    if bag.import_errors:
        error = next(iter(bag.import_errors.values())).strip()
        raise SystemExit(f"{dag_file}: Airflow could not import it: {error.splitlines()[-1] if error else error}")
    return dict(bag.dags)


def _load_dag(dag_file: str, dag_id: str) -> Any:
    dags = load_dags(dag_file)
    if dag_id:
        if dag_id not in dags:
            raise SystemExit(f"{dag_file}: no DAG {dag_id!r}; its DAGs: {sorted(dags)}")
        return dags[dag_id]
    if len(dags) != 1:
        raise SystemExit(f"{dag_file}: expected one DAG, found {sorted(dags)}: name one with dag_id")
    return next(iter(dags.values()))


def main(argv: Sequence[str] | None = None) -> None:
    dag_file, dag_id, logical_date, conf, out = (sys.argv[1:] if argv is None else list(argv))[:5]
    dag = _load_dag(dag_file, dag_id)
    import pendulum
    from airflow.models.pool import Pool
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    for pool in {task.pool for task in dag.tasks} - {Pool.DEFAULT_POOL_NAME}:  # team pools (gpu_<team>)
        Pool.create_or_update_pool(pool, slots=16, description="tests", include_deferred=True)
    if logical_date == NO_LOGICAL_DATE:  # as the UI and the REST API trigger with logical_date null
        dr = dag.test(logical_date=None, run_after=pendulum.now("UTC"), run_conf=json.loads(conf))
    else:
        when = pendulum.parse(logical_date)
        # a fixed run_after gives a fixed run id, so running the same DAG again re-runs the same task instance
        dr = dag.test(logical_date=when, run_after=when, run_conf=json.loads(conf))
    tasks: dict[str, Any] = {}
    result: dict[str, Any] = {
        "state": str(dr.state),
        "run_id": dr.run_id,
        "dag_id": dag.dag_id,
        "logical_date": dr.logical_date.isoformat() if dr.logical_date else None,
        "tasks": tasks,
    }
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            row = (
                session.query(XComModel)
                .filter_by(
                    dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index, key="return_value"
                )
                .one_or_none()
            )
            name = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
            tasks[name] = {
                "state": str(ti.state),
                "try_number": ti.try_number,
                "xcom": XComModel.deserialize_value(row) if row is not None else None,
            }
    Path(out).write_text(json.dumps(result, default=str))
