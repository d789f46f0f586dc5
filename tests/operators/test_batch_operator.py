"""GpuJobOperator on AWS Batch end to end: real Airflow (dag.test in a child process), the Batch
emulator (moto server; every job runs as a local process), asserting the requests that reached the
server and what the tasks returned."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.batch import CANCEL_PREFIX, BatchBackend
from gpu_provider.job import GpuResources
from gpu_provider.names import CAPACITY_TIMEOUT_MARK
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.batch_world import BatchWorld
from tests.harness import Harness, pid_alive, wait_for


def _env(body: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in body["containerOverrides"]["environment"]}


def _pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_spot_reclaimed_while_running_resumes_on_the_on_demand_queue(
    harness: Harness, batch: BatchWorld, deferrable: bool
) -> None:
    dag_id = f"batch_fallback_{'def' if deferrable else 'sync'}"
    out, ckpt = harness.tmp / "out", harness.tmp / "ckpt"
    batch.emulator.preempt_after(1.5, queue=batch.setup.spot_queue, name_contains=dag_id[:14].replace("_", "-"))
    dag = harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 14, 0.2)},
            capacity=SpotFallback(after_preemptions=1, backoff=0),
            checkpoint="file://{ckpt}",
            deferrable={deferrable},
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    result = task["xcom"]
    first, second = result["attempts"]
    assert (first["capacity"], first["state"], first["queue"]) == ("spot", "PREEMPTED", batch.setup.spot_queue)
    assert first["reason"].startswith("Host EC2 (instance i-") and first["reason"].endswith("terminated.")
    assert (second["capacity"], second["state"], second["queue"]) == (
        "on-demand",
        "SUCCEEDED",
        batch.setup.on_demand_queue,
    )
    assert "ckpt-" in second["resume_from"] and int(second["resume_from"].rsplit("ckpt-", 1)[1]) > 0
    # what reached the server: the second SubmitJob went to the on-demand queue, resuming
    spot_body, on_demand_body = batch.bodies("SubmitJob")
    assert spot_body["jobQueue"] == batch.setup.spot_queue
    assert _env(spot_body)["GPU_PROVIDER_RESUME_FROM"] == ""
    assert on_demand_body["jobQueue"] == batch.setup.on_demand_queue
    assert _env(on_demand_body)["GPU_PROVIDER_RESUME_FROM"] == second["resume_from"]
    assert (_env(on_demand_body)["GPU_PROVIDER_ATTEMPT"], _env(on_demand_body)["GPU_PROVIDER_CAPACITY"]) == (
        "2",
        "on-demand",
    )
    history = json.loads((out / "result.json").read_text())["history"]
    assert history[1]["start"] == int(second["resume_from"].rsplit("ckpt-", 1)[1])
    # the job's own log reached the task log (streamed, or copied when the deferred attempt ended)
    assert "[job] resumed from step" in run.log


def test_spot_job_left_runnable_past_its_deadline_is_terminated_and_resubmitted_on_demand(
    harness: Harness, batch: BatchWorld
) -> None:
    batch.emulator.hold(batch.setup.spot_queue)  # no spot capacity comes
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "batch_spot_wait",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 2, 0.05)},
            capacity=SpotFallback(spot_wait_timeout=2.0, backoff=0),
            checkpoint="file://{harness.tmp / "ckpt"}",
            deferrable=True,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "batch_spot_wait")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["state"], first["interruption"]) == ("spot", "CANCELLED", "capacity_timeout")
    assert (second["capacity"], second["state"]) == ("on-demand", "SUCCEEDED")
    (terminate,) = batch.bodies("TerminateJob")
    assert terminate["jobId"] == first["job_id"]
    # marked as a capacity timeout on the job itself, so a lookup after a crash still counts the interruption
    assert terminate["reason"].startswith(
        CANCEL_PREFIX + CAPACITY_TIMEOUT_MARK + "no spot capacity after 2s waiting (spot_wait_timeout)"
    )
    lookup = BatchBackend(**batch.queues)  # what a retry finds by name after a crash between cancel and save
    found = {h.job_id: h for h in lookup.find_existing(TaskKey("batch_spot_wait", "job", run.result["run_id"]))}
    status = lookup.poll([found[first["job_id"]]])[first["job_id"]]
    assert not isinstance(status, Exception) and status.interruption == "capacity_timeout"
    spot_body, on_demand_body = batch.bodies("SubmitJob")
    assert (spot_body["jobQueue"], on_demand_body["jobQueue"]) == (batch.setup.spot_queue, batch.setup.on_demand_queue)
    assert batch.describe(first["job_id"])["status"] == "FAILED"


def test_worker_crash_then_retry_reattaches_without_a_second_submit(harness: Harness, batch: BatchWorld) -> None:
    out, pid_dir, release = harness.tmp / "out", harness.tmp / "pids", harness.tmp / "release"
    dag = harness.write_dag(
        "batch_crash",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 20, 0.15, "--hold-until", str(release))},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            checkpoint="file://{harness.tmp / "ckpt"}",
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    worker, _, _ = harness.start(dag, "batch_crash")
    job_pid = wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the Batch job to start")
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies; the Batch job does not
    worker.wait(timeout=10)
    assert pid_alive(job_pid)
    assert len(batch.bodies("SubmitJob")) == 1

    # the retry; the job is held after its last step until the retry has reattached, so a slow start
    # of the retry cannot find it already ended
    retry = harness.start(dag, "batch_crash")
    wait_for(lambda: "Reattaching to batch job" in retry[2].read_text(), 180, "the retry to reattach")
    release.touch()
    run = harness.finish(*retry)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    assert "Reattaching to batch job" in run.log
    assert len(batch.bodies("SubmitJob")) == 1, "the retry must not submit a second job"
    assert len(task["xcom"]["attempts"]) == 1
    assert set(_pids(pid_dir)) == {"1-0"}


def test_a_retry_adopting_a_succeeded_job_returns_its_declared_output(harness: Harness, batch: BatchWorld) -> None:
    """Issue 15 defect 2: the job succeeded while no worker watched; the retry used to return output_uri None."""
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = harness.write_dag(
        "batch_adopt",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 3, 0.1)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            poll_interval=600,
            deferrable=False,
        )
        """,
    )
    worker, _, _ = harness.start(dag, "batch_adopt")
    wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the Batch job to start")
    wait_for(lambda: (out / "result.json").exists(), 120, "the job to finish its work")
    os.killpg(worker.pid, signal.SIGKILL)  # dies before its next poll (every 10 minutes) could see the end
    worker.wait(timeout=10)

    run = harness.run(dag, "batch_adopt")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    assert "already succeeded; returning its result" in run.log
    assert len(batch.bodies("SubmitJob")) == 1
    assert task["xcom"]["output_uri"] == f"file://{out}"


