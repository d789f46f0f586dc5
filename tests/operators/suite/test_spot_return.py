"""Back to spot when spot returns, on every backend: a task whose spot capacity timed out runs on on-demand; once
the EC2 emulator's spot placement scores rise (and spot is cheap enough), the task asks its on-demand attempt to
checkpoint and stop, through the backend's stop (the path of a spot interruption), and the next attempt runs on
spot, resuming from that checkpoint. Real Airflow (dag.test in a child process), sync and deferrable waits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobState, TaskKey
from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
from gpu_provider.testing.worlds import aws_connection_env
from tests.harness import Harness, wait_for
from tests.operators.suite.worlds import LocalOperatorWorld, OperatorWorld, strip_cancel_prefix

TYPE = "p4d.24xlarge"  # 32.7726 USD/h on-demand in us-east-1 (the shipped price table)
CONN = "aws_spot"


@pytest.fixture
def ec2(ec2_spot_emulator: Ec2SpotEmulator) -> Iterator[Ec2SpotEmulator]:
    """The session's EC2 spot emulator, reached through its own connection (``aws_spot``) so that a world's
    ``aws_default`` (Batch, SageMaker) stays as it is; no score yet (every region scores 1), a spot price."""
    ec2_spot_emulator.reset()
    ec2_spot_emulator.set_price("us-east-1", "us-east-1a", TYPE, 11.5)
    try:
        yield ec2_spot_emulator
    finally:
        ec2_spot_emulator.reset()


def _env(ec2: Ec2SpotEmulator) -> dict[str, str]:
    env = aws_connection_env(ec2.endpoint_url, ec2.region, CONN)  # dummy keys, as every AWS world's
    return {k: v for k, v in env.items() if k != "AWS_DEFAULT_REGION"}  # a world's own region stays


def _spot_return(**more: Any) -> str:
    args = {
        "check_every": 0.5,
        "instance_types": [TYPE],
        "regions": ["us-east-1"],
        "aws_conn_id": CONN,
        "expected_runtime": 3600,
        "min_remaining": 60,
        "cooldown": 0,
        **more,
    }
    return f"SpotReturn({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def _dag(
    harness: Harness,
    world: OperatorWorld,
    dag_id: str,
    capacity: str,
    deferrable: bool,
    steps: int,
    fast_from_attempt: int = 0,
) -> Any:
    """``fast_from_attempt``: the attempt (and those after it) whose job only has to finish, stepping at 0.01 s
    (an attempt that must still run when the test acts keeps the 0.2 s steps)."""
    fast = ("--fast-from-attempt", str(fast_from_attempt)) if fast_from_attempt else ()
    return harness.write_dag(
        dag_id,
        f"""
        from gpu_provider import SpotReturn
        GpuJobOperator(
            task_id="job",
            backend={world.backend_source()},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / dag_id / "out"), steps, 0.2, *fast)},
            capacity={capacity},
            checkpoint={world.checkpoint_uri(harness.tmp, f"ckpt-{dag_id}")!r},
            deferrable={deferrable},
            poll_interval=0.3,
        )
        """,
    )


def _raise_scores_once_on_demand_ran(
    world: OperatorWorld, key: TaskKey, ec2: Ec2SpotEmulator, seconds: float = 1.5
) -> threading.Thread:
    """Spot returns (score 9 in us-east-1) once the on-demand attempt has run ``seconds`` (some checkpoints)."""

    def ran() -> bool:
        for handle in world.handles(key):
            if handle.capacity == names.ON_DEMAND:
                status = world.status(handle)
                if status.state is JobState.RUNNING and status.started_at and time.time() - status.started_at > seconds:
                    return True
        return False

    def raise_scores() -> None:
        try:
            wait_for(ran, 180, "the on-demand attempt to run")
        finally:
            ec2.set_scores({"us-east-1": 9})

    thread = threading.Thread(target=raise_scores, name="spot-returns", daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferrable"])
def test_an_on_demand_attempt_moves_back_to_spot_at_a_checkpoint_when_spot_scores_rise(
    harness: Harness, world: OperatorWorld, ec2: Ec2SpotEmulator, deferrable: bool
) -> None:
    dag_id = world.dag_id(f"sr_{'def' if deferrable else 'sync'}")
    key = world.task_key(dag_id)
    world.hold_spot()  # spot capacity does not come: the first attempt is given up, the second runs on-demand
    releaser = world.release_spot_once_given_up(key)
    returns = _raise_scores_once_on_demand_ran(world, key, ec2)
    capacity = f"SpotFallback(spot_wait_timeout=2.0, backoff=0, spot_return={_spot_return()})"
    run = harness.run(_dag(harness, world, dag_id, capacity, deferrable, 40, 3), dag_id, extra_env=_env(ec2))
    releaser.join(timeout=60)
    returns.join(timeout=60)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    result = task["xcom"]
    assert len(result["attempts"]) == 3, run.log[-6000:]
    first, moved, last = result["attempts"]
    assert (first["capacity"], first["interruption"]) == (names.SPOT, names.CAPACITY_TIMEOUT), first
    assert (moved["capacity"], moved["interruption"]) == (names.ON_DEMAND, names.MOVED_TO_SPOT), moved
    assert (last["capacity"], last["state"]) == (names.SPOT, "SUCCEEDED"), last
    # a planned move, not an interruption; its saving: (32.7726 - 11.5) USD/h over the hour expected, less what ran
    assert (result["interruptions"], result["moves_to_spot"]) == (1, 1), result
    move = moved["spot_return"]
    assert (move["score"], move["spot_usd_per_hour"], move["on_demand_usd_per_hour"]) == (9, 11.5, 32.7726)
    assert move["saving_pct"] == 64.9 and move["saving_usd_per_hour"] == pytest.approx(21.2726)
    assert 3000 < move["remaining_s"] < 3600 and move["saving_usd"] == pytest.approx(
        21.2726 * move["remaining_s"] / 3600, abs=1e-3
    )
    assert result["spot_return_saving_usd"] == move["saving_usd"]
    assert "Moving back to spot: resubmitting on spot (attempt 3, planned move 1 of at most 2" in run.log
    # the spot attempt resumed from the checkpoint the on-demand attempt wrote when asked to stop: no work redone
    step = int(last["resume_from"].rsplit("ckpt-", 1)[1])
    assert step > 0, last
    history = json.loads((harness.tmp / dag_id / "out" / "result.json").read_text())["history"]
    assert history == [
        {"attempt": 2, "capacity": names.ON_DEMAND, "start": 0},
        {"attempt": 3, "capacity": names.SPOT, "start": step},
    ], history
    # what the service was asked: spot, on-demand, spot again; the on-demand job stopped with the move's reason
    assert [(c.capacity, c.attempt) for c in world.created()] == [
        (names.SPOT, 1),
        (names.ON_DEMAND, 2),
        (names.SPOT, 3),
    ]
    stops = dict(world.stopped())
    assert strip_cancel_prefix(stops[moved["job_id"]]).startswith(names.SPOT_RETURN_MARK + "spot placement score 9")
    # the readings: the attempt's instance type, in its region, only while it ran on on-demand
    scores = ec2.requests("GetSpotPlacementScores")
    assert scores and {(r["body"]["InstanceType.1"], r["body"]["RegionName.1"]) for r in scores} == {
        (TYPE, "us-east-1")
    }


@pytest.fixture
def local_only(tmp_path: Path) -> Iterator[LocalOperatorWorld]:
    """The rules below are the engine's, the same on every backend: shown once, on the local backend."""
    world = LocalOperatorWorld(tmp_path)
    try:
        yield world
    finally:
        world.cleanup()


