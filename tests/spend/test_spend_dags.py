"""Spend control under a real Airflow (dag.test in a child process): each attempt's cost in XCom and
in the task log equals the documented formula, metrics reach a StatsD listener with their tags, a
task whose worst case passes max_cost_usd never submits, a running job crossing its budget is
stopped, and a team past its monthly budget submits nothing."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest

from gpu_provider.backends.local import LocalBackend
from tests.batch_world import BatchWorld
from tests.harness import Harness, wait_for
from tests.statsd import datagrams

#: $0.01 per GPU-second on the local backend
LOCAL_PRICE = {"AIRFLOW__GPU_PROVIDER__LOCAL_GPU_HOUR_USD": "36"}


def test_each_attempts_cost_follows_the_formula_in_xcom_log_and_metrics(
    harness: Harness, statsd: socket.socket
) -> None:
    out, ckpt = harness.tmp / "out", harness.tmp / "ckpt"
    dag = harness.write_dag(
        "spend_cost",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, simulate_preemptions=[1.0], grace_period=0.5),
            command={harness.toy_command(str(out), 12, 0.2)},
            resources=GpuResources(gpus=2),
            capacity=SpotFallback(after_preemptions=1, backoff=0),
            checkpoint="file://{ckpt}",
            team="vision",
            poll_interval=0.2,
        )
        """,
    )
    port = statsd.getsockname()[1]
    env = {
        **LOCAL_PRICE,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(port),
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
    }
    run = harness.run(dag, "spend_cost", extra_env=env)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    result = task["xcom"]
    first, second = result["attempts"]
    assert (first["capacity"], first["state"], second["capacity"], second["state"]) == (
        "spot",
        "PREEMPTED",
        "on-demand",
        "SUCCEEDED",
    )
    for attempt in (first, second):
        # documented formula: GPU-hours x price per GPU-hour ($36 per GPU-hour on this local backend)
        assert attempt["gpu_seconds"] > 0 and attempt["nodes"] == 1
        assert attempt["gpu_hours"] == pytest.approx(attempt["gpu_seconds"] / 3600, abs=1e-6)
        assert attempt["cost_usd"] == pytest.approx(attempt["gpu_seconds"] / 3600 * 36.0, abs=1e-5)
        assert attempt["price"]["usd_per_gpu_hour"] == 36.0
        assert attempt["price"]["source"] == "[gpu_provider] local_gpu_hour_usd"
        assert attempt["started_at"] and attempt["ended_at"] and attempt["queue_wait_s"] >= 0
        # one log line per attempt
        line = f"Attempt {attempt['attempt']} cost: local job {attempt['name']} on local {attempt['capacity']} x 1"
        assert line in run.log, run.log[-3000:]
        assert f"${attempt['cost_usd']:.4f} at $36.0000/GPU-hour" in run.log
    assert result["cost_usd"] == pytest.approx(first["cost_usd"] + second["cost_usd"], abs=1e-6)
    assert result["gpu_hours"] == pytest.approx(result["gpu_seconds"] / 3600, abs=1e-6)

    # StatsD (influx tags): name,tags:value|type, one set per attempt
    everything = datagrams(statsd)
    grams = [g for g in everything if ".gpu_provider." in g]
    assert grams, (everything[:20], [line for line in run.log.splitlines() if "metric" in line.lower()][:20])
    parsed = {}
    for gram in grams:
        match = re.fullmatch(r"[\w.]*?gpu_provider\.(\w+),(.*):([\d.e-]+)\|(\w+)", gram)
        assert match, gram
        name, tags, value, kind = match.groups()
        tag_map = dict(t.split("=", 1) for t in tags.split(","))
        parsed.setdefault((name, tag_map["capacity"]), []).append((float(value), kind, tag_map))
    for attempt in (first, second):
        cap = attempt["capacity"]
        ((cost, kind, tags),) = parsed[("cost_usd", cap)]
        assert kind == "c" and cost == pytest.approx(attempt["cost_usd"], abs=1e-5)
        assert (tags["team"], tags["backend"]) == ("vision", "local")
        ((hours, _, _),) = parsed[("gpu_hours", cap)]
        assert hours == pytest.approx(attempt["gpu_hours"], abs=1e-6)
        ((wait, kind, _),) = parsed[("queue_wait_seconds", cap)]
        assert kind == "g" and wait == pytest.approx(attempt["queue_wait_s"], abs=1e-3)
    assert parsed[("interruptions", "spot")][0][:2] == (1.0, "c")
    assert ("interruptions", "on-demand") not in parsed


