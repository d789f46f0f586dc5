"""Run one DAG with ``dag.test()`` in this process and dump what happened as JSON.

Used by the operator tests as a child process (so a test can SIGKILL or SIGTERM the "worker").
Usage: run_dag.py DAG_FILE DAG_ID LOGICAL_DATE CONF_JSON OUT_JSON
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def main() -> None:
    dag_file, dag_id, logical_date, conf, out = sys.argv[1:6]
    spec = importlib.util.spec_from_file_location(Path(dag_file).stem, dag_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import pendulum
    from airflow.models.xcom import XComModel
    from airflow.sdk import DAG
    from airflow.utils.session import create_session

    dag = next(v for v in vars(module).values() if isinstance(v, DAG) and v.dag_id == dag_id)
    from airflow.models.pool import Pool

    for pool in {task.pool for task in dag.tasks} - {Pool.DEFAULT_POOL_NAME}:  # team pools (gpu_<team>)
        Pool.create_or_update_pool(pool, slots=16, description="tests", include_deferred=True)
    when = pendulum.parse(logical_date)
    # a fixed run_after gives a fixed run id, so running the same DAG again re-runs the same task instance
    dr = dag.test(logical_date=when, run_after=when, run_conf=json.loads(conf))
    result: dict[str, object] = {"state": str(dr.state), "run_id": dr.run_id, "tasks": {}}
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
            result["tasks"][name] = {  # type: ignore[index]
                "state": str(ti.state),
                "try_number": ti.try_number,
                "xcom": XComModel.deserialize_value(row) if row is not None else None,
            }
    Path(out).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
