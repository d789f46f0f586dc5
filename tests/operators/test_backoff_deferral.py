"""Waiting between attempts frees the worker (issue 24, item 13): in deferrable mode the backoff before a
resubmission is a deferral on a timer, and the task resumes in ``resubmit`` to submit the next attempt."""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import time

import pytest
from airflow.sdk.exceptions import TaskDeferred

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.backends.local import LocalBackend
from gpu_provider.engine.attempts import AttemptEngine, Submit
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.operators import GpuJobOperator
from gpu_provider.records import AttemptRecord, load_records
from gpu_provider.recovery import SpotFallback
from gpu_provider.triggers.gpu_job import GpuBackoffTrigger
from tests.harness import Harness


def test_the_backoff_is_a_deferral_to_the_right_moment_with_the_records(tmp_path: object) -> None:
    operator = GpuJobOperator(
        task_id="job", command=["true"], backend="local", capacity=SpotFallback(backoff=30), deferrable=True
    )
    handle = JobHandle("local", "j1", "gp-j1", 1, names.SPOT, time.time() - 60)
    record = AttemptRecord.new(handle, try_number=1)
    record.update(JobStatus(state=JobState.PREEMPTED, interruption=names.PREEMPTED))
    engine = AttemptEngine(SpotFallback(backoff=30), [record], try_number=1, backend_name="local")
    runner = AttemptRunner(
        LocalBackend(), engine, log=logging.getLogger("t"), label="l", stop=threading.Event(), persist=lambda r: None
    )
    before = time.time()
    with pytest.raises(TaskDeferred) as deferred:
        operator._defer_backoff(runner, Submit(attempt=2, capacity=names.ON_DEMAND, delay=7.5), deadline=None)
    after = time.time()

    trigger = deferred.value.trigger
    assert isinstance(trigger, GpuBackoffTrigger)
    assert before + 7.5 <= trigger.moment <= after + 7.5
    assert deferred.value.method_name == "resubmit"
    kwargs = deferred.value.kwargs or {}
    assert (kwargs["attempt"], kwargs["capacity"]) == (2, names.ON_DEMAND)
    assert [r.job_id for r in load_records(kwargs["records"])] == ["j1"]


def test_the_backoff_trigger_round_trips_and_fires_at_its_moment() -> None:
    trigger = GpuBackoffTrigger(moment=time.time() + 0.3, note="attempt 2")
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)

    async def first() -> tuple[float, dict[str, object]]:
        async for event in rebuilt.run():
            return time.time(), dict(event.payload)
        raise AssertionError("no event")

    fired_at, payload = asyncio.run(asyncio.wait_for(first(), 30))
    assert fired_at >= rebuilt.moment
    assert payload == {"status": names.EVENT_BACKOFF_DONE, "moment": rebuilt.moment}


def test_a_deferred_task_waits_out_its_backoff_deferred_then_resubmits_on_demand(harness: Harness) -> None:
    out, ckpt = harness.tmp / "out", harness.tmp / "ckpt"
    dag = harness.write_dag(
        "backoff_deferred",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, simulate_preemptions=[1.0], grace_period=1),
            command={harness.toy_command(str(out), 12, 0.15)},
            capacity=SpotFallback(after_preemptions=1, backoff=1),
            checkpoint="file://{ckpt}",
            deferrable=True,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "backoff_deferred")
    task = run.task()
    assert task["state"] == "success", run.log[-3000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["state"]) == ("spot", "PREEMPTED")
    assert (second["capacity"], second["state"]) == ("on-demand", "SUCCEEDED")
    assert "resubmitting on on-demand (attempt 2" in run.log
    assert "before attempt 2 in the triggerer (GpuBackoffTrigger)" in run.log, run.log[-3000:]
