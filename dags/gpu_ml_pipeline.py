"""Example ML pipeline: preprocess -> distributed training (2 nodes) -> batch inference, with an evaluation branch.

While training runs, a ``CheckpointSensor`` waits for its first checkpoint and an ``evaluate`` job
then evaluates every new checkpoint on the test split, until training ends::

    preprocess -> train -----------------------------> batch_inference
               -> wait_for_checkpoint -> evaluate

Every stage is a ``GpuJobOperator`` running one of the example job programs shipped in the package
(``python -m gpu_provider.examples.<stage>``), so the pipeline runs from a pip install and from a
trainer image with the package installed. The stages are chained through XCom: each job declares
its output URI (``gpu_provider.runtime.declare_output``), the operator returns it as
``output_uri``, and the next stage's command reads it with ``ti.xcom_pull``. The schedule is weekly
and every data path comes from the data interval, so a backfill retrains on past weeks; a run without
a data interval (triggered with no logical date from the UI or the REST API) takes the 7 days before
it was created. ``preprocess`` publishes the asset ``gpu_ml_pipeline_dataset`` with the new dataset's
URI, and ``gpu_retrain_on_new_data`` retrains whenever it changes.

Trigger it from the UI to get a form: the backend per stage, epochs, seconds per training step and
simulated spot interruptions. The form is user input, so it offers only choices that cannot run
another program or write elsewhere: enums and bounded numbers. The executable, the image and the
data root come from the deployment, read when the file is parsed:

* ``GPU_PIPELINE_BACKEND`` (default ``local``): the stages' default backend. Its declared
  capabilities shape the stages: where multi-node jobs cannot run on spot (AWS Batch), training is
  one node with spot fallback, else 2 nodes; where GPUs are whole only, inference takes a whole GPU,
  else it shares half of one.
* ``GPU_PIPELINE_DATA_ROOT`` (default ``file://$AIRFLOW_HOME/gpu_pipeline_data``): a ``file://`` URI
  of an absolute folder; every stage reads and writes under it, and training prunes old
  checkpoints only under it.
* ``GPU_PIPELINE_IMAGE``: the container image of the stages on container backends.
* ``GPU_PIPELINE_CHECKPOINT_ROOT`` (default: under the data root): an ``s3://bucket/prefix`` URI for
  the training checkpoints, which SageMaker needs (it syncs checkpoints with S3 only); the other
  backends and the evaluation branch read and write them there too.

``make demo`` runs it on the local backend with one simulated interruption during training;
``make demo BACKEND=batch`` on AWS Batch (an emulator), with one spot job reclaimed during training;
``make demo BACKEND=sagemaker`` on SageMaker (an emulator): 2-node training on managed spot, one
interruption, and the resume on on-demand from the checkpoint.
``make demo BACKEND=aws`` mixes them in one run: preprocessing and inference on Batch, training and
checkpoint evaluation on SageMaker (the stages' ``*_backend`` params; one AWS connection per backend).
``make demo BACKEND=kubernetes`` on Kubernetes (an emulated API server and Karpenter), training as a
2-node indexed job on spot with one node reclaimed. Inference and evaluation share a GPU where the
backend can: on Kubernetes that needs ``[gpu_provider] kubernetes_fractional_gpu_resource``.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from airflow.sdk import DAG, Asset, Param
from airflow.timetables.interval import CronDataIntervalTimetable

from gpu_provider import Checkpoint, GpuResources, SpotFallback
from gpu_provider.backends.base import backend_class
from gpu_provider.operators import GpuJobOperator
from gpu_provider.sensors import CheckpointSensor


def _data_root() -> str:
    """``GPU_PIPELINE_DATA_ROOT``, checked: a ``file://`` URI of an absolute folder (what the example jobs read)."""
    default = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "gpu_pipeline_data"
    root = os.environ.get("GPU_PIPELINE_DATA_ROOT", "").strip() or default.as_uri()
    parts = urlsplit(root)
    # the value is not echoed: it comes from the deployment's environment
    if (
        parts.scheme != "file"
        or parts.netloc
        or parts.query
        or parts.fragment
        or not parts.path.startswith("/")
        or ".." in parts.path.split("/")
        or "{" in root  # it becomes part of the stages' templates
    ):
        raise ValueError(
            "GPU_PIPELINE_DATA_ROOT must be a file:// URI of an absolute folder without '..', '{', a query or a "
            "fragment, e.g. file:///var/lib/gpu_pipeline (the example job programs read and write local files)"
        )
    return root.rstrip("/")


