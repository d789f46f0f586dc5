"""GpuJobOperator on AWS Batch, what only Batch has: a third of DescribeJobs throttled, and 250 waiting
tasks batched into DescribeJobs calls of up to 100 ids. Real Airflow (dag.test in a child process) or the
real trigger, on the Batch emulator (moto server; every job runs as a local process).

What every backend does (spot fallback, crash and reattach, kill, ...) is tested once for all backends in
tests/operators/suite/."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.job import GpuResources
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.batch_world import BatchWorld
from tests.harness import Harness


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

    def ticks_of(requests: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """One tick = the calls until a job is asked about a second time (time gaps between calls would
        merge or split ticks on a loaded machine); the first and last tick may be cut by the window."""
        ticks: list[list[dict[str, Any]]] = []
        asked: set[str] = set()
        for request in requests:
            jobs = set(request["body"]["jobs"])
            if not ticks or jobs & asked:
                ticks.append([])
                asked = set()
            ticks[-1].append(request)
            asked |= jobs
        return ticks

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
        batch.emulator.reset_requests()
        # five whole ticks seen (and the one the reset cut): counted, not timed, so a loaded machine only
        # takes longer
        deadline = time.monotonic() + 120
        while len(ticks_of(batch.emulator.requests("DescribeJobs"))) < 7:
            assert time.monotonic() < deadline, "the poller did not tick 7 times within 120 s"
            await asyncio.sleep(interval / 2)
        pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
        assert len(pollers) == 1, "one shared poller per event loop and backend"
        ticks = ticks_of(batch.emulator.requests("DescribeJobs"))
        batch.emulator.release(batch.setup.spot_queue)
        assert len(ticks) >= 3, f"expected several ticks, saw {len(ticks)}"
        assert max(len(t) for t in ticks) <= 3, [len(t) for t in ticks]
        complete = ticks[1:-1]
        assert all(sum(len(r["body"]["jobs"]) for r in t) == 250 for t in complete), [
            sum(len(r["body"]["jobs"]) for r in t) for t in ticks
        ]
        return list(await asyncio.wait_for(asyncio.gather(*waiting), 120))

    statuses = asyncio.run(wait_together())
    assert statuses == ["succeeded"] * 250
