"""GpuJobOperator end to end on the local backend: real Airflow (dag.test in a child process), real local
jobs. What every backend does (spot fallback, crash and reattach, kill, ...) is tested once for all
backends in tests/operators/suite/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_provider import GpuResources
from gpu_provider.operators import GpuJobOperator
from tests.harness import Harness, pid_alive


def _pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}


def test_exact_resume_two_interruptions_give_the_bit_identical_model(harness: Harness) -> None:
    data = harness.tmp / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_provider.examples.preprocess",
            "--start",
            "2026-01-05",
            "--end",
            "2026-01-12",
            "--out",
            f"file://{data}",
        ],
        check=True,
        capture_output=True,
    )

    def train_dag(dag_id: str, backend: str, capacity: str, step_delay: str) -> Path:
        command = [
            sys.executable,
            "-m",
            "gpu_provider.examples.train",
            "--data",
            f"file://{data}",
            "--out",
            f"file://{harness.tmp / dag_id / 'model'}",
            "--epochs",
            "3",
            "--step-delay",
            step_delay,
            "--checkpoint-every",
            "10",
        ]
        return harness.write_dag(
            dag_id,
            f"""
            GpuJobOperator(
                task_id="job",
                backend={backend},
                command={command!r},
                resources=GpuResources(gpus=1, nodes=2),
                capacity={capacity},
                checkpoint="file://{harness.tmp / dag_id / "ckpt"}",
                poll_interval=0.3,
                deferrable=True,
            )
            """,
        )

    # the reference run unpaced (the delay is a sleep between steps: the model does not depend on it); the
    # interrupted run paced, so that each simulated interruption lands mid-training
    plain = harness.run(
        train_dag("exact_plain", f"LocalBackend(state_dir={str(harness.state_dir)!r})", "'on_demand'", "0"),
        "exact_plain",
    )
    interrupted = harness.run(
        train_dag(
            "exact_interrupted",
            f"LocalBackend(state_dir={str(harness.state_dir)!r}, simulate_preemptions=[2.0, 2.0], grace_period=3)",
            "Spot(backoff=0)",
            "0.04",
        ),
        "exact_interrupted",
    )
    assert plain.task()["state"] == "success", plain.log[-3000:]
    assert interrupted.task()["state"] == "success", interrupted.log[-3000:]
    attempts = interrupted.task()["xcom"]["attempts"]
    assert [a["state"] for a in attempts] == ["PREEMPTED", "PREEMPTED", "SUCCEEDED"]
    assert all(a["capacity"] == "spot" for a in attempts)
    steps = [int(a["resume_from"].rsplit("ckpt-", 1)[1]) for a in attempts[1:]]
    assert 0 < steps[0] < steps[1], steps
    a = (harness.tmp / "exact_plain" / "model" / "model.npz").read_bytes()
    b = (harness.tmp / "exact_interrupted" / "model" / "model.npz").read_bytes()
    import numpy as np

    with (
        np.load(harness.tmp / "exact_plain" / "model" / "model.npz") as pa,
        np.load(harness.tmp / "exact_interrupted" / "model" / "model.npz") as pb,
    ):
        assert sorted(pa.files) == sorted(pb.files)
        for name in pa.files:
            assert np.array_equal(pa[name], pb[name]), name
    assert a == b


def test_failed_attempt_goes_to_airflow_retry_which_resumes(harness: Harness) -> None:
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "retry",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}),
            command={harness.toy_command(str(out), 6, 0.05, "--fail-on-attempt", "1")},
            checkpoint="file://{harness.tmp / "ckpt"}",
            retries=1,
            retry_delay=timedelta(seconds=0),
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "retry")
    task = run.task()
    assert task["state"] == "success", run.log[-3000:]
    assert task["try_number"] == 2
    first, second = task["xcom"]["attempts"]
    assert first["state"] == "FAILED" and first["exit_code"] == 3 and first["try_number"] == 1
    assert "exited with code 3" in first["reason"]
    assert second["state"] == "SUCCEEDED" and second["try_number"] == 2
    assert second["resume_from"].endswith("ckpt-0000000002")
    assert (
        "ended FAILED" in run.log
        and "Airflow will retry it (retry 1 of 1), resuming from the latest checkpoint." in run.log
    )


def test_interruption_budget_is_separate_and_fails_the_task_when_spent(harness: Harness) -> None:
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "budget",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, simulate_preemptions=[0.8, 0.8], grace_period=1),
            command={harness.toy_command(str(out), 100, 0.1)},
            capacity=Spot(max_interruptions=1, backoff=0),
            checkpoint="file://{harness.tmp / "ckpt"}",
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "budget")
    assert run.task()["state"] == "failed"
    assert "interruption budget (max_interruptions=1) is spent" in run.log
    assert "interrupted 2 times" in run.log


def test_job_gets_the_contract_and_a_minimal_environment(harness: Harness) -> None:
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "envcheck",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}),
            command={harness.toy_command(str(out), 1, 0.0)},
            env={{"GREETING": "hello from {{{{ dag.dag_id }}}}"}},
            checkpoint="file://{harness.tmp / "ckpt"}/{{{{ ti.task_id }}}}",
            poll_interval=0.3,
        )
        """,
    )
    secrets = {
        "AIRFLOW_CONN_WAREHOUSE": "postgres://admin:hunter2@db/prod",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    }
    run = harness.run(dag, "envcheck", extra_env=secrets)
    assert run.task()["state"] == "success", run.log[-3000:]
    env = json.loads((out / "result.json").read_text())["env"]
    assert env["GREETING"] == "hello from envcheck"
    assert env["GPU_PROVIDER_ATTEMPT"] == "1"
    assert env["GPU_PROVIDER_CAPACITY"] == "on-demand"
    assert env["GPU_PROVIDER_CHECKPOINT_URI"] == f"file://{harness.tmp / 'ckpt'}/job"
    assert env["GPU_PROVIDER_RESUME_FROM"] == ""
    assert env["GPU_PROVIDER_CHECKPOINT_KEEP"] == "3"
    assert (env["NNODES"], env["NODE_RANK"], env["MASTER_ADDR"]) == ("1", "0", "127.0.0.1")
    assert int(env["MASTER_PORT"]) > 0
    assert "CUDA_VISIBLE_DEVICES" in env
    leaked = [k for k in env if k.startswith("AIRFLOW") or k.startswith("AWS_")]
    assert leaked == []
    for value in secrets.values():
        assert value not in json.dumps(env)
        assert value not in run.log