def _checkpoint_root() -> str:
    """``GPU_PIPELINE_CHECKPOINT_ROOT``: an ``s3://bucket/prefix`` for the checkpoints, or ``""`` (the data root)."""
    root = os.environ.get("GPU_PIPELINE_CHECKPOINT_ROOT", "").strip().rstrip("/")
    if (root and not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9_.-]+)*", root)) or ".." in root:
        raise ValueError(
            "GPU_PIPELINE_CHECKPOINT_ROOT must be an s3://bucket/prefix URI (letters, digits, '_', '.', '-' in the "
            "prefix, no '..'), e.g. s3://ml-checkpoints/gpu_pipeline"
        )
    return root


#: published by ``preprocess`` for every dataset it writes; ``dags/gpu_retrain_on_new_data.py`` is scheduled on it
DATASET = Asset("gpu_ml_pipeline_dataset")
_BACKEND = os.environ.get("GPU_PIPELINE_BACKEND", "local")
_CAPS = backend_class(_BACKEND).capabilities  # what the backend can run: read, not assumed per name
_BACKENDS = ["local", "batch", "sagemaker", "kubernetes"]  # the backends this example is shaped for
_IMAGE = os.environ.get("GPU_PIPELINE_IMAGE", "")
_DATA_ROOT = _data_root()
# The interpreter of the jobs per backend, fixed here: the worker's own on the local backend (it has
# this package), the image's `python` on container backends. A form param selects a key, never a value.
_PYTHON = {"local": sys.executable, "batch": "python", "sagemaker": "python", "kubernetes": "python"}

# The run's data window: its data interval. Runs without one (manual runs triggered with no logical date
# from the UI or the REST API, asset-triggered runs) take the 7 days before the run was created.
START = "(data_interval_start | default(dag_run.run_after - macros.timedelta(days=7), true))"
END = "(data_interval_end | default(dag_run.run_after, true))"
WEEK = _DATA_ROOT + "/{{ " + START + " | ds }}"
# run ids are chosen by whoever triggers a run and hold ':' and '+': the provider's path_segment filter
# (gpu_provider.templates) makes one storage-safe folder name of them
RUN = WEEK + "/runs/{{ run_id | path_segment }}"
CHECKPOINTS = (_checkpoint_root() + RUN[len(_DATA_ROOT) :] if _checkpoint_root() else RUN) + "/checkpoints"
MODEL = RUN + "/model"


def _stage(stage: str, backend_param: str) -> list[str]:
    """The start of a stage's command: the backend's interpreter running the packaged job program."""
    return ["{{ job_python[params." + backend_param + "] }}", "-m", f"gpu_provider.examples.{stage}"]