def test_worst_case_over_budget_never_submits_and_a_priced_batch_job_costs_the_table_price(
    harness: Harness, batch: BatchWorld
) -> None:
    dag = harness.write_dag(
        "spend_batch",
        f"""
        GpuJobOperator(
            task_id="too_dear",
            backend={batch.backend_source()},
            image="trainer:1",
            command=["python", "-c", "print('never')"],
            resources=GpuResources(gpus=4, gpu_type="a10g"),
            max_runtime=timedelta(hours=2),
            max_cost_usd=40,
            poll_interval=0.3,
        )
        GpuJobOperator(
            task_id="priced",
            backend={batch.backend_source()},
            image="trainer:1",
            command=[sys.executable, "-c", "import time; time.sleep(2)"],
            resources=GpuResources(gpus=1, gpu_type="a10g"),
            max_runtime=timedelta(minutes=5),
            max_cost_usd=40,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "spend_batch")
    refused, priced = run.task("too_dear"), run.task("priced")
    assert refused["state"] == "failed" and refused["try_number"] == 1
    # the arithmetic: g5.12xlarge $5.672/h / 4 GPUs x 4 GPUs x 2 h x (1 + 3 interruptions + 2 node faults + 0 retries)
    assert (
        "Not submitting attempt 1: its worst case passes max_cost_usd=$40.00: $1.4180/GPU-hour (g5.12xlarge "
        "on-demand in us-east-1, shipped table (2026-12-03)) x 4 GPU(s) x 2.00 h max runtime x 6 attempt(s) left "
        "of 6 (1 + max_interruptions 3 + max_node_faults 2 + retries 0) + $0.00 spent by earlier attempts = $68.06"
    ) in run.log, run.log[-4000:]
    submitted = [b["jobName"] for b in batch.bodies("SubmitJob")]
    assert len(submitted) == 1 and "-priced-" in submitted[0], submitted
    assert priced["state"] == "success", run.log[-4000:]
    (attempt,) = priced["xcom"]["attempts"]
    assert attempt["price"]["instance_type"] == "g5.xlarge" and attempt["price"]["usd_per_gpu_hour"] == 1.006
    assert attempt["cost_usd"] == pytest.approx(attempt["gpu_seconds"] / 3600 * 1.006, abs=1e-6)
    assert attempt["cost_usd"] > 0
    assert "Budget check passed: worst case $1.0060/GPU-hour (g5.xlarge on-demand" in run.log


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_running_job_crossing_its_budget_is_stopped_and_the_task_fails_saying_so(
    harness: Harness, deferrable: bool
) -> None:
    pid_dir = harness.tmp / "pids"
    dag_id = f"spend_running_{'def' if deferrable else 'sync'}"
    dag = harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command={harness.toy_command(str(harness.tmp / "out"), 600, 0.1)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            max_cost_usd=0.03,
            deferrable={deferrable},
            poll_interval=0.2,
            retries=2,
        )
        """,
    )
    run = harness.run(dag, dag_id, extra_env=LOCAL_PRICE)  # $0.01 per GPU-second: 3 s of 1 GPU
    task = run.task()
    assert task["state"] == "failed" and task["try_number"] == 1, run.log[-4000:]  # not retried
    assert "was stopped because its running cost crossed the task's budget" in run.log, run.log[-4000:]
    assert ">= max_cost_usd=$0.03" in run.log
    (handle,) = LocalBackend(state_dir=str(harness.state_dir)).list_jobs()
    # the stop was asked for before the task failed; the job's processes stop on their own time (its grace period)
    status = wait_for(
        lambda: (
            (s := LocalBackend(state_dir=str(harness.state_dir)).poll([handle])[handle.job_id]).state.terminal and s
        ),
        30,
        "the job to stop",
    )
    assert status.state.value == "CANCELLED" and "max_cost_usd" in status.reason, status
    # stopped at the budget (3 GPU-seconds), long before the job's own end (60 s)
    assert 3.0 <= status.gpu_seconds < 50.0, status
    assert not LocalBackend(state_dir=str(harness.state_dir)).list_owned()


def test_a_team_past_its_monthly_budget_submits_nothing(harness: Harness) -> None:
    dag = harness.write_dag(
        "spend_team",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command=[sys.executable, "-c", "import time; time.sleep(1.5)"],
            team="nlp",
            poll_interval=0.2,
        )
        """,
    )
    env = {**LOCAL_PRICE, "AIRFLOW__GPU_PROVIDER__TEAM_MONTHLY_BUDGET_USD": json.dumps({"nlp": 0.005})}
    first = harness.run(dag, "spend_team", extra_env=env)
    assert first.task()["state"] == "success", first.log[-4000:]
    spent = first.task()["xcom"]["cost_usd"]
    assert spent > 0.005  # 1.5 s of 1 GPU at $0.01/s
    second = harness.run(dag, "spend_team", extra_env=env, logical_date="2026-01-06T00:00:00+00:00")
    assert second.task()["state"] == "failed", second.log[-4000:]
    month = time.strftime("%Y-%m", time.gmtime())
    assert (
        f"Not submitting attempt 1: team 'nlp' has spent ${spent:.2f} of its monthly budget of $0.01 this month "
        f"(gpu_provider_spend_{month})"
    ) in second.log, second.log[-4000:]
    assert len(LocalBackend(state_dir=str(harness.state_dir)).list_jobs()) == 1
    assert Path(harness.state_dir).exists()
