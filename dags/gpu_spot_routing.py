"""Example: wait for spot capacity, then run the job on spot; if none comes in time, run it on-demand.

::

    wait_for_spot (SpotCapacitySensor, soft_fail) -> choose_capacity (branch) -> train_spot      -> report
                                                                            or train_on_demand -> report

* ``wait_for_spot`` waits (deferred, in the triggerer) until EC2's spot placement score for 4 x
  g5.2xlarge|g6.2xlarge reaches 7 in us-east-1 or us-west-2, or a spot price of one of them is at
  most $0.60/h. With ``soft_fail=True`` a timeout marks it *skipped*, not failed; an EC2 error (no
  permission, bad credentials) still fails it, so a broken setup does not silently run on-demand.
* ``choose_capacity`` runs after the sensor succeeded or was skipped (``trigger_rule="none_failed"``)
  and picks ``train_spot`` when the sensor returned a reading, else ``train_on_demand``.
* ``train_spot`` gets the region the sensor found (``SPOT_REGION``, from its XCom).
* ``report`` runs after whichever branch ran (``none_failed_min_one_success``).

The jobs run on the local backend, so the example runs anywhere with an AWS connection (or the
EC2 emulator the tests use); on AWS, give them ``backend="batch"`` and the regions' queues.

Read when the file is parsed, from the deployment: ``GPU_SPOT_WAIT_S`` (seconds the sensor waits,
default 1800) and ``GPU_SPOT_POLL_S`` (seconds between readings, default 300).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, task

from gpu_provider.operators import GpuJobOperator
from gpu_provider.sensors import SpotCapacitySensor


def _seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:  # the value is not echoed: it comes from the deployment's environment
        raise ValueError(f"{name} must be a number of seconds") from None


# What the job does here: say where it runs. A real DAG runs its training program.
_JOB = [
    sys.executable,
    "-c",
    "import os; print('training on', os.environ['GPU_PROVIDER_CAPACITY'], 'capacity',"
    " 'in', os.environ.get('SPOT_REGION') or 'the on-demand region')",
]

with DAG(
    dag_id="gpu_spot_routing",
    schedule=None,
    catchup=False,
    tags=["gpu", "example"],
    doc_md=__doc__,
) as dag:
    wait_for_spot = SpotCapacitySensor(
        task_id="wait_for_spot",
        instance_types=["g5.2xlarge", "g6.2xlarge"],
        regions=["us-east-1", "us-west-2"],
        target_capacity=4,
        min_score=7,
        max_price=0.60,
        timeout=_seconds_from_env("GPU_SPOT_WAIT_S", 1800),
        poll_interval=_seconds_from_env("GPU_SPOT_POLL_S", 300),
        soft_fail=True,  # no capacity in time -> skipped, and the branch below picks on-demand
    )

    @task.branch(trigger_rule="none_failed")
    def choose_capacity(ti: Any = None) -> str:
        found = ti.xcom_pull(task_ids="wait_for_spot")
        if found:
            print(f"spot capacity: {found['satisfied_by']} in {found['region']}; running on spot")
            return "train_spot"
        print("no spot capacity in time; running on on-demand capacity")
        return "train_on_demand"

    train_spot = GpuJobOperator(
        task_id="train_spot",
        backend="local",
        command=_JOB,
        capacity="spot",
        max_runtime=timedelta(minutes=30),  # a short job: an interruption simply starts it again
        env={"SPOT_REGION": "{{ ti.xcom_pull(task_ids='wait_for_spot')['region'] }}"},
    )
    train_on_demand = GpuJobOperator(
        task_id="train_on_demand",
        backend="local",
        command=_JOB,
        capacity="on_demand",
        max_runtime=timedelta(minutes=30),
    )

    @task(trigger_rule="none_failed_min_one_success")
    def report(ti: Any = None) -> dict[str, Any]:
        for task_id in ("train_spot", "train_on_demand"):
            result = ti.xcom_pull(task_ids=task_id)
            if result:
                return {"ran": task_id, "capacity": result["attempts"][-1]["capacity"]}
        raise RuntimeError("neither training task returned a result")

    wait_for_spot >> choose_capacity() >> [train_spot, train_on_demand] >> report()
