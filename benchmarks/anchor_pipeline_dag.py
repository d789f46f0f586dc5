"""The example pipeline (``dags/gpu_ml_pipeline.py``) written with the anchor operators, for the parse benchmark.

The same five tasks, schedule, params and commands as the example DAG in its ``make demo BACKEND=aws``
shape, each stage on the service a team would pick without this provider:

    preprocess (BatchOperator) -> train (SageMakerTrainingOperator) -> batch_inference (BatchOperator)
    preprocess -> wait_for_checkpoint (S3KeySensor) -> evaluate (SageMakerTrainingOperator)

What the anchors do not offer is left out rather than written by hand: spot fallback to on-demand
(SageMaker's managed spot is set, with no on-demand fallback), team pools, priorities, the checkpoint
URI chain through XCom. Only ``benchmarks/parse_cost.py`` parses this file; it never runs (the job
definitions, queues and role it names are placeholders).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.amazon.aws.operators.batch import BatchOperator
from airflow.providers.amazon.aws.operators.sagemaker import SageMakerTrainingOperator
from airflow.providers.amazon.aws.sensors.s3 import S3KeySensor
from airflow.sdk import DAG, Param
from airflow.timetables.interval import CronDataIntervalTimetable

DATA = "s3://gpu-pipeline-data/{{ data_interval_start | ds }}"
RUN = DATA + "/runs/{{ run_id }}"
ROLE = "arn:aws:iam::123456789012:role/sagemaker-training"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:latest"


def _training(name: str, command: list[str], *, instances: int, spot: bool) -> dict[str, object]:
    """A CreateTrainingJob request running ``command`` in the trainer image."""
    config: dict[str, object] = {
        "TrainingJobName": name,
        "AlgorithmSpecification": {
            "TrainingImage": IMAGE,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": command[:1],
            "ContainerArguments": command[1:],
        },
        "RoleArn": ROLE,
        "OutputDataConfig": {"S3OutputPath": RUN + "/model"},
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": instances, "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200, **({"MaxWaitTimeInSeconds": 7800} if spot else {})},
        "EnableManagedSpotTraining": spot,
    }
    if spot:
        config["CheckpointConfig"] = {"S3Uri": RUN + "/checkpoints", "LocalPath": "/opt/ml/checkpoints"}
    return config


with DAG(
    dag_id="anchor_ml_pipeline",
    description="the example pipeline with BatchOperator, SageMakerTrainingOperator and S3KeySensor",
    schedule=CronDataIntervalTimetable("0 0 * * 1", timezone="UTC"),
    start_date=datetime(2026, 1, 5),
    catchup=False,
    max_active_runs=1,
    tags=["gpu", "benchmark"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    params={
        "epochs": Param(4, type="integer", minimum=1, maximum=100, title="Training epochs"),
        "step_delay": Param(0.05, type="number", minimum=0, maximum=10, title="Seconds per training step"),
    },
) as dag:
    preprocess = BatchOperator(
        task_id="preprocess",
        job_name="preprocess-{{ ds_nodash }}",
        job_definition="gpu-pipeline",
        job_queue="gpu-on-demand",
        container_overrides={
            "command": [
                "python",
                "-m",
                "gpu_provider.examples.preprocess",
                "--start",
                "{{ data_interval_start | ds }}",
                "--end",
                "{{ data_interval_end | ds }}",
                "--out",
                DATA + "/dataset",
            ],
            "resourceRequirements": [{"type": "GPU", "value": "1"}],
        },
        deferrable=True,
        execution_timeout=timedelta(minutes=10),
    )
    train = SageMakerTrainingOperator(
        task_id="train",
        config=_training(
            "train-{{ ds_nodash }}-{{ ti.try_number }}",
            [
                "python",
                "-m",
                "gpu_provider.examples.train",
                "--data",
                DATA + "/dataset",
                "--out",
                RUN + "/model",
                "--epochs",
                "{{ params.epochs }}",
                "--step-delay",
                "{{ params.step_delay }}",
            ],
            instances=2,
            spot=True,
        ),
        deferrable=True,
        execution_timeout=timedelta(hours=2),
    )
    infer = BatchOperator(
        task_id="batch_inference",
        job_name="infer-{{ ds_nodash }}",
        job_definition="gpu-pipeline",
        job_queue="gpu-spot",
        container_overrides={
            "command": [
                "python",
                "-m",
                "gpu_provider.examples.infer",
                "--model",
                RUN + "/model",
                "--data",
                DATA + "/dataset",
                "--out",
                RUN + "/predictions",
            ],
            "resourceRequirements": [{"type": "GPU", "value": "1"}],
        },
        deferrable=True,
        execution_timeout=timedelta(minutes=10),
    )
    wait_for_checkpoint = S3KeySensor(
        task_id="wait_for_checkpoint",
        bucket_key=RUN.replace("s3://gpu-pipeline-data/", "") + "/checkpoints/LATEST",
        bucket_name="gpu-pipeline-data",
        mode="reschedule",
        poke_interval=10,
        timeout=7200,
    )
    evaluate = SageMakerTrainingOperator(
        task_id="evaluate",
        config=_training(
            "evaluate-{{ ds_nodash }}-{{ ti.try_number }}",
            [
                "python",
                "-m",
                "gpu_provider.examples.evaluate",
                "--checkpoints",
                RUN + "/checkpoints",
                "--data",
                DATA + "/dataset",
                "--model",
                RUN + "/model",
                "--out",
                RUN + "/evaluations",
            ],
            instances=1,
            spot=False,
        ),
        deferrable=True,
        retries=0,
        execution_timeout=timedelta(hours=2, minutes=10),
    )

    preprocess >> train >> infer
    preprocess >> wait_for_checkpoint >> evaluate