@pytest.mark.parametrize("case", ["saving-low", "read-fails"])
def test_no_move_when_the_saving_is_under_the_threshold_or_the_reading_fails(
    harness: Harness, local_only: LocalOperatorWorld, ec2: Ec2SpotEmulator, case: str
) -> None:
    world = local_only
    dag_id = world.dag_id("sr_nosave" if case == "saving-low" else "sr_noread")
    key = world.task_key(dag_id)
    ec2.set_scores({"us-east-1": 10})
    if case == "saving-low":
        ec2.set_price("us-east-1", "us-east-1a", TYPE, 30.0)  # 8% under on-demand; min_saving 30%
    else:
        ec2.throttle("*", 1)  # every reading refused (RequestLimitExceeded)
    world.preempt_spot_after(0.5, key)  # spot reclaimed: on-demand runs
    capacity = f"SpotFallback(backoff=0, spot_return={_spot_return()})"
    run = harness.run(_dag(harness, world, dag_id, capacity, False, 30), dag_id, extra_env=_env(ec2))
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["interruption"], second["capacity"], second["state"]) == (
        names.PREEMPTED,
        names.ON_DEMAND,
        "SUCCEEDED",
    )
    assert task["xcom"]["moves_to_spot"] == 0 and second["spot_return"] is None
    assert ec2.requests("GetSpotPlacementScores"), "spot capacity was read while the attempt ran on on-demand"
    why = "saves 8%, under min_saving=30%" if case == "saving-low" else "could not read spot capacity"
    assert why in run.log