with DAG(
    dag_id="gpu_ml_pipeline",
    description="preprocess -> 2-node training with spot fallback and checkpoint-resume -> batch inference; "
    "each checkpoint evaluated while training runs",
    # weekly data intervals (Monday to Monday, UTC): each run trains on its week, a backfill on past weeks
    schedule=CronDataIntervalTimetable("0 0 * * 1", timezone="UTC"),
    start_date=datetime(2026, 1, 5),
    catchup=False,
    max_active_runs=1,
    tags=["gpu", "example"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    user_defined_macros={"job_python": _PYTHON},
    # The trigger form: only enums and bounded numbers (see the module docstring).
    params={
        "preprocess_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: preprocess"),
        "train_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: training"),
        "infer_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: inference"),
        "evaluate_backend": Param(_BACKEND, type="string", enum=_BACKENDS, title="Backend: checkpoint evaluation"),
        "epochs": Param(4, type="integer", minimum=1, maximum=100, title="Training epochs"),
        "step_delay": Param(
            0.05, type="number", minimum=0, maximum=10, title="Seconds per training step (slows the toy model down)"
        ),
        "simulate_preemption_after": Param(
            "",
            type="string",
            title="Simulated spot interruptions (local backend)",
            description="Seconds after start at which successive spot training attempts are interrupted, "
            "comma-separated (e.g. '4' or '4,3'); empty for none.",
            pattern=r"^(\d{1,5}(\.\d{1,3})?(,\d{1,5}(\.\d{1,3})?){0,9})?$",
        ),
    },
) as dag:
    preprocess = GpuJobOperator(
        task_id="preprocess",
        backend="{{ params.preprocess_backend }}",
        image=_IMAGE,
        command=[
            *_stage("preprocess", "preprocess_backend"),
            "--start",
            "{{ " + START + " | ds }}",
            "--end",
            "{{ " + END + " | ds }}",
            "--out",
            WEEK + "/dataset",
        ],
        resources=GpuResources(gpus=1),
        capacity="on_demand",
        team="research",
        priority=10,
        max_runtime=timedelta(minutes=10),
        # each new dataset is an asset event (its extra: the dataset's output_uri); gpu_retrain_on_new_data
        # is scheduled on it
        outlets=[DATASET],
    )

    train = GpuJobOperator(
        task_id="train",
        backend={
            "name": "{{ params.train_backend }}",
            # a LocalBackend option; renders empty (= not given) on other backends
            "simulate_preemptions": "{{ params.simulate_preemption_after if params.train_backend == 'local' else '' }}",
        },
        image=_IMAGE,
        command=[
            *_stage("train", "train_backend"),
            "--data",
            "{{ ti.xcom_pull(task_ids='preprocess')['output_uri'] }}",
            "--out",
            MODEL,
            "--epochs",
            "{{ params.epochs }}",
            "--step-delay",
            "{{ params.step_delay }}",
        ],
        # Batch cannot run multi-node jobs on spot: one node there, two elsewhere
        resources=GpuResources(gpus=1, nodes=2 if _CAPS.multi_node_spot else 1),
        capacity=SpotFallback(after_preemptions=1, spot_wait_timeout=timedelta(minutes=10)),
        checkpoint=Checkpoint(uri=CHECKPOINTS, keep=3),
        team="research",
        priority=20,
        max_runtime=timedelta(hours=2),
    )

    infer = GpuJobOperator(
        task_id="batch_inference",
        backend="{{ params.infer_backend }}",
        image=_IMAGE,
        command=[
            *_stage("infer", "infer_backend"),
            "--model",
            "{{ ti.xcom_pull(task_ids='train')['output_uri'] }}",
            "--data",
            "{{ ti.xcom_pull(task_ids='preprocess')['output_uri'] }}",
            "--out",
            RUN + "/predictions",
        ],
        # Batch gives whole GPUs; elsewhere inference shares one
        resources=GpuResources(gpus=0.5 if _CAPS.fractional_gpus else 1),
        capacity="spot",
        team="research",
        priority=10,
        max_runtime=timedelta(minutes=10),
    )

    # The evaluation branch: it starts with training's first checkpoint and ends with training.
    # Reschedule mode, not deferral: `airflow dags test` (and `make demo`) runs one task at a time and a
    # deferred task's trigger in line, so a deferred sensor picked before `train` would wait for a
    # checkpoint nobody writes. In reschedule mode it gives its slot back between looks, as deferral would.
    wait_for_checkpoint = CheckpointSensor(
        task_id="wait_for_checkpoint",
        uri=CHECKPOINTS,
        deferrable=False,
        mode="reschedule",
        poll_interval=10,
        timeout=timedelta(hours=2),
    )

    evaluate = GpuJobOperator(
        task_id="evaluate",
        backend="{{ params.evaluate_backend }}",
        image=_IMAGE,
        command=[
            *_stage("evaluate", "evaluate_backend"),
            "--checkpoints",
            CHECKPOINTS,
            "--data",
            "{{ ti.xcom_pull(task_ids='preprocess')['output_uri'] }}",
            # training has ended once its metrics.json is in this folder
            "--model",
            MODEL,
            "--out",
            RUN + "/evaluations",
            "--poll-interval",
            "1",
            # as long as training may run (its max_runtime); then the job says training did not end
            "--max-wait",
            "7200",
        ],
        resources=GpuResources(gpus=0.5 if _CAPS.fractional_gpus else 1),
        capacity="on_demand",
        team="research",
        priority=5,
        max_runtime=timedelta(hours=2, minutes=10),
        retries=0,  # a retry would wait for training again: the run's train task decides the outcome
    )

    preprocess >> train >> infer
    preprocess >> wait_for_checkpoint >> evaluate
