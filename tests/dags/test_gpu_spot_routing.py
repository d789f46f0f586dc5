"""The spot routing example (dags/gpu_spot_routing.py) under dag.test: spot capacity there -> the spot
branch; not there in time -> the sensor is skipped and the on-demand branch runs. The sensor waits
deferred (its trigger runs inline in dag.test) against the EC2 emulator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
from tests.ec2_world import ec2_connection_env
from tests.harness import REPO, Harness

DAG_FILE = REPO / "dags" / "gpu_spot_routing.py"
HEAVY = ("boto3", "botocore")


def _run(harness: Harness, ec2: Ec2SpotEmulator, wait_s: float) -> object:
    dag_file = harness.home / "dags" / "gpu_spot_routing.py"
    shutil.copy(DAG_FILE, dag_file)
    env = {
        **ec2_connection_env(ec2),
        "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
        "GPU_SPOT_WAIT_S": str(wait_s),
        "GPU_SPOT_POLL_S": "0.3",
    }
    return harness.run(dag_file, "gpu_spot_routing", extra_env=env)


def _raise_scores_once_deferred(ec2: Ec2SpotEmulator) -> threading.Thread:
    """Set a high score once the worker and the trigger have each read a low one, so success comes deferred."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            answered = [r for r in ec2.requests("GetSpotPlacementScores") if r["status"] is not None]
            if len(answered) >= 2:  # the worker's reading and the trigger's first (answers computed before status)
                break
            time.sleep(0.05)
        ec2.set_scores({"us-east-1": 4, "us-west-2": 9})

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_capacity_there_runs_the_spot_branch(harness: Harness, ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 4, "us-west-2": 2})
    watcher = _raise_scores_once_deferred(ec2_spot)
    run = _run(harness, ec2_spot, wait_s=60)
    watcher.join(5)
    assert run.result["state"].endswith("success"), run.log[-4000:]  # type: ignore[attr-defined]
    states = {t: v["state"] for t, v in run.result["tasks"].items()}  # type: ignore[attr-defined]
    assert states == {
        "wait_for_spot": "success",
        "choose_capacity": "success",
        "train_spot": "success",
        "train_on_demand": "skipped",
        "report": "success",
    }
    found = run.task("wait_for_spot")["xcom"]  # type: ignore[attr-defined]
    assert (found["satisfied_by"], found["region"], found["score"]) == ("score", "us-west-2", 9)
    assert run.task("report")["xcom"] == {"ran": "train_spot", "capacity": "spot"}  # type: ignore[attr-defined]
    assert "training on spot capacity in us-west-2" in run.log  # type: ignore[attr-defined]
    assert "Spot capacity found: spot placement scores: us-east-1 4, us-west-2 9" in run.log  # type: ignore[attr-defined]
    assert len(ec2_spot.requests("GetSpotPlacementScores")) >= 3  # worker, then the trigger until the score came
    asked = ec2_spot.requests("GetSpotPlacementScores")[0]["body"]
    assert (asked["TargetCapacity"], asked["InstanceType.1"], asked["InstanceType.2"]) == (
        "4",
        "g5.2xlarge",
        "g6.2xlarge",
    )


def test_no_capacity_in_time_runs_the_on_demand_branch(harness: Harness, ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 3, "us-west-2": 5})
    ec2_spot.set_price("us-east-1", "us-east-1a", "g5.2xlarge", 0.95)
    run = _run(harness, ec2_spot, wait_s=1.5)
    assert run.result["state"].endswith("success"), run.log[-4000:]  # type: ignore[attr-defined]
    states = {t: v["state"] for t, v in run.result["tasks"].items()}  # type: ignore[attr-defined]
    assert states == {
        "wait_for_spot": "skipped",
        "choose_capacity": "success",
        "train_spot": "skipped",
        "train_on_demand": "success",
        "report": "success",
    }
    assert run.task("report")["xcom"] == {"ran": "train_on_demand", "capacity": "on-demand"}  # type: ignore[attr-defined]
    # it read in the worker, deferred, and read again in the trigger (which reads before it looks at the clock)
    assert len(ec2_spot.requests("GetSpotPlacementScores")) >= 2
    assert "No spot capacity" in run.log  # type: ignore[attr-defined]


def test_parsing_the_dag_file_does_not_import_boto3() -> None:
    code = (
        "import sys, json, runpy\n"
        f"runpy.run_path({str(DAG_FILE)!r})\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_dag_file_parses(airflow_home: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    dag = bag.dags["gpu_spot_routing"]
    sensor = dag.get_task("wait_for_spot")
    assert (sensor.timeout, sensor.soft_fail, sensor.deferrable) == (1800, True, True)
    assert dag.get_task("choose_capacity").trigger_rule == "none_failed"
