"""Spot capacity, on every backend: an attempt whose spot capacity is reclaimed while it runs resumes from
its checkpoint on on-demand capacity; one whose spot capacity never comes is given up at
``spot_wait_timeout`` and resubmitted on on-demand. Real Airflow (dag.test in a child process)."""

from __future__ import annotations

import json

import pytest

from gpu_provider import names
from tests.harness import Harness
from tests.operators.suite.helpers import Source, write_job_dag
from tests.operators.suite.worlds import OperatorWorld


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_spot_reclaimed_while_running_resumes_on_demand_from_its_checkpoint(
    harness: Harness, world: OperatorWorld, deferrable: bool
) -> None:
    dag_id = world.dag_id(f"fb_{'def' if deferrable else 'sync'}")
    out = harness.tmp / "out"
    world.preempt_spot_after(1.5, world.task_key(dag_id))
    dag = write_job_dag(
        harness,
        world,
        dag_id,
        harness.toy_args(str(out), 14, 0.2, "--fast-from-attempt", "2"),  # the on-demand attempt only has to finish
        capacity=Source("SpotFallback(after_preemptions=1, backoff=0)"),
        checkpoint=world.checkpoint_uri(harness.tmp, "ckpt"),
        deferrable=deferrable,
        poll_interval=0.3,
    )
    run = harness.run(dag, dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    result = task["xcom"]
    first, second = result["attempts"]
    assert (first["capacity"], first["state"], first["interruption"]) == (
        names.SPOT,
        world.preempted_state,
        names.PREEMPTED,
    ), first
    assert world.preempted_words in first["reason"], first
    assert first["resume_from"] is None
    assert (second["capacity"], second["state"]) == (names.ON_DEMAND, "SUCCEEDED"), second
    assert result["interruptions"] == 1 and result["job_id"] == second["job_id"]
    assert result["gpu_seconds"] > 0
    step = int(second["resume_from"].rsplit("ckpt-", 1)[1])
    assert step > 0, "the second attempt must continue from the checkpoint, not from step 0"
    assert "Treated as a spot interruption; resubmitting on on-demand (attempt 2" in run.log
    # what the service was asked: a spot job starting fresh, then an on-demand job resuming from that checkpoint
    spot, on_demand = world.created()
    assert (spot.name, spot.capacity, spot.attempt, spot.resume_from) == (first["name"], names.SPOT, 1, "")
    assert (on_demand.name, on_demand.capacity, on_demand.attempt) == (second["name"], names.ON_DEMAND, 2)
    assert on_demand.resume_from.endswith(f"ckpt-{step:010d}"), on_demand
    # the training program's own step counter: the on-demand job started where the spot job's checkpoint was
    history = json.loads((out / "result.json").read_text())["history"]
    assert history[-1] == {"attempt": 2, "capacity": names.ON_DEMAND, "start": step}, history
    # the job's own log reached the task log (streamed, or copied when the deferred attempt ended)
    assert f"resumed from step {step}" in run.log


def test_spot_capacity_that_never_comes_is_given_up_and_resubmitted_on_demand(
    harness: Harness, world: OperatorWorld
) -> None:
    dag_id = world.dag_id("spot_wait")
    key = world.task_key(dag_id)
    world.hold_spot()  # no spot capacity comes
    releaser = world.release_spot_once_given_up(key)
    dag = write_job_dag(
        harness,
        world,
        dag_id,
        harness.toy_args(str(harness.tmp / "out"), 2, 0.05),
        capacity=Source("SpotFallback(spot_wait_timeout=2.0, backoff=0)"),
        checkpoint=world.checkpoint_uri(harness.tmp, "ckpt"),
        deferrable=True,
        poll_interval=0.3,
    )
    run = harness.run(dag, dag_id)
    releaser.join(timeout=60)
    assert not releaser.is_alive(), "the spot attempt was never seen given up"
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["state"], first["interruption"]) == (
        names.SPOT,
        "CANCELLED",
        names.CAPACITY_TIMEOUT,
    ), first
    assert "no spot capacity after 2s waiting" in first["reason"], first
    assert (second["capacity"], second["state"]) == (names.ON_DEMAND, "SUCCEEDED"), second
    assert "Spot capacity did not come; resubmitting on on-demand" in run.log
    assert [(c.name, c.capacity) for c in world.created()] == [
        (first["name"], names.SPOT),
        (second["name"], names.ON_DEMAND),
    ]
    # stopped with the reason on the job itself, so a lookup after a crash (between the stop and saving the
    # task's record) still counts the capacity timeout
    ((stopped, reason),) = world.stopped()
    assert stopped == first["job_id"]
    assert reason.startswith(names.CAPACITY_TIMEOUT_MARK + "no spot capacity after 2s waiting (spot_wait_timeout)")
    status = world.status(world.handle_of(key, first))
    assert status.state.value == "CANCELLED" and status.interruption == names.CAPACITY_TIMEOUT, status
