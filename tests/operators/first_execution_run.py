"""Child of ``test_first_execution.py``: run the probe DAG through Airflow's own code, twice.

Round 1 is ``dag.test()`` (a failure and its retry, a reschedule, a deferral resumed inline). Round 2
clears every task instance with Airflow's ``clear_task_instances`` (what the UI's and the REST API's
clear call) and runs the run again with the scheduler's own ``DagRun.update_state`` and
``DagRun.schedule_tis`` (which sets each new try's number), each task through ``dag.test()``'s runner
(``run_task_in_process``: the execution API's ``ti_run`` and the task SDK's task runner).

Usage: first_execution_run.py DAG_FILE DAG_ID
"""

from __future__ import annotations

import importlib.util
import sys
import time
from datetime import datetime, timezone
from pathlib import Path


def main() -> None:
    dag_file, dag_id = Path(sys.argv[1]), sys.argv[2]
    spec = importlib.util.spec_from_file_location(dag_file.stem, dag_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    assert dag.dag_id == dag_id
    first = dag.test(logical_date=datetime(2026, 1, 5, tzinfo=timezone.utc))
    run_id = first.run_id

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import clear_task_instances
    from airflow.sdk.definitions.dag import _run_task
    from airflow.serialization.serialized_objects import DagSerialization
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    with create_session() as session:
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        assert dr is not None
        clear_task_instances(list(dr.get_task_instances(session=session)), session, dag_run_state=DagRunState.RUNNING)
    deadline = time.monotonic() + 120
    session = create_session().__enter__()  # one session, as dag.test()'s loop keeps
    while True:
        session.expire_all()
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        assert dr is not None
        dr.dag = scheduler_dag
        if dr.state != DagRunState.RUNNING:
            break
        assert time.monotonic() < deadline, "round 2 did not end in 120 s"
        schedulable, _ = dr.update_state(session=session)
        dr.schedule_tis(schedulable, session=session)  # the scheduler's own: a new try's number is set here
        session.commit()
        scheduled = [ti for ti in dr.get_task_instances(session=session) if ti.state == TaskInstanceState.SCHEDULED]
        for ti in scheduled:
            _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
        if not scheduled:
            time.sleep(0.1)  # a reschedule's date not reached yet: poll the run again (bounded by the deadline)
    print("round 2:", dr.state, flush=True)


if __name__ == "__main__":
    main()
