"""Example: train on the first instance type that has capacity, from an ordered preference.

::

    train (p5.48xlarge, else p4d.24xlarge, else g6e.48xlarge; spot first, then on-demand) -> report

``train`` names three instance types in order and composes ``SpotFallback`` with ``InstanceFallback``:
each capacity rung tries the types in order, each with its own capacity wait; when the last type's spot
does not come, the on-demand rung starts again at the first type
(``docs/explanations/capacity-policies.md``); a job with ``checkpoint=`` resumes on each. ``report`` shows
which type each attempt ran on, and what the one that finished cost.

The job runs on the local backend, which places an instance type on this machine's GPUs of its model
(H100 for p5, A100 for p4d, L40S for g6e, read with ``nvidia-smi``); on a machine without GPUs it runs
CPU-only. On AWS, give it ``backend="sagemaker"`` (the attempt's ``InstanceType``), ``"kubernetes"``
(a node affinity per attempt) or ``"batch"`` with ``[gpu_provider] batch_queues_by_instance_type``.

Read when the file is parsed, from the deployment: ``GPU_CAPACITY_WAIT_S`` (seconds each type may wait
for capacity, default 600) and ``GPU_EXAMPLE_NVIDIA_SMI`` (the ``nvidia-smi`` to ask, default
``nvidia-smi``).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, task

from gpu_provider import GpuResources, InstanceFallback, SpotFallback
from gpu_provider.backends.local import LocalBackend
from gpu_provider.operators import GpuJobOperator


def _seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:  # the value is not echoed: it comes from the deployment's environment
        raise ValueError(f"{name} must be a number of seconds") from None


_WAIT_S = _seconds_from_env("GPU_CAPACITY_WAIT_S", 600)

# What the job does here: say where it runs. A real DAG runs its training program.
_JOB = [
    sys.executable,
    "-c",
    "import os; print('training on', os.environ['GPU_PROVIDER_CAPACITY'], 'capacity, GPUs',"
    " os.environ.get('CUDA_VISIBLE_DEVICES') or 'none')",
]

with DAG(
    dag_id="gpu_instance_fallback",
    schedule=None,
    catchup=False,
    tags=["gpu", "example"],
    doc_md=__doc__,
) as dag:
    train = GpuJobOperator(
        task_id="train",
        backend=LocalBackend(nvidia_smi=os.environ.get("GPU_EXAMPLE_NVIDIA_SMI") or "nvidia-smi"),
        command=_JOB,
        resources=GpuResources(gpus=1, instance_types=("p5.48xlarge", "p4d.24xlarge", "g6e.48xlarge")),
        capacity=SpotFallback(
            spot_wait_timeout=_WAIT_S,  # per type, on spot
            instances=InstanceFallback(capacity_wait=_WAIT_S),  # per type, on on-demand but the last
            max_interruptions=6,  # up to 3 spot and 2 on-demand types given up, and one reclaim
        ),
        max_runtime=timedelta(minutes=30),  # a short job: an interruption starts it again (a real one checkpoints)
    )

    @task
    def report(ti: Any = None) -> dict[str, Any]:
        result = ti.xcom_pull(task_ids="train")
        ran = result["attempts"][-1]
        return {
            "tried": [[a["capacity"], a["instance_type"], a["interruption"]] for a in result["attempts"]],
            "ran_on": ran["instance_type"],
            "cost_usd": result["cost_usd"],
        }

    train >> report()