def test_team_sets_pool_and_slots_and_priority_sets_absolute_weight() -> None:
    task = GpuJobOperator(
        task_id="t", command=["true"], team="vision", priority=50, resources=GpuResources(gpus=4, nodes=2)
    )
    assert (task.pool, task.pool_slots) == ("gpu_vision", 8)
    assert task.priority_weight == 50
    assert str(task.weight_rule).endswith("GpuAbsolutePriority")  # absolute, lowered in backfill runs
    shared = GpuJobOperator(task_id="s", command=["true"], team="vision", resources=GpuResources(gpus=0.5))
    assert shared.pool_slots == 1
    plain = GpuJobOperator(task_id="p", command=["true"])
    assert plain.pool == "default_pool" and plain.pool_slots == 1
    assert plain.priority_weight == 1


def test_max_runtime_is_enforced_on_the_job_itself(harness: Harness) -> None:
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = harness.write_dag(
        "runtime_limit",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command={harness.toy_command(str(out), 500, 0.1)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            max_runtime=1.5,
            poll_interval=0.3,
            deferrable=True,
        )
        """,
    )
    run = harness.run(dag, "runtime_limit")
    assert run.task()["state"] == "failed"
    assert "exceeded max_runtime" in run.log
    assert not any(pid_alive(pid) for pid in _pids(pid_dir).values())


def test_mapped_tasks_get_their_own_jobs_and_the_task_copies_cleanly(harness: Harness) -> None:
    import copy

    task = GpuJobOperator(task_id="t", command=["true"], capacity="spot_fallback", checkpoint="file:///tmp/c")
    clone = copy.deepcopy(task)
    assert clone.capacity == task.capacity and clone.checkpoint_uri == task.checkpoint_uri

    outs = [str(harness.tmp / f"out{i}") for i in range(2)]
    commands = [harness.toy_args(out, 2, 0.05) for out in outs]
    dag = harness.write_dag(
        "mapped",
        f"""
        GpuJobOperator.partial(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}),
            poll_interval=0.3,
        ).expand(command={commands!r})
        """,
    )
    run = harness.run(dag, "mapped")
    assert run.result["state"].endswith("success"), run.log[-3000:]
    from gpu_provider.backends.local import LocalBackend

    names = sorted(h.name for h in LocalBackend(state_dir=str(harness.state_dir)).list_jobs())
    assert len(names) == 2
    assert names[0].endswith("-m0-t1-a1") and names[1].endswith("-m1-t1-a1")
    for out in outs:
        assert (Path(out) / "result.json").exists()


def test_working_dir_runs_the_job_in_its_folder_and_a_failure_quotes_the_job_output(harness: Harness) -> None:
    """The typical deployment mistake: the job imports a module of its own folder, but runs in the
    worker's folder. With working_dir= it runs; without, the task's error shows the job's own words."""
    code = harness.tmp / "job_code"
    code.mkdir()
    (code / "helper.py").write_text("def main():\n    print('helper ran in', __import__('os').getcwd())\n")
    command = [sys.executable, "-c", "import helper; helper.main()"]
    dag = harness.write_dag(
        "workdir",
        f"""
        GpuJobOperator(
            task_id="in_its_folder",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, working_dir={str(code)!r}),
            command={command!r},
            poll_interval=0.3,
        )
        GpuJobOperator(
            task_id="in_the_workers_folder",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}),
            command={command!r},
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "workdir")
    assert run.task("in_its_folder")["state"] == "success", run.log[-3000:]
    assert f"helper ran in {code}" in run.log
    assert run.task("in_the_workers_folder")["state"] == "failed"
    error = run.log[run.log.index("ended FAILED") :]
    assert "lines of the job's output:" in error
    assert "ModuleNotFoundError: No module named 'helper'" in error.split("lines of the job's output:", 1)[1]


def test_working_dir_must_be_an_absolute_path() -> None:
    from gpu_provider.backends.local import LocalBackend

    with pytest.raises(ValueError, match=r"working_dir='jobs/train' must be an absolute path"):
        LocalBackend(working_dir="jobs/train")
    assert "working_dir" in LocalBackend.fixed_options  # a place on disk: never from a template
