"""A learning-rate sweep as a mapped task: one GPU job per learning rate, on the latest dataset.

Trigger it by hand (the UI or the REST API, with or without a logical date) once ``gpu_ml_pipeline`` has
published a dataset (the asset ``gpu_ml_pipeline_dataset``)::

    pick_dataset -> plan_sweep -> train[0], train[1], train[2]

``plan_sweep`` makes one training command per learning rate of the form (``learning_rates``), and
``GpuJobOperator.partial(...).expand(command=...)`` runs each as its own job: its own name
(``...-m<map index>-...``), attempts, checkpoints (``.../lr<map index>/checkpoints``) and reattach
after a worker crash, and its own 1 GPU of the team pool ``gpu_research`` (set by ``partial()``).

Read from the deployment when the file is parsed, as in ``gpu_ml_pipeline``: ``GPU_PIPELINE_BACKEND``
(default ``local``) and ``GPU_PIPELINE_IMAGE`` (the image on container backends).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, task

from gpu_provider import Checkpoint, GpuJobOperator, GpuResources, SpotFallback

#: the asset gpu_ml_pipeline's preprocess task publishes (same name there)
DATASET = Asset("gpu_ml_pipeline_dataset")
_BACKEND = os.environ.get("GPU_PIPELINE_BACKEND", "local")
_BACKENDS = ["local", "batch", "sagemaker", "kubernetes"]
_IMAGE = os.environ.get("GPU_PIPELINE_IMAGE", "")
# the job's interpreter per backend: the worker's own on the local backend, the image's elsewhere
_PYTHON = {"local": sys.executable, "batch": "python", "sagemaker": "python", "kubernetes": "python"}
#: where a run writes, next to its dataset, one folder per map index
RUN = "{{ ti.xcom_pull(task_ids='pick_dataset')['base'] }}/sweeps/{{ run_id | path_segment }}"

with DAG(
    dag_id="gpu_lr_sweep",
    description="train one model per learning rate on the latest dataset: a mapped GpuJobOperator",
    schedule=None,
    start_date=datetime(2026, 1, 5),
    catchup=False,
    tags=["gpu", "example"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    params={
        "backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend"),
        "learning_rates": Param(
            [0.3, 0.1, 0.03],
            type="array",
            items={"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            minItems=1,
            maxItems=16,
            title="Learning rates (one job each)",
        ),
        "epochs": Param(2, type="integer", minimum=1, maximum=100, title="Training epochs"),
    },
) as dag:

    @task(inlets=[DATASET])
    def pick_dataset(**context: Any) -> dict[str, str]:
        """The asset's latest dataset (or the one whose event triggered the run)."""
        from gpu_provider.examples.assets import pick_dataset

        return pick_dataset(DATASET, context)

    @task
    def plan_sweep(picked: dict[str, str], **context: Any) -> list[list[str]]:
        """One training command per learning rate; the form's values are numbers, checked by its schema."""
        from gpu_provider.templates import path_segment

        params = context["params"]
        out = f"{picked['base']}/sweeps/{path_segment(context['run_id'])}"
        python = _PYTHON[params["backend"]]
        return [
            [
                *(python, "-m", "gpu_provider.examples.train", "--data", picked["dataset"]),
                *("--out", f"{out}/lr{i}/model", "--epochs", str(int(params["epochs"])), "--lr", repr(float(lr))),
            ]
            for i, lr in enumerate(params["learning_rates"])
        ]

    train = GpuJobOperator.partial(
        task_id="train",
        backend="{{ params.backend }}",
        image=_IMAGE,
        team="research",
        resources=GpuResources(gpus=1),
        capacity=SpotFallback(after_preemptions=1, spot_wait_timeout=timedelta(minutes=10)),
        # one checkpoint folder per map index: an attempt resumes from its own learning rate's checkpoints
        checkpoint=Checkpoint(uri=RUN + "/lr{{ ti.map_index }}/checkpoints", keep=2),
        priority=10,
        max_runtime=timedelta(hours=2),
    ).expand(command=plan_sweep(pick_dataset()))
