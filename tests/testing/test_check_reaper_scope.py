"""``gpu-provider check --dag`` names a ladder rung that no configured reaper sweeps (issue 36, item 6): a job left
there by a task that is gone keeps billing, since the reaper lists jobs only where its backends look."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_provider.testing.check import check_dag

ROLE = "arn:aws:iam::123456789012:role/train"
DAG = """
from airflow.sdk import DAG
from gpu_provider import Ladder, LadderRung
from gpu_provider.operators import GpuJobOperator

with DAG(dag_id="ladder_scope", schedule=None) as dag:
    GpuJobOperator(
        task_id="train",
        command=["python", "train.py"],
        image="trainer:1",
        checkpoint="s3://ckpt/{{ run_id | path_segment }}",
        capacity=Ladder(
            LadderRung("batch", "spot", spot_queue="gpu-spot", on_demand_queue="gpu-od"),
            LadderRung("sagemaker", "on_demand", aws_conn_id="aws_west", region_name="us-west-2", role_arn=ROLE),
        ),
    )
"""


def test_the_checker_names_the_rung_outside_the_reapers_scope(
    airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag_file = tmp_path / "ladder_scope.py"
    dag_file.write_text(f"ROLE = {ROLE!r}\n" + DAG)
    batch = {"name": "batch", "spot_queue": "gpu-spot", "on_demand_queue": "gpu-od"}
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS", json.dumps([batch, {"name": "sagemaker"}]))
    (finding,) = [f for f in check_dag(dag_file).findings if f.check == "reaper_scope"]
    assert (
        finding.ok is None and finding.subject == "train"
    )  # a warning: this machine's config may not be the deployment's
    assert "capacity.rungs[1] (sagemaker, on-demand) runs on sagemaker (aws_conn_id='aws_west'" in finding.message
    assert "add the rung's backend to [gpu_provider] reaper_backends" in finding.message
    assert finding.line().startswith("[????] train: every ladder rung swept by the reaper configured here: ")

    west = {"name": "sagemaker", "aws_conn_id": "aws_west", "region_name": "us-west-2"}
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS", json.dumps([batch, west]))
    (finding,) = [f for f in check_dag(dag_file).findings if f.check == "reaper_scope"]
    assert (finding.ok, finding.message) == (True, "2 rung(s) swept")
