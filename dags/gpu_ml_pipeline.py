"""Example ML pipeline: preprocess -> distributed training (2 nodes) -> batch inference.

Every stage is a ``GpuJobOperator``. The stages are chained through XCom: each job declares its
output URI (``gpu_provider.runtime.declare_output``), the operator returns it as ``output_uri``,
and the next stage's command reads it with ``ti.xcom_pull``. The schedule is weekly and every data
path comes from the data interval, so a backfill retrains on past weeks.

Trigger it from the UI to get a form (backend per stage, epochs, simulated spot interruption).
``make demo`` runs it on the local backend with one simulated interruption during training;
``make demo BACKEND=batch`` on AWS Batch (an emulator), with one spot job reclaimed during training.

Which backend a deployment runs the stages on by default is read when the file is parsed, from
``GPU_PIPELINE_BACKEND`` (default ``local``), because it shapes the stages: AWS Batch gives whole
GPUs only and cannot run multi-node jobs on spot, so there training is one node with spot
fallback and inference takes a whole GPU; elsewhere training runs on 2 nodes and inference
shares half a GPU. ``GPU_PIPELINE_IMAGE`` is the container image of the stages on container
backends.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param
from airflow.timetables.interval import CronDataIntervalTimetable

from gpu_provider import Checkpoint, GpuResources, SpotFallback
from gpu_provider.operators import GpuJobOperator

# Defaults for the local backend: this interpreter and the job programs in this repository.
# On a container backend, set the params python=python and jobs_dir=<where the image has them>.
_REPO = Path(__file__).resolve().parent.parent
_DATA_ROOT = os.environ.get(
    "GPU_PIPELINE_DATA_ROOT",
    "file://" + str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "gpu_pipeline_data"),
)
_BACKEND = os.environ.get("GPU_PIPELINE_BACKEND", "local")
_ON_BATCH = _BACKEND == "batch"
_BACKENDS = ["local", "batch"]  # the backends this example is shaped for

WEEK = "{{ params.data_root }}/{{ data_interval_start | ds }}"
RUN = WEEK + "/runs/{{ run_id | replace(':', '-') | replace('+', '_') }}"

with DAG(
    dag_id="gpu_ml_pipeline",
    description="preprocess -> 2-node training with spot fallback and checkpoint-resume -> batch inference",
    # weekly data intervals (Monday to Monday, UTC): each run trains on its week, a backfill on past weeks
    schedule=CronDataIntervalTimetable("0 0 * * 1", timezone="UTC"),
    start_date=datetime(2026, 1, 5),
    catchup=False,
    max_active_runs=1,
    tags=["gpu", "example"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    params={
        "preprocess_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: preprocess"),
        "train_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: training"),
        "infer_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: inference"),
        "image": Param(
            os.environ.get("GPU_PIPELINE_IMAGE", ""),
            type="string",
            title="Container image of the jobs (container backends such as batch; unused locally)",
        ),
        "epochs": Param(4, type="integer", minimum=1, maximum=100, title="Training epochs"),
        "step_delay": Param(
            0.05, type="number", minimum=0, title="Seconds per training step (slows the toy model down)"
        ),
        "simulate_preemption_after": Param(
            "",
            type="string",
            title="Simulated spot interruptions (local backend)",
            description="Seconds after start at which successive spot training attempts are interrupted, "
            "comma-separated (e.g. '4' or '4,3'); empty for none.",
        ),
        "data_root": Param(
            _DATA_ROOT, type="string", title="Data root (a file:// URI; the example jobs read and write files)"
        ),
        "python": Param(sys.executable, type="string", title="Python interpreter of the jobs"),
        "jobs_dir": Param(str(_REPO / "jobs"), type="string", title="Folder holding the job programs"),
    },
) as dag:
    preprocess = GpuJobOperator(
        task_id="preprocess",
        backend="{{ params.preprocess_backend }}",
        image="{{ params.image }}",
        command=[
            "{{ params.python }}",
            "{{ params.jobs_dir }}/preprocess.py",
            "--start",
            "{{ data_interval_start | ds }}",
            "--end",
            "{{ data_interval_end | ds }}",
            "--out",
            WEEK + "/dataset",
        ],
        resources=GpuResources(gpus=1),
        capacity="on_demand",
        team="research",
        priority=10,
        max_runtime=timedelta(minutes=10),
    )

    train = GpuJobOperator(
        task_id="train",
        backend={
            "name": "{{ params.train_backend }}",
            # a LocalBackend option; renders empty (= not given) on other backends
            "simulate_preemptions": "{{ params.simulate_preemption_after if params.train_backend == 'local' else '' }}",
        },
        image="{{ params.image }}",
        command=[
            "{{ params.python }}",
            "{{ params.jobs_dir }}/train.py",
            "--data",
            "{{ ti.xcom_pull(task_ids='preprocess')['output_uri'] }}",
            "--out",
            RUN + "/model",
            "--epochs",
            "{{ params.epochs }}",
            "--step-delay",
            "{{ params.step_delay }}",
        ],
        # Batch cannot run multi-node jobs on spot: one node there, two elsewhere
        resources=GpuResources(gpus=1, nodes=1 if _ON_BATCH else 2),
        capacity=SpotFallback(after_preemptions=1, spot_wait_timeout=timedelta(minutes=10)),
        checkpoint=Checkpoint(uri=RUN + "/checkpoints", keep=3),
        team="research",
        priority=20,
        max_runtime=timedelta(hours=2),
    )

    infer = GpuJobOperator(
        task_id="batch_inference",
        backend="{{ params.infer_backend }}",
        image="{{ params.image }}",
        command=[
            "{{ params.python }}",
            "{{ params.jobs_dir }}/infer.py",
            "--model",
            "{{ ti.xcom_pull(task_ids='train')['output_uri'] }}",
            "--data",
            "{{ ti.xcom_pull(task_ids='preprocess')['output_uri'] }}",
            "--out",
            RUN + "/predictions",
        ],
        # Batch gives whole GPUs; elsewhere inference shares one
        resources=GpuResources(gpus=1 if _ON_BATCH else 0.5),
        capacity="spot",
        team="research",
        priority=10,
        max_runtime=timedelta(minutes=10),
    )

    preprocess >> train >> infer