def test_worker_crash_before_the_record_was_saved_is_found_by_job_name(harness: Harness, batch: BatchWorld) -> None:
    """The task state store is empty (the crash came first): ListJobs by job name finds the job."""
    out = harness.tmp / "out"
    dag = harness.write_dag(
        "batch_lookup",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 60, 0.2)},
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    import pendulum
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    # submit "attempt 1 of try 1" as the crashed worker would have, with nothing recorded
    when = pendulum.parse("2026-01-05T00:00:00+00:00")
    run_id = DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=when, run_after=when)
    identity = JobIdentity(TaskKey("batch_lookup", "job", run_id), try_number=1, attempt=1, capacity="on-demand")
    backend = BatchBackend(**batch.queues)
    command = tuple(harness.toy_args(str(out), 60, 0.2))
    backend.submit(JobRequest(identity, command, {}, GpuResources(), "on-demand", image="trainer:1", resume_from=None))
    run = harness.run(dag, "batch_lookup")
    assert run.task()["state"] == "success", run.log[-4000:]
    # found by name: still running (reattach) or, on a slow machine, already done (its result is taken)
    assert "Reattaching to batch job" in run.log or "of an earlier try already succeeded" in run.log
    assert len(batch.bodies("SubmitJob")) == 1
    assert {b["filters"][0]["name"] for b in batch.bodies("ListJobs")} == {"JOB_NAME"}


def test_killing_a_running_task_terminates_its_job(harness: Harness, batch: BatchWorld) -> None:
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = harness.write_dag(
        "batch_kill",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(out), 300, 0.2)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    worker, _, log = harness.start(dag, "batch_kill")
    job_pid = wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the Batch job to start")
    worker.send_signal(signal.SIGTERM)  # what Airflow sends a task it kills
    (terminate,) = wait_for(lambda: batch.bodies("TerminateJob"), 15, "TerminateJob")
    assert terminate["reason"].startswith(CANCEL_PREFIX + "Airflow task batch_kill.job of run ")
    assert terminate["reason"].endswith(" was killed")
    wait_for(lambda: not pid_alive(job_pid), 10, "the job process to stop")
    worker.wait(timeout=30)
    assert "Cancelled batch job" in log.read_text()


def test_killing_a_deferred_task_terminates_its_job(batch: BatchWorld) -> None:
    """The triggerer runs the trigger's on_kill when a deferred task is killed."""
    backend = BatchBackend(**batch.queues)
    identity = JobIdentity(TaskKey("batch_deferred", "job", "manual__1"), try_number=1, attempt=1, capacity="on-demand")
    handle = backend.submit(
        JobRequest(
            identity, (sys.executable, "-c", "import time; time.sleep(60)"), {}, GpuResources(), "on-demand", image="x"
        )
    )
    trigger = GpuJobTrigger(
        backend=backend.spec(),
        handle=handle.to_dict(),
        poll_interval=0.3,
        task_label="Airflow task batch_deferred.job of run manual__1",
    )

    async def wait_then_kill() -> None:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(1.0)
        assert not waiting.done()
        waiting.cancel()
        await trigger.on_kill()

    asyncio.run(wait_then_kill())
    (terminate,) = batch.bodies("TerminateJob")
    assert terminate == {
        "jobId": handle.job_id,
        "reason": CANCEL_PREFIX + "Airflow task batch_deferred.job of run manual__1 was killed while deferred",
    }


