"""The example pipeline, end to end, as `make demo` runs it (real Airflow, real local jobs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from tests.batch_world import BatchWorld
from tests.harness import REPO, Harness


def test_dag_file_parses_without_import_errors(airflow_home: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["gpu_ml_pipeline"]
    assert [t.task_id for t in dag.topological_sort()] == ["preprocess", "train", "batch_inference"]
    train = dag.get_task("train")
    assert (train.pool, train.pool_slots, train.priority_weight) == ("gpu_research", 2, 20)
    assert {"train_backend", "epochs", "simulate_preemption_after"} <= set(dag.params)


def test_pipeline_runs_end_to_end_with_one_interruption(harness: Harness) -> None:
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(REPO / "dags" / "gpu_ml_pipeline.py", dag_file)
    data_root = harness.tmp / "data"
    conf = {
        "jobs_dir": str(REPO / "jobs"),
        "epochs": 3,
        "step_delay": 0.04,
        "simulate_preemption_after": "3",
        "data_root": f"file://{data_root}",
    }
    run = harness.run(
        dag_file,
        "gpu_ml_pipeline",
        logical_date="2026-03-02T00:00:00+00:00",
        conf=conf,
        extra_env={"AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir)},
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


def test_pipeline_runs_on_batch_with_a_reclaimed_spot_host(harness: Harness, batch: BatchWorld) -> None:
    """`make demo BACKEND=batch` as a test: every stage is a Batch job; the spot training host is reclaimed."""
    dag_file = harness.home / "dags" / "gpu_ml_pipeline.py"
    shutil.copy(REPO / "dags" / "gpu_ml_pipeline.py", dag_file)
    data_root = harness.tmp / "data"
    batch.emulator.preempt_after(2.0, queue=batch.setup.spot_queue, name_contains="-train-")
    conf = {"jobs_dir": str(REPO / "jobs"), "epochs": 3, "step_delay": 0.04, "data_root": f"file://{data_root}"}
    run = harness.run(
        dag_file,
        "gpu_ml_pipeline",
        logical_date="2026-03-02T00:00:00+00:00",
        conf=conf,
        extra_env={
            "GPU_PIPELINE_BACKEND": "batch",
            "GPU_PIPELINE_IMAGE": "gpu-pipeline:test",
            "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": batch.setup.spot_queue,
            "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": batch.setup.on_demand_queue,
            "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "0.5",
        },
    )
    assert run.result["state"].endswith("success"), run.log[-4000:]
    prep, train, infer = (run.task(t)["xcom"] for t in ("preprocess", "train", "batch_inference"))
    assert {prep["backend"], train["backend"], infer["backend"]} == {"batch"}
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
    assert [b["jobQueue"] for b in submits] == [
        batch.setup.on_demand_queue,
        batch.setup.spot_queue,
        batch.setup.on_demand_queue,
        batch.setup.spot_queue,
    ]
    metrics = json.loads((Path(infer["output_uri"].removeprefix("file://")) / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.8
