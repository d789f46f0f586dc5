"""Retrain when new data lands: a DAG scheduled on the asset that ``gpu_ml_pipeline``'s ``preprocess`` publishes.

Every time ``preprocess`` writes a dataset, its ``GpuJobOperator`` emits an event of the asset
``gpu_ml_pipeline_dataset`` whose extra holds the dataset's URI (``{"output_uri": ...}``: the operator
puts the job's declared output there). Airflow then runs this DAG, an asset-triggered run with no
logical date and no data interval, so nothing here reads ``ds`` or ``data_interval_start``::

    pick_dataset -> retrain

``pick_dataset`` takes the dataset from the event that triggered the run; a manual run (from the UI or
the REST API, with or without a logical date) takes the asset's latest event instead. ``retrain``
trains on it with spot capacity and on-demand fallback, checkpointing next to the dataset, under a
folder named after the run (``{{ run_id | path_segment }}``: unique per run, storage-safe).

Read from the deployment when the file is parsed, as in ``gpu_ml_pipeline``: ``GPU_PIPELINE_BACKEND``
(default ``local``) and ``GPU_PIPELINE_IMAGE`` (the image on container backends).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, task

from gpu_provider import Checkpoint, GpuResources, SpotFallback
from gpu_provider.operators import GpuJobOperator

#: the asset ``gpu_ml_pipeline``'s ``preprocess`` task publishes (same name there)
DATASET = Asset("gpu_ml_pipeline_dataset")
_BACKEND = os.environ.get("GPU_PIPELINE_BACKEND", "local")
_BACKENDS = ["local", "batch", "sagemaker", "kubernetes"]
_IMAGE = os.environ.get("GPU_PIPELINE_IMAGE", "")
# the job's interpreter per backend: the worker's own on the local backend, the image's elsewhere
_PYTHON = {"local": sys.executable, "batch": "python", "sagemaker": "python", "kubernetes": "python"}
#: where a run writes, next to its dataset (pick_dataset's XCom: {"dataset": ..., "base": ...})
RUN = "{{ ti.xcom_pull(task_ids='pick_dataset')['base'] }}/retrain/{{ run_id | path_segment }}"


with DAG(
    dag_id="gpu_retrain_on_new_data",
    description="retrain on every new dataset gpu_ml_pipeline publishes (asset-triggered)",
    schedule=[DATASET],
    start_date=datetime(2026, 1, 5),
    catchup=False,
    max_active_runs=1,
    tags=["gpu", "example"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    user_defined_macros={"job_python": _PYTHON},
    params={
        "backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend"),
        "epochs": Param(3, type="integer", minimum=1, maximum=100, title="Training epochs"),
        "step_delay": Param(0.02, type="number", minimum=0, maximum=10, title="Seconds per training step"),
    },
) as dag:

    @task(inlets=[DATASET])
    def pick_dataset(**context: Any) -> dict[str, str]:
        """The dataset of the event that triggered this run, else (a manual run) the asset's latest event."""
        from gpu_provider.examples.assets import pick_dataset

        return pick_dataset(DATASET, context)

    retrain = GpuJobOperator(
        task_id="retrain",
        backend="{{ params.backend }}",
        image=_IMAGE,
        command=[
            "{{ job_python[params.backend] }}",
            "-m",
            "gpu_provider.examples.train",
            "--data",
            "{{ ti.xcom_pull(task_ids='pick_dataset')['dataset'] }}",
            "--out",
            RUN + "/model",
            "--epochs",
            "{{ params.epochs }}",
            "--step-delay",
            "{{ params.step_delay }}",
        ],
        resources=GpuResources(gpus=1),
        capacity=SpotFallback(after_preemptions=1, spot_wait_timeout=timedelta(minutes=10)),
        checkpoint=Checkpoint(uri=RUN + "/checkpoints", keep=2),
        team="research",
        priority=15,
        max_runtime=timedelta(hours=2),
    )

    pick_dataset() >> retrain
