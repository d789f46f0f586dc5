"""DAGs of the scheduler acceptance suite (tests/integration/test_scheduler_postgres.py), copied into the
DAGs folder of the Airflow it starts. What they do is read from the JSON file $GPU_ACCEPT_CONFIG:
the local backend's state folder, the job program, where jobs write, and the gate folder (a gated job
waits until its gate file exists, so a test decides when a pool slot frees up)."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Param
from airflow.timetables.interval import CronDataIntervalTimetable

from gpu_provider import GpuResources
from gpu_provider.backends.local import LocalBackend
from gpu_provider.operators import GpuJobOperator

with open(os.environ["GPU_ACCEPT_CONFIG"]) as f:
    CFG = json.load(f)
BACKEND = LocalBackend(state_dir=CFG["state"], grace_period=1)
RUN = "{{ run_id | path_segment }}"


def gpu(
    task_id: str, team: str, gpus: int, name: str, *extra: str, gate: str = "-", seconds: float = 0, **kw: Any
) -> Any:
    """A GPU task whose job records its start, waits for its gate, runs `seconds`, and records its end."""
    command = [sys.executable, CFG["job"], CFG["out"], name, gate, str(seconds), *extra]
    return GpuJobOperator(
        task_id=task_id,
        backend=BACKEND,
        team=team,
        resources=GpuResources(gpus=gpus),
        command=command,
        poll_interval=0.3,
        **kw,
    )


# three concurrent runs want 3 x 2 x 2 = 12 GPUs of team alpha's 4; one task of each run defers. Its
# job runs longer: with a job of 2 s on a loaded machine, Airflow 3.3's LocalExecutor can report the end
# of the task's deferring run after the resumed run started, and the scheduler fails the task (a race
# in Airflow, also noted in tests/integration/test_real_airflow.py)
with DAG(dag_id="cap_alpha", schedule=None, max_active_runs=3) as cap_alpha:
    gpu("train0", "alpha", 2, f"alpha0-{RUN}", seconds=CFG["deferred_job_s"], deferrable=True)
    gpu("train1", "alpha", 2, f"alpha1-{RUN}", seconds=CFG["job_s"])

with DAG(dag_id="cap_beta", schedule=None) as cap_beta:
    gpu("train", "beta", 2, f"beta-{RUN}", seconds=CFG["job_s"])

# team prio has one GPU: the hog holds it until the test opens its gate
with DAG(dag_id="prio_hog", schedule=None) as prio_hog:
    gpu("hold", "prio", 1, f"priohog-{RUN}", gate=os.path.join(CFG["gates"], "prio"))
with DAG(dag_id="prio_low", schedule=None, max_active_runs=3) as prio_low:
    gpu("job", "prio", 1, f"low-{RUN}", priority=1)
with DAG(dag_id="prio_high", schedule=None) as prio_high:
    gpu("job", "prio", 1, f"high-{RUN}", priority=10)

# team bf has one GPU: weekly runs (a real data interval: Sunday to Sunday) and their backfills
with DAG(dag_id="bf_hog", schedule=None) as bf_hog:
    gpu("hold", "bf", 1, f"bfhog-{RUN}", gate=os.path.join(CFG["gates"], "bf"))
with DAG(
    dag_id="weekly",
    schedule=CronDataIntervalTimetable("0 0 * * 0", timezone="UTC"),
    start_date=datetime(2026, 1, 4, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=8,
) as weekly:
    gpu(
        "train",
        "bf",
        1,
        f"weekly-{RUN}",
        "s3://features/{{ data_interval_start | ds }}/",
        "s3://models/{{ data_interval_end | ds }}/",
        priority=5,
    )

# the trigger form's params, as the REST API passes them
with DAG(
    dag_id="with_params",
    schedule=None,
    params={
        "epochs": Param(1, type="integer", minimum=1, maximum=100),
        "dataset": Param("small", type="string", enum=["small", "big"]),
    },
) as with_params:
    gpu("train", "params", 1, f"params-{RUN}", "{{ params.epochs }}", "{{ params.dataset }}")

# a task of a pool nobody created: Airflow alone would leave it scheduled forever (not an EmptyOperator:
# the scheduler marks those successful without a pool slot)
with DAG(dag_id="ghost_pool", schedule=None) as ghost_pool:
    BashOperator(task_id="wait", bash_command="true", pool="gpu_ghost")