def test_moves_are_bounded_by_max_moves_so_spot_and_on_demand_cannot_flap(
    harness: Harness, local_only: LocalOperatorWorld, ec2: Ec2SpotEmulator
) -> None:
    """Spot looks available all along, but each spot attempt is reclaimed: one move back (max_moves=1), then the
    job stays on on-demand. With the default cooldown, a reclaim a moment ago holds the move back altogether."""
    world = local_only
    ec2.set_scores({"us-east-1": 10})
    world.options["simulate_preemptions"] = [0.5, 1.0]  # the first two spot attempts are reclaimed
    dag_id = world.dag_id("sr_flap")
    capacity = f"SpotFallback(backoff=0, max_interruptions=3, spot_return={_spot_return(max_moves=1)})"
    run = harness.run(_dag(harness, world, dag_id, capacity, False, 60, 4), dag_id, extra_env=_env(ec2))
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    attempts = task["xcom"]["attempts"]
    assert len(attempts) == 4, run.log[-6000:]
    assert [(a["capacity"], a["interruption"]) for a in attempts] == [
        (names.SPOT, names.PREEMPTED),
        (names.ON_DEMAND, names.MOVED_TO_SPOT),
        (names.SPOT, names.PREEMPTED),
        (names.ON_DEMAND, None),
    ], attempts
    assert (task["xcom"]["interruptions"], task["xcom"]["moves_to_spot"]) == (2, 1)
    reads = len(ec2.requests("GetSpotPlacementScores"))

    # the same with a cooldown of an hour after a reclaim: no move at all, and no reading either
    ec2.reset()
    ec2.set_scores({"us-east-1": 10})
    ec2.set_price("us-east-1", "us-east-1a", TYPE, 11.5)
    dag_id = world.dag_id("sr_cool")
    capacity = f"SpotFallback(backoff=0, spot_return={_spot_return(cooldown=3600)})"
    run = harness.run(_dag(harness, world, dag_id, capacity, False, 20), dag_id, extra_env=_env(ec2))
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    assert [(a["capacity"], a["interruption"]) for a in task["xcom"]["attempts"]] == [
        (names.SPOT, names.PREEMPTED),
        (names.ON_DEMAND, None),
    ], run.log[-5000:]
    assert reads > 0 and "cooldown 3600s" in run.log
    assert not ec2.requests("GetSpotPlacementScores"), "nothing is read while a move is held back"
