"""Example: one training task on a capacity ladder across services, on one ``s3://`` checkpoint.

::

    preprocess -> train (AWS Batch spot -> SageMaker managed spot -> SageMaker on-demand) -> report

``train`` runs the example trainer (``gpu_provider.examples.train``) under ``Ladder(...)``: its first attempt runs
on AWS Batch spot; a reclaimed host moves the next attempt to SageMaker managed spot, and a reclaim there to
SageMaker on-demand (``docs/explanations/capacity-policies.md``). Every rung reads and writes the one checkpoint
location, so each attempt resumes from the step the one before reached, on another service; the final model is
the one an uninterrupted run writes. ``report`` lists where each attempt ran and how it ended.

Read when the file is parsed, from the deployment:

* ``GPU_LADDER_CHECKPOINT_ROOT`` (default ``s3://gpu-ladder-checkpoints/ladder``): an ``s3://bucket/prefix`` that
  Batch jobs (their job role) and SageMaker (its execution role) can both read and write;
* ``GPU_LADDER_WORK_ROOT`` (default ``file:///tmp/gpu-ladder``): where the example's data and model go. The
  example programs read and write ``file://`` only, which works where jobs run as local processes (the
  emulators of ``gpu_provider.testing``); on AWS, put your own training program in the image and its data on S3;
* ``GPU_LADDER_IMAGE`` (default ``gpu-pipeline:latest``): the container image every rung runs;
* ``GPU_LADDER_STEP_DELAY`` (default ``0``): seconds the example trainer sleeps per step, 0 to 10 (pacing, so that
  a reclaim has a training step to land in: the example's 120 steps take about a second unpaced).

The Batch queue and connection, the SageMaker role and output path come from ``[gpu_provider]``
(``batch_spot_queue``, ``batch_aws_conn_id``, ``sagemaker_role_arn``, ...). A rung in another region is
``LadderRung("sagemaker", "on_demand", aws_conn_id="aws_us_west_2", region_name="us-west-2")``: its own
connection, and the checkpoint is read from there (S3 bills the transfer between regions).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from airflow.sdk import DAG, task

from gpu_provider import Checkpoint, GpuResources, Ladder, LadderRung
from gpu_provider.operators import GpuJobOperator

_CHECKPOINTS = os.environ.get("GPU_LADDER_CHECKPOINT_ROOT", "").strip() or "s3://gpu-ladder-checkpoints/ladder"
if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._/-]+)?", _CHECKPOINTS) or ".." in _CHECKPOINTS:
    # the value is not echoed: it comes from the deployment's environment
    raise ValueError("GPU_LADDER_CHECKPOINT_ROOT must be an s3://bucket/prefix URI (no '..')")
_WORK = os.environ.get("GPU_LADDER_WORK_ROOT", "").strip().rstrip("/") or "file:///tmp/gpu-ladder"
if not re.fullmatch(r"file:///[A-Za-z0-9._/-]+", _WORK) or ".." in _WORK:
    raise ValueError("GPU_LADDER_WORK_ROOT must be a file:///absolute/path URI (no '..')")
_IMAGE = os.environ.get("GPU_LADDER_IMAGE", "").strip() or "gpu-pipeline:latest"
try:
    _STEP_DELAY = float(os.environ.get("GPU_LADDER_STEP_DELAY", "").strip() or "0")
except ValueError:
    _STEP_DELAY = -1.0
if not 0.0 <= _STEP_DELAY <= 10.0:
    raise ValueError("GPU_LADDER_STEP_DELAY must be a number of seconds from 0 to 10")
#: the Batch spot queue of the first rung: ``[gpu_provider] batch_spot_queue``, else ``GPU_LADDER_SPOT_QUEUE``, else
#: ``gpu-spot`` (a literal, checked when the file is parsed, like every rung's options)
_SPOT_QUEUE = (
    os.environ.get("AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE") or os.environ.get("GPU_LADDER_SPOT_QUEUE") or "gpu-spot"
)
#: one folder per run, so that runs do not resume each other's training
_RUN = "{{ run_id | path_segment }}"

with DAG(
    dag_id="gpu_capacity_ladder",
    schedule=None,
    catchup=False,
    tags=["gpu", "example"],
    doc_md=__doc__,
) as dag:
    preprocess = GpuJobOperator(
        task_id="preprocess",
        backend="local",
        command=[
            sys.executable,
            "-m",
            "gpu_provider.examples.preprocess",
            "--start",
            "{{ (dag_run.run_after - macros.timedelta(days=7)) | ds }}",
            "--end",
            "{{ dag_run.run_after | ds }}",
            "--out",
            f"{_WORK}/{_RUN}/data",
            "--rows",
            "4000",
        ],
        resources=GpuResources(gpus=1),
    )

    train = GpuJobOperator(
        task_id="train",
        image=_IMAGE,
        command=[
            "python",
            "-m",
            "gpu_provider.examples.train",
            "--data",
            f"{_WORK}/{_RUN}/data",
            "--out",
            f"{_WORK}/{_RUN}/model",
            "--epochs",
            "3",
            "--steps-per-epoch",
            "40",
            "--batch-size",
            "64",
            "--checkpoint-every",
            "5",
            "--step-delay",
            f"{_STEP_DELAY:g}",
        ],
        resources=GpuResources(gpus=1),
        capacity=Ladder(
            LadderRung("batch", "spot", spot_queue=_SPOT_QUEUE),  # the cheapest: spot in the Batch spot queue
            LadderRung("sagemaker", "spot"),  # reclaimed there: SageMaker managed spot
            LadderRung("sagemaker", "on_demand"),  # reclaimed again: finish on on-demand
            spot_wait_timeout=20 * 60,  # a spot rung that gives no capacity in 20 minutes moves on too
        ),
        checkpoint=Checkpoint(uri=f"{_CHECKPOINTS}/{_RUN}", keep=3),
        team="research",
    )

    @task
    def report(ti: Any = None) -> dict[str, Any]:
        result = ti.xcom_pull(task_ids="train")
        return {
            "attempts": [
                [a["backend"], a["service"], a["capacity"], a["state"], a["interruption"]] for a in result["attempts"]
            ],
            "services": result["backends"],
            "cost_usd": result["cost_usd"],
        }

    preprocess >> train >> report()
