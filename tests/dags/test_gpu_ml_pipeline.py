"""The example pipeline, end to end, as `make demo` runs it (real Airflow, real local jobs), and its trigger form."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.batch_world import BatchWorld
from tests.harness import REPO, Harness
from tests.sagemaker_world import CHECKPOINT_BUCKET, SageMakerWorld

DAG_FILE = REPO / "dags" / "gpu_ml_pipeline.py"
#: what the trigger form offers: backends (enums), epochs and pacing (bounded numbers), a checked list of seconds
FORM = {
    "preprocess_backend",
    "train_backend",
    "infer_backend",
    "evaluate_backend",
    "epochs",
    "step_delay",
    "simulate_preemption_after",
}


def load_dag(monkeypatch: pytest.MonkeyPatch, **env: str) -> Any:
    """The DAG as a DAG processor parses it, with ``env`` as the deployment's environment."""
    from airflow.dag_processing.dagbag import DagBag

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    return bag.dags["gpu_ml_pipeline"]


def test_dag_file_parses_without_import_errors(airflow_home: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    dag = bag.dags["gpu_ml_pipeline"]
    assert {t.task_id: t.upstream_task_ids for t in dag.tasks} == {
        "preprocess": set(),
        "train": {"preprocess"},
        "batch_inference": {"train"},
        # the evaluation branch runs next to training, not after it
        "wait_for_checkpoint": {"preprocess"},
        "evaluate": {"wait_for_checkpoint"},
    }
    train = dag.get_task("train")
    sensor = dag.get_task("wait_for_checkpoint")
    assert sensor.uri == train.checkpoint_uri and sensor.mode == "reschedule"
    assert (train.pool, train.pool_slots, train.priority_weight) == ("gpu_research", 2, 20)
    assert {"train_backend", "epochs", "simulate_preemption_after"} <= set(dag.params)


def test_pipeline_runs_end_to_end_with_one_interruption(harness: Harness) -> None:
    """`make demo` as a test. The run is also sent the keys the form once had (interpreter, job folder, data
    root, image): they change nothing."""
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(DAG_FILE, dag_file)
    data_root = harness.tmp / "data"
    elsewhere, marker, canary = _conf_keys_outside_the_form(harness.tmp)
    conf = {"epochs": 3, "step_delay": 0.04, "simulate_preemption_after": "3", **canary}
    run = harness.run(
        dag_file,
        "gpu_ml_pipeline",
        logical_date="2026-03-02T00:00:00+00:00",
        conf=conf,
        extra_env={
            "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
            "GPU_PIPELINE_DATA_ROOT": data_root.as_uri(),
        },
    )
    assert run.result["state"].endswith("success"), run.log[-4000:]
    prep, train, infer = (run.task(t)["xcom"] for t in ("preprocess", "train", "batch_inference"))
    # the data interval of the run is the week before 2026-03-02, and the data path says so
    assert prep["output_uri"] == f"file://{data_root}/2026-02-23/dataset"
    assert [(a["capacity"], a["state"]) for a in train["attempts"]] == [
        ("spot", "PREEMPTED"),
        ("on-demand", "SUCCEEDED"),
    ]
    assert int(train["attempts"][1]["resume_from"].rsplit("ckpt-", 1)[1]) > 0
    assert "resumed from checkpoint ckpt-" in run.log
    model = Path(train["output_uri"].removeprefix("file://"))
    with np.load(model / "model.npz") as params:
        assert {"w1", "b1", "w2", "b2"} <= set(params.files)
    metrics = json.loads((Path(infer["output_uri"].removeprefix("file://")) / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.8
    _check_evaluation(run, train)
    # the keys outside the form had no effect
    assert not marker.exists(), "the interpreter from the conf ran"
    assert not elsewhere.exists(), "something was written under the data root from the conf"
    outputs = [run.task(t)["xcom"]["output_uri"] for t in ("preprocess", "train", "batch_inference", "evaluate")]
    assert all(uri.startswith(data_root.as_uri() + "/2026-02-23/") for uri in outputs), outputs


def _conf_keys_outside_the_form(tmp: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Conf keys the form once had, pointing elsewhere, and a canary interpreter that leaves a marker when it
    runs: (the folder they name, the marker, the keys)."""
    elsewhere, marker = tmp / "elsewhere", tmp / "ran"
    canary = tmp / "canary.sh"
    canary.write_text(f"#!/bin/sh\ntouch {marker}\n")
    canary.chmod(0o755)
    keys = {
        "python": str(canary),
        "jobs_dir": str(elsewhere),
        "data_root": elsewhere.as_uri(),
        "image": "attacker/image:latest",
    }
    return elsewhere, marker, keys


def _check_evaluation(run: Any, train: dict[str, Any]) -> None:
    """The evaluation branch: the sensor saw a published checkpoint of this run's training, the job evaluated
    checkpoints of that run and stopped because training ended."""
    seen, evaluate = run.task("wait_for_checkpoint")["xcom"], run.task("evaluate")["xcom"]
    assert seen["checkpoint"].startswith(train["checkpoint_uri"] + "/ckpt-") and seen["step"] > 0
    assert evaluate["state"] == "SUCCEEDED" and evaluate["capacity"] == "on-demand"
    report = json.loads((Path(evaluate["output_uri"].removeprefix("file://")) / "evaluations.json").read_text())
    assert report["training_finished"] is True
    steps = [e["step"] for e in report["evaluations"]]
    assert steps and steps == sorted(set(steps)) and steps[-1] >= seen["step"], steps
    assert all(e["checkpoint"].startswith(train["checkpoint_uri"] + "/ckpt-") for e in report["evaluations"])
    assert report["best"]["test_accuracy"] > 0.8


def test_pipeline_runs_on_batch_with_a_reclaimed_spot_host(harness: Harness, batch: BatchWorld) -> None:
    """`make demo BACKEND=batch` as a test: every stage is a Batch job; the spot training host is reclaimed."""
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(DAG_FILE, dag_file)
    data_root = harness.tmp / "data"
    batch.emulator.preempt_after(2.0, queue=batch.setup.spot_queue, name_contains="-train-")
    conf = {"epochs": 3, "step_delay": 0.04}
    run = harness.run(
        dag_file,
        "gpu_ml_pipeline",
        logical_date="2026-03-02T00:00:00+00:00",
        conf=conf,
        extra_env={
            "GPU_PIPELINE_DATA_ROOT": data_root.as_uri(),
            "GPU_PIPELINE_BACKEND": "batch",
            "GPU_PIPELINE_IMAGE": "gpu-pipeline:test",
            "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": batch.setup.spot_queue,
            "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": batch.setup.on_demand_queue,
            "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "0.5",
        },
    )
    assert run.result["state"].endswith("success"), run.log[-4000:]
    prep, train, infer, evaluate = (run.task(t)["xcom"] for t in ("preprocess", "train", "batch_inference", "evaluate"))
    assert {prep["backend"], train["backend"], infer["backend"], evaluate["backend"]} == {"batch"}
    assert prep["output_uri"] == f"file://{data_root}/2026-02-23/dataset", "declared in the job's log"
    assert [(a["capacity"], a["state"], a["queue"]) for a in train["attempts"]] == [
        ("spot", "PREEMPTED", batch.setup.spot_queue),
        ("on-demand", "SUCCEEDED", batch.setup.on_demand_queue),
    ]
    assert train["attempts"][0]["reason"].startswith("Host EC2 (instance i-")
    assert int(train["attempts"][1]["resume_from"].rsplit("ckpt-", 1)[1]) > 0
    # the stages were shaped for Batch: one training node, a whole GPU for inference, an image
    definitions = {b["jobDefinitionName"].split("-")[3]: b for b in batch.bodies("RegisterJobDefinition")}
    assert {d["type"] for d in definitions.values()} == {"container"}
    assert {d["containerProperties"]["image"] for d in definitions.values()} == {"gpu-pipeline:test"}
    submits = batch.bodies("SubmitJob")
    assert [b["jobQueue"] for b in submits if "-evaluate-" in b["jobName"]] == [batch.setup.on_demand_queue]
    assert [b["jobQueue"] for b in submits if "-evaluate-" not in b["jobName"]] == [
        batch.setup.on_demand_queue,
        batch.setup.spot_queue,
        batch.setup.on_demand_queue,
        batch.setup.spot_queue,
    ]
    metrics = json.loads((Path(infer["output_uri"].removeprefix("file://")) / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.8
    _check_evaluation(run, train)


def test_pipeline_runs_on_sagemaker_with_an_interrupted_spot_training(
    harness: Harness, sagemaker: SageMakerWorld
) -> None:
    """`make demo BACKEND=sagemaker` as a test: every stage is a training job; 2-node spot training is
    interrupted once, stopped, and resumed on-demand from the checkpoint SageMaker synced to S3."""
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(DAG_FILE, dag_file)
    data_root = harness.tmp / "data"
    sagemaker.emulator.interrupt_after(1.5, name_contains="-train-", checkpointed=True)
    run = harness.run(
        dag_file,
        "gpu_ml_pipeline",
        logical_date="2026-03-02T00:00:00+00:00",
        conf={"epochs": 3, "step_delay": 0.04},
        extra_env={
            "GPU_PIPELINE_DATA_ROOT": data_root.as_uri(),
            "GPU_PIPELINE_BACKEND": "sagemaker",
            "GPU_PIPELINE_IMAGE": "gpu-pipeline:test",
            "GPU_PIPELINE_CHECKPOINT_ROOT": f"s3://{CHECKPOINT_BUCKET}/pipeline",
            "AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN": sagemaker.options["role_arn"],
            "AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH": sagemaker.options["output_path"],
            "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "0.5",
        },
        timeout=300,
    )
    assert run.result["state"].endswith("success"), run.log[-4000:]
    prep, train, infer, evaluate = (run.task(t)["xcom"] for t in ("preprocess", "train", "batch_inference", "evaluate"))
    assert {prep["backend"], train["backend"], infer["backend"], evaluate["backend"]} == {"sagemaker"}
    assert prep["output_uri"] == f"file://{data_root}/2026-02-23/dataset", "the job's declaration wins"
    assert [(a["capacity"], a["state"], a["interruption"], a["restarts"]) for a in train["attempts"]] == [
        ("spot", "CANCELLED", "preempted", 1),
        ("on-demand", "SUCCEEDED", None, 0),
    ]
    assert int(train["attempts"][1]["resume_from"].rsplit("ckpt-", 1)[1]) > 0
    assert train["checkpoint_uri"].startswith(f"s3://{CHECKPOINT_BUCKET}/pipeline/2026-02-23/runs/")
    creates = {b["TrainingJobName"]: b for b in sagemaker.bodies("CreateTrainingJob")}
    training = [b for name, b in creates.items() if "-train-" in name]
    assert [(b["ResourceConfig"]["InstanceCount"], b["EnableManagedSpotTraining"]) for b in training] == [
        (2, True),
        (2, False),
    ]
    assert {b["CheckpointConfig"]["S3Uri"] for b in training} == {train["checkpoint_uri"]}
    assert {b["AlgorithmSpecification"]["TrainingImage"] for b in creates.values()} == {"gpu-pipeline:test"}
    metrics = json.loads((Path(infer["output_uri"].removeprefix("file://")) / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.8
    assert evaluate["output_uri"].startswith("file://")


def test_pipeline_mixes_batch_and_sagemaker_in_one_run(
    batch: BatchWorld, sagemaker: SageMakerWorld, harness: Harness
) -> None:
    """`make demo BACKEND=aws` as a test: preprocessing and inference on Batch (its own connection),
    2-node spot training interrupted once and resumed on-demand on SageMaker, evaluation there too."""
    # its own run and checkpoint folder: the SageMaker-only test may have left a finished training
    # of the 2026-03-02 run in this session's emulator, and resuming from it would leave nothing to interrupt
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(DAG_FILE, dag_file)
    setup = batch.emulator.create_environment(fair_share=False)
    sagemaker.emulator.interrupt_after(1.5, name_contains="-train-", checkpointed=True)
    extra = {"endpoint_url": batch.emulator.endpoint_url, "region_name": batch.emulator.region}
    stages = {"preprocess": "batch", "train": "sagemaker", "evaluate": "sagemaker", "infer": "batch"}
    run = harness.run(
        dag_file,
        "gpu_ml_pipeline",
        logical_date="2026-03-09T00:00:00+00:00",
        conf={"epochs": 3, "step_delay": 0.04, **{f"{k}_backend": v for k, v in stages.items()}},
        extra_env={
            "GPU_PIPELINE_DATA_ROOT": (harness.tmp / "data").as_uri(),
            "GPU_PIPELINE_BACKEND": "sagemaker",
            "GPU_PIPELINE_IMAGE": "gpu-pipeline:test",
            "GPU_PIPELINE_CHECKPOINT_ROOT": f"s3://{CHECKPOINT_BUCKET}/pipeline-mixed",
            "AIRFLOW_CONN_AWS_BATCH": json.dumps({"conn_type": "aws", "extra": extra}),
            "AIRFLOW__GPU_PROVIDER__BATCH_AWS_CONN_ID": "aws_batch",
            "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": setup.spot_queue,
            "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": setup.on_demand_queue,
            "AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN": sagemaker.options["role_arn"],
            "AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH": sagemaker.options["output_path"],
            "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "0.5",
        },
        timeout=300,
    )
    assert run.result["state"].endswith("success"), run.log[-4000:]
    tasks = {"preprocess": "preprocess", "train": "train", "evaluate": "evaluate", "infer": "batch_inference"}
    results = {stage: run.task(task)["xcom"] for stage, task in tasks.items()}
    assert {stage: r["backend"] for stage, r in results.items()} == stages
    train = results["train"]
    assert [(a["capacity"], a["state"], a["interruption"], a["restarts"]) for a in train["attempts"]] == [
        ("spot", "CANCELLED", "preempted", 1),
        ("on-demand", "SUCCEEDED", None, 0),
    ]
    assert int(train["attempts"][1]["resume_from"].rsplit("ckpt-", 1)[1]) > 0
    assert [b["jobQueue"] for b in batch.bodies("SubmitJob")] == [setup.on_demand_queue, setup.spot_queue]
    training = [b for b in sagemaker.bodies("CreateTrainingJob") if "-train-" in b["TrainingJobName"]]
    assert [b["ResourceConfig"]["InstanceCount"] for b in training] == [2, 2]


# ------------------------------------------------------------------------------------------ the trigger form


def test_the_form_offers_no_executable_image_or_path(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dag = load_dag(monkeypatch)
    assert set(dag.params) == FORM
    for name in FORM:
        schema = dag.params.get_param(name).schema
        bounded = "enum" in schema or "pattern" in schema or {"minimum", "maximum"} <= set(schema)
        assert bounded, f"param {name} accepts free input: {schema}"
    # every params.<name> the tasks use is one of the form's checked params
    used = {
        name
        for task in dag.tasks
        for field in task.template_fields
        for name in re.findall(r"params\.(\w+)", json.dumps(getattr(task, field), default=str))
    }
    assert used <= FORM, used - FORM
    # the executable is chosen by the backend enum from values fixed in the DAG file; the program is a module
    jobs = [task for task in dag.tasks if task.task_id != "wait_for_checkpoint"]
    assert len(jobs) == 4
    for task in jobs:
        stage = task.task_id.replace("batch_inference", "infer")
        assert task.command[:3] == [
            f"{{{{ job_python[params.{stage}_backend] }}}}",
            "-m",
            f"gpu_provider.examples.{stage}",
        ]
    assert dag.user_defined_macros["job_python"] == {
        "local": sys.executable,
        "batch": "python",
        "sagemaker": "python",
        "kubernetes": "python",
    }


@pytest.mark.parametrize(
    "conf",
    [
        {"train_backend": "/bin/sh"},
        {"simulate_preemption_after": "4; touch /tmp/x"},
        {"simulate_preemption_after": "{{ 7 * 7 }}"},
        {"epochs": 10**9},
        {"step_delay": 1e308},
        {"step_delay": -1},
    ],
    ids=["backend", "shell", "template", "epochs", "step-delay-huge", "step-delay-negative"],
)
def test_hostile_form_values_are_refused(
    conf: dict[str, Any], airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError
    from airflow.serialization.serialized_objects import DagSerialization

    # the DAG as the scheduler and the API server hold it; creating a run with `conf` validates it like this
    dag = DagSerialization.from_dict(DagSerialization.to_dict(load_dag(monkeypatch)))
    with pytest.raises(ParamValidationError):
        dag.params.deep_merge(conf).validate()
    dag.params.deep_merge({"train_backend": "batch", "simulate_preemption_after": "4,3.5", "epochs": 2}).validate()


def test_a_run_with_a_hostile_backend_is_refused_before_any_job(harness: Harness) -> None:
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(DAG_FILE, dag_file)
    proc, out, log = harness.start(
        dag_file,
        "gpu_ml_pipeline",
        conf={"preprocess_backend": "/bin/sh"},
        extra_env={"AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir)},
    )
    assert proc.wait(timeout=120) != 0
    assert not out.exists()
    assert "ParamValidationError" in log.read_text()
    assert not (harness.state_dir / "jobs").exists() or not any((harness.state_dir / "jobs").iterdir())


@pytest.mark.parametrize(
    "root",
    ["s3://bucket/data", "file://host/data", "data/relative", "file:///srv/../etc", "file:///srv/{{ params.x }}"],
)
def test_a_bad_data_root_from_the_deployment_fails_the_parse(
    root: str, airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("GPU_PIPELINE_DATA_ROOT", root)
    errors = DagBag(dag_folder=str(DAG_FILE)).import_errors
    (message,) = errors.values()
    assert "GPU_PIPELINE_DATA_ROOT must be a file:// URI of an absolute folder" in message
    assert root not in message, "the environment's value is not echoed"


def test_a_run_id_becomes_one_folder_name(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_provider.templates import path_segment as segment

    train = load_dag(monkeypatch).get_task("train")  # the DAG sets no filter: the operator brings it
    rendered = train.render_template("{{ run_id | path_segment }}", {"run_id": "scheduled__2026-03-02T00:00:00+00:00"})
    assert rendered == "scheduled__2026-03-02T00-00-00_00-00"
    assert segment("manual__2026-03-02T00:00:00+00:00") == "manual__2026-03-02T00-00-00_00-00"
    assert segment("../../etc/cron.d") == "______etc_cron_d"


def test_parsing_the_dag_imports_no_job_code(tmp_path: Path) -> None:
    code = (
        "import runpy, sys\n"
        f"runpy.run_path({str(DAG_FILE)!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('numpy', 'gpu_provider.examples'))))\n"
    )
    env = {**os.environ, "GPU_PIPELINE_DATA_ROOT": tmp_path.as_uri()}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
