"""Team GPU pools: every 15 minutes, make Airflow's pools match the team quota file.

The same as ``gpu-provider pools sync --fail-stuck``: from ``[gpu_provider] quota_file`` it creates
or updates one pool ``gpu_<team>`` per team (slots = the team's GPUs, ``include_deferred=True``)
through Airflow's REST API (connection ``[gpu_provider] reaper_airflow_conn_id``, ``airflow_api`` by
default), reports drift (a pool changed by hand is set back, and the log says what it was), keeps
``gpu_*`` pools of no team (it never deletes a pool), and fails any task that waits for a
``gpu_*`` pool that does not exist, with a note on that task saying why (the scheduler would leave
it queued forever, saying so only in its own log). The report is in the task log and in XCom.

Trigger it by hand with ``{"dry_run": true}`` to see the diff without changing anything.

Read when the file is parsed, from the deployment: ``GPU_POOL_SYNC_EVERY_MIN`` (default 15).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param, task

EVERY_MIN = float(os.environ.get("GPU_POOL_SYNC_EVERY_MIN", "15"))

with DAG(
    dag_id="gpu_pool_sync",
    schedule=timedelta(minutes=EVERY_MIN),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["gpu_provider", "quotas"],
    params={"dry_run": Param(False, type="boolean", description="show the diff, change nothing")},
    doc_md=__doc__,
) as dag:

    @task(retries=1, retry_delay=timedelta(minutes=1), execution_timeout=timedelta(minutes=5))
    def sync(params: dict[str, Any] | None = None) -> dict[str, Any]:
        from gpu_provider.airflow_api import AirflowApi
        from gpu_provider.backends.base import provider_config
        from gpu_provider.quotas.file import configured_quotas
        from gpu_provider.quotas.pools import PoolSync

        quotas = configured_quotas()
        if quotas is None:
            raise ValueError("[gpu_provider] quota_file is not set: point it at the team quota file")
        api = AirflowApi.from_connection(provider_config("reaper_airflow_conn_id") or "airflow_api")
        dry_run = bool((params or {}).get("dry_run", False))
        report = PoolSync(api, quotas).sync(dry_run=dry_run, fail_stuck=not dry_run)
        for line in report.lines():
            print(line)
        return report.to_dict()

    sync()
