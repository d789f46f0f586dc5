"""The instance fallback example (dags/gpu_instance_fallback.py) under dag.test, on a machine whose
nvidia-smi lists two L40S and no H100 or A100: the attempts on p5 and p4d wait for GPUs that never come
and are given up after their capacity wait; the third runs on g6e's L40S, still on spot."""

from __future__ import annotations

import shutil

from tests.harness import REPO, Harness

DAG_FILE = REPO / "dags" / "gpu_instance_fallback.py"


def test_the_task_runs_on_the_first_type_this_machine_has(harness: Harness) -> None:
    smi = harness.tmp / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=index,name) printf '0, NVIDIA L40S\\n1, NVIDIA L40S\\n' ;;\n"
        "  *) printf '0\\n1\\n' ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    dag_file = harness.home / "dags" / "gpu_instance_fallback.py"
    shutil.copy(DAG_FILE, dag_file)
    env = {
        "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir),
        # long enough for the local supervisor to start and place the L40S job on a loaded machine (its start
        # counts toward the capacity wait, as a service's own start-up does); p5 and p4d wait it out in full
        "GPU_CAPACITY_WAIT_S": "6",
        "GPU_EXAMPLE_NVIDIA_SMI": str(smi),
    }
    run = harness.run(dag_file, "gpu_instance_fallback", extra_env=env)
    assert run.result["state"].endswith("success"), run.log[-4000:]
    report = run.task("report")["xcom"]
    assert [tuple(t) for t in report["tried"]] == [
        ("spot", "p5.48xlarge", "capacity_timeout"),
        ("spot", "p4d.24xlarge", "capacity_timeout"),
        ("spot", "g6e.48xlarge", None),
    ]
    assert report["ran_on"] == "g6e.48xlarge"
    assert "training on spot capacity, GPUs 0" in run.log  # one of the two L40S
