"""The capacity ladder example (dags/gpu_capacity_ladder.py): it parses with its rungs checked, and runs on the
AWS emulators: training reclaimed on Batch spot, then on SageMaker managed spot, finished on SageMaker on-demand."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from gpu_provider.testing.worlds import AwsWorld
from tests.harness import REPO, Harness
from tests.operators.test_capacity_ladder import Reclaimer

DAG_FILE = REPO / "dags" / "gpu_capacity_ladder.py"


def test_the_example_parses_with_a_three_rung_ladder_on_one_s3_checkpoint(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from gpu_provider import Ladder

    monkeypatch.delenv("AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE", raising=False)
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    dag = bag.dags["gpu_capacity_ladder"]
    assert {t.task_id: t.upstream_task_ids for t in dag.tasks} == {
        "preprocess": set(),
        "train": {"preprocess"},
        "report": {"train"},
    }
    train = dag.get_task("train")
    assert isinstance(train.capacity, Ladder)
    assert [(r.backend_name, r.capacity) for r in train.capacity.rungs] == [
        ("batch", "spot"),
        ("sagemaker", "spot"),
        ("sagemaker", "on-demand"),
    ]
    assert train.checkpoint_uri.startswith("s3://gpu-ladder-checkpoints/ladder/")
    # a bad checkpoint root from the deployment fails the parse, without echoing it
    monkeypatch.setenv("GPU_LADDER_CHECKPOINT_ROOT", "file:///tmp/secret-path")
    bag = DagBag(dag_folder=str(DAG_FILE))
    (error,) = bag.import_errors.values()
    assert "GPU_LADDER_CHECKPOINT_ROOT must be an s3://bucket/prefix URI" in error and "secret-path" not in error


def test_the_example_moves_down_the_ladder_and_finishes_on_sagemaker_on_demand(
    harness: Harness, gpu_aws: AwsWorld
) -> None:
    dag_file = harness.home / "dags" / "gpu_capacity_ladder.py"
    shutil.copy(DAG_FILE, dag_file)
    prefix = f"example-ladder-{uuid.uuid4().hex[:8]}"
    env = {
        **gpu_aws.env(),
        "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
        "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "0.3",
        "GPU_LADDER_CHECKPOINT_ROOT": f"s3://{gpu_aws.checkpoint_bucket}/{prefix}",
        "GPU_LADDER_WORK_ROOT": (harness.tmp / "work").as_uri(),
        "GPU_LADDER_IMAGE": "gpu-pipeline:test",
        # paced: unpaced, the SageMaker spot attempt could finish its last steps before its reclaim (a full run)
        "GPU_LADDER_STEP_DELAY": "0.05",
    }
    with Reclaimer(gpu_aws, prefix, "gpu-capacity-l") as reclaimer:
        run = harness.run(dag_file, "gpu_capacity_ladder", extra_env=env, timeout=300)
    assert reclaimer.error is None, reclaimer.error
    assert run.result["state"].endswith("success"), run.log[-6000:]
    report = run.task("report")["xcom"]
    assert [tuple(a) for a in report["attempts"]] == [
        ("batch", "AWS Batch", "spot", "PREEMPTED", "preempted"),
        ("sagemaker", "Amazon SageMaker", "spot", "CANCELLED", "preempted"),
        ("sagemaker", "Amazon SageMaker", "on-demand", "SUCCEEDED", None),
    ]
    assert report["services"] == ["batch", "sagemaker"]
    assert list((harness.tmp / "work").glob("*/model/model.npz")), "the model was written"
