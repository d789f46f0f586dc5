"""The GPU reaper: every 15 minutes, stop GPU jobs this provider started that no live task waits for.

A job keeps billing when its task is gone: the task was marked failed while deferred before a
triggerer picked it up, its worker was killed with no retries left, its DAG run was deleted, or
no task can be asked about it and it ran past its service's own limit. ``GpuReaperOperator``
lists the jobs the provider tagged on every configured backend (``[gpu_provider] reaper_backends``;
unset: every backend whose extra is installed, the others named in the log), checks that connection
``airflow_api`` is Airflow 3's REST API, asks it about each owning task instance, and stops those
with no live owner, only on Airflow's own answer (docs/explanations/reaper.md).

It only reports until you set ``[gpu_provider] reaper_dry_run = False`` (read each run: the
report in the task log and in XCom lists what it would stop and what that costs per hour).

Read when the file is parsed, from the deployment: ``GPU_REAPER_EVERY_MIN`` (minutes between runs,
default 15).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from gpu_provider.operators import GpuReaperOperator

EVERY_MIN = float(os.environ.get("GPU_REAPER_EVERY_MIN", "15"))

with DAG(
    dag_id="gpu_reaper",
    schedule=timedelta(minutes=EVERY_MIN),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["gpu_provider", "spend"],
    doc_md=__doc__,
) as dag:
    GpuReaperOperator(
        task_id="reap",
        # a pass that hangs on a service must not pile up behind the next one
        execution_timeout=timedelta(minutes=max(1.0, EVERY_MIN - 1)),
        retries=0,
    )
