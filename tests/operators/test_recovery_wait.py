"""Issue 29 item 4, recovery wall time: after a spot interruption the next attempt is submitted as soon as the
interruption is known (the service's event, the end read by the wait's own poll), not a poll interval later,
and not after a wait for the ended attempt's late log lines nor a backoff by default. Real Airflow (dag.test in
a child process) against the AWS Batch emulator, whose job state changes reach an SQS queue through moto's
EventBridge rule, as ``gpu-provider events render`` describes it."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import TaskKey
from tests.batch_world import BatchWorld
from tests.harness import Harness
from tests.triggers.test_aws_events import wire

#: the poll interval of these tasks: an end seen well before it came from an event
SLOW = 60.0
#: the run id of a ``dag.test()`` run at the harness's default logical date
RUN_ID = "manual__2026-01-05T00:00:00+00:00"


@pytest.fixture
def batch_events(batch: BatchWorld, monkeypatch: pytest.MonkeyPatch) -> str:
    """The emulator's Batch events delivered to a queue that the tasks' backend reads."""
    url, _ = wire(batch.emulator.client, "batch", "gpu-events-recovery")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL", url)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS", "1")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__WORKER_WAIT_EVENTS", "True")  # the sync wait listens too
    return url


def _dag(harness: Harness, batch: BatchWorld, dag_id: str, *, deferrable: bool, poll_interval: float) -> Any:
    return harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend={batch.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / "out"), 14, 0.2)},
            capacity=SpotFallback(after_preemptions=1),
            checkpoint={(harness.tmp / "ckpt").as_uri()!r},
            deferrable={deferrable},
            poll_interval={poll_interval},
        )
        """,
    )


def _submits(batch: BatchWorld) -> list[dict[str, Any]]:
    return [r for r in batch.emulator.requests("SubmitJob") if not r["throttled"]]


def test_a_sync_task_resubmits_an_interrupted_attempt_from_the_event_well_before_its_next_poll(
    harness: Harness, batch: BatchWorld, batch_events: str
) -> None:
    dag_id = "recovery_event_sync"
    batch.emulator.preempt_after(1.5, queue=batch.setup.spot_queue, name_contains=TaskKey(dag_id, "job", RUN_ID).prefix)
    run = harness.run(_dag(harness, batch, dag_id, deferrable=False, poll_interval=SLOW), dag_id, timeout=170)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["interruption"]) == (names.SPOT, names.PREEMPTED), first
    assert second["capacity"] == names.ON_DEMAND and int(second["resume_from"].rsplit("ckpt-", 1)[1]) > 0, second
    spot, on_demand = _submits(batch)
    ended = batch.describe(first["job_id"])["stoppedAt"] / 1000
    # causality: the poll before the interruption scheduled the next one SLOW later; the next attempt came first
    polls = [
        r["time"]
        for r in batch.emulator.requests("DescribeJobs")
        if first["job_id"] in (r["body"] or {}).get("jobs", []) and r["time"] < ended
    ]
    assert polls, "the spot attempt was read before it ended"
    assert on_demand["time"] < max(polls) + SLOW, "the next attempt waited for the next scheduled poll"
    # far below the interval (generous for a loaded machine): no settle wait nor backoff came between
    assert on_demand["time"] - ended < SLOW / 3, on_demand["time"] - ended
    assert on_demand["time"] > spot["time"]
    assert "resubmitting on on-demand (attempt 2, interruption 1 of at most 3)." in run.log, "no backoff by default"
    # the interrupted attempt's log still reached the task log (its late lines read after the next submission)
    assert "stop requested at step" in run.log, run.log[-4000:]


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_the_event_and_the_poll_seeing_one_end_submit_one_next_attempt(
    harness: Harness, batch: BatchWorld, batch_events: str, deferrable: bool
) -> None:
    """The end is seen by the event and by the regular poll (0.3 s) at about the same moment: one next attempt."""
    dag_id = f"recovery_race_{'def' if deferrable else 'sync'}"
    batch.emulator.preempt_after(1.5, queue=batch.setup.spot_queue, name_contains=TaskKey(dag_id, "job", RUN_ID).prefix)
    run = harness.run(_dag(harness, batch, dag_id, deferrable=deferrable, poll_interval=0.3), dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["interruption"], second["state"]) == (names.PREEMPTED, "SUCCEEDED")
    submitted = [r["body"]["jobName"] for r in _submits(batch)]
    assert submitted == [first["name"], second["name"]], submitted
    assert not batch.bodies("TerminateJob"), "no duplicate attempt was made, so none was cancelled"
