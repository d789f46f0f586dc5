"""Runs without a logical date or data interval: a manual run triggered with ``logical_date: null`` (the UI, the
REST API) of the example pipeline, and the retraining DAG scheduled on the asset the pipeline publishes.

The asset-triggered run itself (Airflow's scheduler creating it) is in tests/integration/test_real_airflow.py.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.checker_runs import Checked, run_checks
from tests.harness import REPO, Harness

PIPELINE = REPO / "dags" / "gpu_ml_pipeline.py"
RETRAIN = REPO / "dags" / "gpu_retrain_on_new_data.py"
SWEEP = REPO / "dags" / "gpu_lr_sweep.py"


def test_the_pipeline_and_the_retraining_run_without_a_logical_date(harness: Harness) -> None:
    dags = harness.home / "dags"
    for source in (PIPELINE, RETRAIN):
        shutil.copy(source, dags / source.name)
    data_root = harness.tmp / "data"
    env = {
        "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
        "GPU_PIPELINE_DATA_ROOT": data_root.as_uri(),
    }
    before = datetime.now().astimezone()
    run = harness.run(
        dags / PIPELINE.name,
        "gpu_ml_pipeline",
        logical_date=None,
        conf={"epochs": 2, "step_delay": 0.0},
        extra_env=env,
        timeout=240,
    )
    assert run.result["logical_date"] is None
    assert run.state.endswith("success"), run.log[-4000:]
    # no data interval: the 7 days before the run was created
    prep = run.task("preprocess")["xcom"]
    weeks = {(d - timedelta(days=7)).strftime("%Y-%m-%d") for d in (before, datetime.now().astimezone())}
    assert prep["output_uri"] in {f"file://{data_root}/{week}/dataset" for week in weeks}, prep
    assert run["train"].state == "success" and run["evaluate"].state == "success"

    # the retraining DAG, triggered by hand without a logical date: it takes the asset's latest event, which
    # preprocess published with the dataset's URI
    retrain = harness.run(dags / RETRAIN.name, "gpu_retrain_on_new_data", logical_date=None, extra_env=env, timeout=240)
    assert retrain.state.endswith("success"), retrain.log[-4000:]
    picked = retrain.task("pick_dataset")["xcom"]
    assert picked["dataset"] == prep["output_uri"]
    result = retrain["retrain"].result
    week = prep["output_uri"].rsplit("/", 1)[0]
    assert result["output_uri"].startswith(f"{week}/retrain/manual__"), result
    assert result["checkpoint_uri"].startswith(f"{week}/retrain/manual__"), result
    assert (Path(result["output_uri"].removeprefix("file://")) / "model.npz").is_file()

    # the learning-rate sweep on the same dataset: a mapped task, one job per learning rate
    shutil.copy(SWEEP, dags / SWEEP.name)
    conf = {"learning_rates": [0.3, 0.1, 0.03], "epochs": 1}
    sweep = harness.run(dags / SWEEP.name, "gpu_lr_sweep", logical_date=None, conf=conf, extra_env=env, timeout=300)
    assert sweep.state.endswith("success"), sweep.log[-4000:]
    runs = [sweep[f"train[{i}]"] for i in range(3)]
    assert [r.state for r in runs] == ["success"] * 3
    names = [r.result["job_name"] for r in runs]
    assert len(set(names)) == 3 and all(f"-m{i}-" in name for i, name in enumerate(names)), names
    for i, r in enumerate(runs):
        assert (
            r.output is not None
            and r.output.startswith(f"{week}/sweeps/manual__")
            and r.output.endswith(f"/lr{i}/model")
        )
        assert r.result["checkpoint_uri"].endswith(f"/lr{i}/checkpoints")


def test_the_retraining_dag_says_what_to_do_before_any_dataset(harness: Harness) -> None:
    """A manual run before the pipeline ever published a dataset fails with what to do, and submits nothing."""
    dag_file = harness.home / "dags" / "retrain_alone.py"
    # the same DAG under another asset name: this test's metadata DB may already hold events of the real one
    dag_file.write_text(RETRAIN.read_text().replace('"gpu_ml_pipeline_dataset"', '"no_dataset_yet"'))
    run = harness.run(
        dag_file,
        "gpu_retrain_on_new_data",
        logical_date=None,
        extra_env={"AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir)},
    )
    assert run["pick_dataset"].state == "failed"
    assert "no dataset to train on" in run.log and "Run gpu_ml_pipeline first" in run.log
    assert run["retrain"].state == "upstream_failed"


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/2026-01-05/dataset", "file:///data/../etc/dataset", "file://host/data/dataset", "file:///data/x"],
)
def test_the_retraining_dag_takes_only_a_dataset_folder(uri: str) -> None:
    from gpu_provider.examples.assets import dataset_folder

    with pytest.raises(ValueError, match="is not a file:// URI of a dataset folder"):
        dataset_folder(uri)
    assert dataset_folder("file:///data/2026-01-05/dataset/") == "file:///data/2026-01-05/dataset"


SHIPPED = sorted((REPO / "dags").glob("*.py"))


@pytest.fixture(scope="module")
def shipped_checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checked]:
    """The checker (``gpu-provider check --dag``) on every shipped DAG file, all in one process."""
    folder = tmp_path_factory.mktemp("shipped")
    # the ladder example's Batch rung runs in the configured spot queue, which the default reaper then sweeps (a
    # queue of the example's own, configured nowhere, is outside the reaper's scope: the checker says so)
    env = {
        **os.environ,
        "GPU_PIPELINE_DATA_ROOT": folder.as_uri(),
        "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": "gpu-spot",
    }
    return run_checks({dag_file.name: ["--dag", str(dag_file)] for dag_file in SHIPPED}, folder, env)


@pytest.mark.parametrize("dag_file", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_dags_checkpoint_uris_render_without_a_logical_date(
    dag_file: Path, shipped_checked: dict[str, Checked]
) -> None:
    """The checker renders each checkpoint URI for a run without a logical date too, as Airflow's context has it."""
    done = shipped_checked[dag_file.name]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[FAIL]" not in done.stdout and "[????]" not in done.stdout, done.stdout