def test_every_task_succeeds_while_a_third_of_describe_calls_are_throttled(harness: Harness, batch: BatchWorld) -> None:
    batch.emulator.throttle("DescribeJobs", 3)
    tasks = "\n".join(
        f"""
        GpuJobOperator(
            task_id="job{i}",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / f"out{i}"), 6, 0.1)},
            deferrable={i % 2 == 0},
            poll_interval=0.2,
        )"""
        for i in range(4)
    )
    dag = harness.write_dag("batch_throttled", tasks)
    run = harness.run(dag, "batch_throttled", timeout=240)
    states = {name: t["state"] for name, t in run.result["tasks"].items()}
    assert states == {f"job{i}": "success" for i in range(4)}, run.log[-4000:]
    describe = batch.emulator.requests("DescribeJobs")
    throttled = sum(r["throttled"] for r in describe)
    assert throttled >= len(describe) // 3 - 1 and throttled > 0
    assert len(batch.bodies("SubmitJob")) == 4, "throttling must never cause a resubmission"


def test_250_waiting_tasks_cost_at_most_3_describe_calls_per_tick(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    handles = []
    for i in range(250):
        identity = JobIdentity(TaskKey("batch_many", f"t{i}", "manual__1"), try_number=1, attempt=1, capacity="spot")
        handles.append(backend.submit(JobRequest(identity, ("true",), {}, GpuResources(), "spot", image="x")))
    interval = 1.0

    async def wait_together() -> list[str]:
        triggers = [
            GpuJobTrigger(backend=backend.spec(), handle=h.to_dict(), poll_interval=interval, stream_logs=False)
            for h in handles
        ]

        async def first(trigger: GpuJobTrigger) -> str:
            async for event in trigger.run():
                return str(event.payload["status"])
            return "none"

        waiting = [asyncio.ensure_future(first(t)) for t in triggers]
        # every trigger subscribed and every job described once (a loaded machine takes longer than a few ticks)
        deadline = time.monotonic() + 90
        while len({j for r in batch.emulator.requests("DescribeJobs") for j in r["body"]["jobs"]}) < 250:
            assert time.monotonic() < deadline, "the poller did not read every job within 90 s"
            await asyncio.sleep(interval / 2)
        await asyncio.sleep(interval * 2)
        batch.emulator.reset_requests()
        await asyncio.sleep(interval * 6)
        pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
        assert len(pollers) == 1, "one shared poller per event loop and backend"
        requests = batch.emulator.requests("DescribeJobs")
        batch.emulator.release(batch.setup.spot_queue)
        # one tick = the calls until a job is asked about a second time (time gaps between calls would
        # merge or split ticks on a loaded machine); the first and last tick may be cut by the window
        ticks: list[list[dict[str, Any]]] = []
        asked: set[str] = set()
        for request in requests:
            jobs = set(request["body"]["jobs"])
            if not ticks or jobs & asked:
                ticks.append([])
                asked = set()
            ticks[-1].append(request)
            asked |= jobs
        assert len(ticks) >= 3, f"expected several ticks, saw {len(ticks)}"
        assert max(len(t) for t in ticks) <= 3, [len(t) for t in ticks]
        complete = ticks[1:-1]
        assert all(sum(len(r["body"]["jobs"]) for r in t) == 250 for t in complete), [
            sum(len(r["body"]["jobs"]) for r in t) for t in ticks
        ]
        return list(await asyncio.wait_for(asyncio.gather(*waiting), 120))

    statuses = asyncio.run(wait_together())
    assert statuses == ["succeeded"] * 250


def test_a_failing_job_fails_the_task_with_its_exit_code_and_last_log_lines(
    harness: Harness, batch: BatchWorld
) -> None:
    code = "import sys; print('loading data'); print('fatal: no such table', file=sys.stderr); sys.exit(3)"
    dag = harness.write_dag(
        "batch_fails",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={[sys.executable, "-c", code]!r},
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    run = harness.run(dag, "batch_fails")
    assert run.task()["state"] == "failed"
    assert "ended FAILED: Essential container in task exited (exit code 3)" in run.log
    # the job exits at once; its last lines still reach the task log (read until the log settles)
    assert "[job] loading data" in run.log and "[job] fatal: no such table" in run.log
    # and the task's error quotes them: read from the end of the job's stream
    quoted = run.log[run.log.index("lines of the job's output:") :].splitlines()[1:4]
    assert any(line.strip().endswith("fatal: no such table") for line in quoted), quoted
    assert len(batch.bodies("SubmitJob")) == 1, "a job's own failure is not resubmitted without retries"
