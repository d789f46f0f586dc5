"""The week-trace benchmark (benchmarks/capacity_trace.py): its generator, its replay and its report, on small
inputs and hand-made traces whose answers can be worked out by hand (the figures themselves are never asserted)."""

from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.capacity_trace import (
    CONFIGS,
    HOURS,
    INSTANCE_TYPES,
    SPOT_WAIT,
    Config,
    Task,
    diurnal_factor,
    generate,
    main,
    pool_key,
    read_trace,
    replay,
    run,
    write_trace,
)
from gpu_provider.capacity import Ladder, LadderRung, SpotFallback, SpotReturn
from gpu_provider.names import CAPACITY_TIMEOUT, MOVED_TO_SPOT, ON_DEMAND, PREEMPTED, SPOT
from gpu_provider.spend.prices import EC2, SAGEMAKER, PriceBook

(
    ON_DEMAND_ONLY,
    SPOT_THEN_ON_DEMAND,
    INSTANCE_FALLBACK,
    BACK_TO_SPOT,
    INSTANCE_FALLBACK_BACK_TO_SPOT,
    BACK_TO_SPOT_10_MOVES,
    LADDER_SM,
    LADDER_BATCH,
    LADDER_TYPES,
    LADDER_BACK_TO_SPOT,
    COMPOSED,
) = CONFIGS
P5, P4D, G6E = INSTANCE_TYPES


def quiet_trace(**pools: dict[str, Any]) -> dict[str, Any]:
    """A generated trace with every gap and reclaim removed, then ``pools`` (``"batch/spot/p5.48xlarge"``) set."""
    trace = copy.deepcopy(generate(1))
    for data in trace["pools"].values():
        data["unavailable"], data["reclaims"] = [], []
    for key, data in pools.items():
        trace["pools"][key].update(data)
    return trace


# --- the generator ---------------------------------------------------------------------------------


def test_a_seed_gives_the_same_trace_and_other_seeds_other_traces() -> None:
    assert generate(7) == generate(7)
    assert generate(7)["pools"] != generate(8)["pools"]
    assert generate(7)["seed"] == 7 and generate(7)["model"]["gaps"]["A_U_hours"][SPOT][P5] == [10.0, 3.0]


def test_a_written_trace_replays_exactly_as_the_generated_one(tmp_path: Path) -> None:
    trace = generate(3)
    path = write_trace(trace, tmp_path / "week.json")
    assert read_trace(path) == trace
    for start in (0.0, 36.0):
        for config in CONFIGS:
            a, b = replay(trace, config, start_h=start), replay(read_trace(path), config, start_h=start)
            assert (a.cost_usd, a.end_h, [x.outcome for x in a.attempts]) == (
                b.cost_usd,
                b.end_h,
                [x.outcome for x in b.attempts],
            )
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="is not a capacity trace"):
        read_trace(tmp_path / "other.json")


def test_every_pool_has_ordered_gaps_within_the_week_reclaims_only_on_spot_and_the_price_books_price() -> None:
    book = PriceBook()
    trace = generate(5)
    assert len(trace["pools"]) == 2 * 2 * 3
    for key, data in trace["pools"].items():
        service, capacity, itype = key.split("/")
        gaps = data["unavailable"]
        assert all(0 <= s < e <= HOURS for s, e in gaps), key
        assert all(e1 < s2 for (_, e1), (s2, _) in itertools.pairwise(gaps)), key  # alternating: a gap, then capacity
        assert data["reclaims"] == sorted(data["reclaims"]) and all(0 < t < HOURS for t in data["reclaims"])
        assert bool(data["reclaims"]) == (capacity == SPOT), key  # on-demand is never taken back
        catalog = {"batch": EC2, "sagemaker": SAGEMAKER}[service]
        assert data["usd_per_hour"] == pytest.approx(
            book.instance_price(itype, capacity, "us-east-1", catalog).usd_per_hour
        )
    spot, od = trace["pools"][pool_key("batch", SPOT, P5)], trace["pools"][pool_key("batch", ON_DEMAND, P5)]
    assert spot["usd_per_hour"] == pytest.approx(0.4 * od["usd_per_hour"])  # the shipped spot_price_ratio
    assert trace["pools"][pool_key("sagemaker", ON_DEMAND, P5)]["usd_per_hour"] > od["usd_per_hour"]  # ml. prices


def test_spot_reclaims_follow_the_hour_of_day() -> None:
    assert diurnal_factor(18.0) == pytest.approx(1.5) and diurnal_factor(6.0 + 24) == pytest.approx(0.5)
    evening = night = 0
    for seed in range(1, 21):
        for data in generate(seed)["pools"].values():
            for t in data["reclaims"]:
                evening += 14 <= t % 24 < 22
                night += 2 <= t % 24 < 10
    # the factor averages ~1.41 over 14-22 h and ~0.59 over 02-10 h: about 2.4 times as many reclaims
    assert evening > 1.8 * night > 0


# --- the replay ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_on_demand_only_never_redoes_work_and_costs_its_hours_at_the_on_demand_price(seed: int) -> None:
    trace = generate(seed)
    price = trace["pools"][pool_key("batch", ON_DEMAND, P5)]["usd_per_hour"]
    task = Task()
    for start in (0.0, 24.0, 60.0):
        outcome = replay(trace, ON_DEMAND_ONLY, task, start_h=start)
        assert outcome.finished and outcome.work_redone_h == 0 and outcome.reclaims == 0
        [attempt] = outcome.attempts  # an on-demand gap is waited out: no timeout, no second attempt
        assert attempt.capacity == ON_DEMAND and attempt.outcome == "succeeded"
        assert attempt.billed_h == pytest.approx(task.startup_h["batch"] + task.work_h)
        assert outcome.cost_usd == pytest.approx(price * (task.startup_h["batch"] + task.work_h))


def test_an_on_demand_gap_is_waited_out_unbilled() -> None:
    trace = quiet_trace(**{pool_key("batch", ON_DEMAND, P5): {"unavailable": [[0.0, 5.0]]}})
    [attempt] = replay(trace, ON_DEMAND_ONLY).attempts
    assert (attempt.submitted_h, attempt.started_h) == (0.0, 5.0)
    assert attempt.billed_h == pytest.approx(5 / 60 + 40)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_costs_and_work_add_up_on_every_configuration(seed: int) -> None:
    task = Task()
    trace = generate(seed)
    prices = {k: d["usd_per_hour"] for k, d in trace["pools"].items()}
    outcomes = run([trace], task)
    assert len(outcomes) == 7 * len(CONFIGS)
    for o in outcomes:
        assert o.cost_usd == pytest.approx(
            sum(a.billed_h * prices[pool_key(a.service, a.capacity, a.instance_type)] for a in o.attempts)
        )
        assert o.finished, (o.config, o.start_h, o.why)
        assert sum(a.work_kept_h for a in o.attempts) == pytest.approx(task.work_h)
        assert sum(a.work_done_h for a in o.attempts) == pytest.approx(task.work_h + o.work_redone_h)
        for a in o.attempts:
            assert a.submitted_h <= (a.started_h if a.started_h is not None else a.ended_h) <= a.ended_h
            # an attempt works at most its billed time less its start-up, at its type's speed
            assert (
                a.work_done_h <= max(0.0, a.billed_h - task.startup_h[a.service]) * task.speed[a.instance_type] + 1e-9
            )
            assert 0 <= a.work_redone_h < task.checkpoint_every_h * task.speed[a.instance_type] + 1e-9
        # one attempt after another, each after the one before ended
        assert all(b.submitted_h >= a.ended_h for a, b in itertools.pairwise(o.attempts))


def test_a_spot_reclaim_redoes_the_work_since_the_last_checkpoint_and_the_policy_moves_to_on_demand() -> None:
    trace = quiet_trace(**{pool_key("batch", SPOT, P5): {"reclaims": [3.0]}})
    task = Task()
    o = replay(trace, SPOT_THEN_ON_DEMAND, task)
    first, second = o.attempts
    assert [(a.capacity, a.outcome) for a in o.attempts] == [(SPOT, PREEMPTED), (ON_DEMAND, "succeeded")]
    ran = 3.0 - 5 / 60  # after a 5 minute start-up; checkpoints at 0.5 h, 1 h, ... 2.5 h
    assert first.work_done_h == pytest.approx(ran) and first.work_kept_h == pytest.approx(2.5)
    assert o.work_redone_h == pytest.approx(ran - 2.5)
    assert 3.0 <= second.submitted_h <= 3.0 + 2 / 3600  # the policy's backoff: at most 2 s after one interruption
    assert second.work_done_h == pytest.approx(37.5)
    prices = {k: d["usd_per_hour"] for k, d in trace["pools"].items()}
    assert o.cost_usd == pytest.approx(
        3.0 * prices[pool_key("batch", SPOT, P5)] + (5 / 60 + 37.5) * prices[pool_key("batch", ON_DEMAND, P5)]
    )
    # a job that saves at the notice redoes nothing
    assert replay(trace, SPOT_THEN_ON_DEMAND, Task(checkpoint_at_notice=True)).work_redone_h == 0


def test_the_start_of_a_spot_gap_reclaims_the_running_spot_instance() -> None:
    trace = quiet_trace(**{pool_key("batch", SPOT, P5): {"unavailable": [[6.0, 9.0]]}})
    first = replay(trace, SPOT_THEN_ON_DEMAND).attempts[0]
    assert (first.outcome, first.ended_h) == (PREEMPTED, 6.0)
    # an on-demand gap does not touch a running on-demand instance
    trace = quiet_trace(**{pool_key("batch", ON_DEMAND, P5): {"unavailable": [[6.0, 9.0]]}})
    assert [a.outcome for a in replay(trace, ON_DEMAND_ONLY).attempts] == ["succeeded"]


def test_the_next_attempt_and_its_wait_come_from_the_policy_objects() -> None:
    # no spot p5 all week; spot p4d available
    trace = quiet_trace(**{pool_key("batch", SPOT, P5): {"unavailable": [[0.0, HOURS]]}})
    wait_h = SPOT_WAIT.total_seconds() / 3600
    # SpotFallback alone: spot did not come within its wait -> on-demand p5
    o = replay(trace, SPOT_THEN_ON_DEMAND)
    assert [(a.capacity, a.instance_type, a.outcome) for a in o.attempts] == [
        (SPOT, P5, CAPACITY_TIMEOUT),
        (ON_DEMAND, P5, "succeeded"),
    ]
    assert o.attempts[0].ended_h == pytest.approx(wait_h) and o.attempts[0].cost_usd == 0
    # composed with InstanceFallback: the next type on the same capacity, run at its own speed
    o = replay(trace, INSTANCE_FALLBACK)
    assert [(a.capacity, a.instance_type, a.outcome) for a in o.attempts] == [
        (SPOT, P5, CAPACITY_TIMEOUT),
        (SPOT, P4D, "succeeded"),
    ]
    assert o.attempts[1].billed_h == pytest.approx(5 / 60 + 40 / 0.45)
    # the wait is the policy's: another spot_wait_timeout, another timeout
    longer = Config("longer wait", lambda: SpotFallback(spot_wait_timeout=3600, max_interruptions=5))
    assert replay(trace, longer).attempts[0].ended_h == pytest.approx(1.0)


def test_a_ladder_moves_each_attempt_to_its_rungs_service_and_prices_it_there() -> None:
    trace = quiet_trace(
        **{
            pool_key("batch", SPOT, P5): {"reclaims": [2.0]},
            pool_key("sagemaker", SPOT, P5): {"unavailable": [[0.0, HOURS]]},
        }
    )
    prices = {k: d["usd_per_hour"] for k, d in trace["pools"].items()}
    for config, last in ((LADDER_SM, "sagemaker"), (LADDER_BATCH, "batch")):
        o = replay(trace, config)
        assert [(a.service, a.capacity, a.outcome) for a in o.attempts] == [
            ("batch", SPOT, PREEMPTED),
            ("sagemaker", SPOT, CAPACITY_TIMEOUT),  # the ladder's spot_wait_timeout, then one rung down
            (last, ON_DEMAND, "succeeded"),
        ]
        third = o.attempts[2]
        assert o.attempts[1].ended_h - o.attempts[1].submitted_h == pytest.approx(SPOT_WAIT.total_seconds() / 3600)
        assert third.usd_per_hour == prices[pool_key(last, ON_DEMAND, P5)]
        # the work kept on Batch spot carries over: the last attempt works what is left, after its service's start-up
        assert third.work_done_h == pytest.approx(40 - 1.5)
        assert third.billed_h == pytest.approx(Task().startup_h[last] + 38.5)
    # rungs by type: a reclaim moves one rung down, to the next type on the same service
    o = replay(trace, LADDER_TYPES)
    assert [(a.service, a.capacity, a.instance_type) for a in o.attempts][:2] == [
        ("batch", SPOT, P5),
        ("batch", SPOT, P4D),
    ]


def test_a_ladder_rung_the_replay_cannot_play_is_named() -> None:
    two_types = Config(
        "two types", lambda: Ladder(LadderRung("batch", "spot", instance_types=["p5.48xlarge", "p4d.24xlarge"]))
    )
    with pytest.raises(ValueError, match=r"two types: ladder rung 0 \(batch, \['p5.48xlarge', 'p4d.24xlarge'\]\)"):
        replay(quiet_trace(), two_types)


def test_instance_fallback_ladder_and_back_to_spot_replay_as_one_policy() -> None:
    """The composed policy, one object: a capacity gap on Batch spot p5 moves to p4d on the same rung; a reclaim
    there to the next rung (SageMaker spot, p5 first); a reclaim there to Batch on-demand; spot returning on
    SageMaker moves the job back to that rung (the spot rung it was last on), and a reclaim after the move sends it
    to the rung after it again, until max_moves is spent."""
    policy = COMPOSED.policy()
    assert isinstance(policy, Ladder) and policy.instances is not None and policy.spot_return is not None
    trace = quiet_trace(
        **{
            pool_key("batch", SPOT, P5): {"unavailable": [[0.0, HOURS]]},
            pool_key("batch", SPOT, P4D): {"reclaims": [3.0]},
            pool_key("sagemaker", SPOT, P5): {"reclaims": [10.0, 14.0], "unavailable": [[5.0, 5.5]]},
        }
    )
    o = replay(trace, COMPOSED)
    assert [(a.service, a.capacity, a.instance_type, a.rung, a.outcome) for a in o.attempts] == [
        ("batch", SPOT, P5, 0, CAPACITY_TIMEOUT),  # no spot p5: the next type on the same rung
        ("batch", SPOT, P4D, 0, PREEMPTED),  # reclaimed: the next rung
        ("sagemaker", SPOT, P5, 1, PREEMPTED),  # the start of a SageMaker spot gap: the next rung
        ("batch", ON_DEMAND, P5, 2, MOVED_TO_SPOT),  # an hour's cooldown, then back to rung 1
        ("sagemaker", SPOT, P5, 1, PREEMPTED),  # reclaimed after the move: the rung after it
        ("batch", ON_DEMAND, P5, 2, MOVED_TO_SPOT),
        ("sagemaker", SPOT, P5, 1, PREEMPTED),
        ("batch", ON_DEMAND, P5, 2, "succeeded"),  # max_moves=2 spent: it stays on on-demand
    ]
    assert (o.reclaims, o.moves, o.finished) == (4, 2, True)
    prices = {k: d["usd_per_hour"] for k, d in trace["pools"].items()}
    first_move = o.attempts[3].move
    assert first_move is not None and first_move["instance_type"] == P5
    # read where the move goes (SageMaker spot), priced against the attempt's own on-demand (Batch)
    assert first_move["spot_usd_per_hour"] == pytest.approx(prices[pool_key("sagemaker", SPOT, P5)])
    assert first_move["on_demand_usd_per_hour"] == pytest.approx(prices[pool_key("batch", ON_DEMAND, P5)])
    assert 6.0 - 1e-9 <= o.attempts[3].ended_h < 6.0 + 10 / 60  # the cooldown after the reclaim at hour 5
    assert sum(a.work_kept_h for a in o.attempts) == pytest.approx(Task().work_h)
    # the same ladder on p5 alone: the capacity gap on Batch spot moves to the next rung at once
    alone = replay(trace, LADDER_BACK_TO_SPOT).attempts
    assert [(a.service, a.capacity, a.rung, a.outcome) for a in alone[:2]] == [
        ("batch", SPOT, 0, CAPACITY_TIMEOUT),
        ("sagemaker", SPOT, 1, PREEMPTED),
    ]


def test_back_to_spot_moves_the_on_demand_attempt_at_the_first_reading_after_spot_returns() -> None:
    # spot p5 goes away at hour 2 (its running instance reclaimed) and returns at hour 5
    trace = quiet_trace(**{pool_key("batch", SPOT, P5): {"unavailable": [[2.0, 5.0]]}})
    task = Task()
    o = replay(trace, BACK_TO_SPOT, task)
    assert [(a.capacity, a.outcome) for a in o.attempts] == [
        (SPOT, PREEMPTED),
        (ON_DEMAND, MOVED_TO_SPOT),
        (SPOT, "succeeded"),
    ]
    on_demand, back = o.attempts[1], o.attempts[2]
    # the watch reads every 10 minutes from the attempt's submission: the first reading at or after hour 5
    assert 5.0 <= on_demand.ended_h < 5.0 + 10 / 60 and back.submitted_h == on_demand.ended_h
    move = on_demand.move
    assert move is not None and move["score"] == 9 and move["saving_pct"] == 60.0  # spot at 0.4 x on-demand
    assert move["instance_type"] == P5 and move["saving_usd"] > 0
    # a planned move is no interruption: one reclaim in all, and a budget of one is enough
    assert o.reclaims == 1 and o.moves == 1
    strict = Config(
        "budget of one",
        lambda: SpotFallback(max_interruptions=1, spot_wait_timeout=600, spot_return=SpotReturn(regions=["us-east-1"])),
    )
    assert replay(trace, strict).finished
    # the work kept on on-demand carries over to spot; what ran since the last checkpoint is redone
    assert sum(a.work_kept_h for a in o.attempts) == pytest.approx(task.work_h)
    assert replay(trace, BACK_TO_SPOT, Task(checkpoint_at_notice=True)).work_redone_h == 0
    # without the spot-return piece, or while spot stays away, the on-demand attempt runs to the end
    assert [a.outcome for a in replay(trace, SPOT_THEN_ON_DEMAND).attempts] == [PREEMPTED, "succeeded"]
    scarce = quiet_trace(**{pool_key("batch", SPOT, P5): {"unavailable": [[2.0, HOURS]]}})
    assert [a.outcome for a in replay(scarce, BACK_TO_SPOT).attempts] == [PREEMPTED, "succeeded"]


def test_back_to_spot_waits_out_the_cooldown_after_a_reclaim_and_stops_after_max_moves() -> None:
    # spot p5 never runs out, but reclaims a running instance at hours 2, 5 and 8
    trace = quiet_trace(**{pool_key("batch", SPOT, P5): {"reclaims": [2.0, 5.0, 8.0]}})
    o = replay(trace, BACK_TO_SPOT)
    assert [(a.capacity, a.outcome) for a in o.attempts] == [
        (SPOT, PREEMPTED),
        (ON_DEMAND, MOVED_TO_SPOT),
        (SPOT, PREEMPTED),
        (ON_DEMAND, MOVED_TO_SPOT),
        (SPOT, PREEMPTED),
        (ON_DEMAND, "succeeded"),  # max_moves=2 spent: it stays on on-demand
    ]
    assert replay(trace, BACK_TO_SPOT_10_MOVES).moves == 3  # a higher bound: back to spot after every reclaim
    # each move waits an hour (the cooldown) after the reclaim before it, then the next 10 minute reading
    # (the readings' times are sums of floats: "an hour later" may come out 1e-15 h early)
    for reclaimed, moved in ((o.attempts[0], o.attempts[1]), (o.attempts[2], o.attempts[3])):
        assert reclaimed.ended_h + 1.0 - 1e-9 <= moved.ended_h < reclaimed.ended_h + 1.0 + 10 / 60


def test_a_spent_interruption_budget_ends_the_task_unfinished() -> None:
    trace = quiet_trace(**{pool_key("batch", SPOT, P5): {"reclaims": [1.0]}})
    strict = Config("no budget", lambda: SpotFallback(max_interruptions=0))
    o = replay(trace, strict)
    assert not o.finished and "max_interruptions=0" in o.why and len(o.attempts) == 1


def test_a_spot_attempt_still_running_when_the_trace_ends_is_not_counted_as_finished() -> None:
    o = replay(quiet_trace(), SPOT_THEN_ON_DEMAND, start_h=HOURS - 10)
    assert not o.finished and o.attempts[-1].outcome == "running" and "trace ended" in o.why
    assert math.isclose(o.end_h, HOURS)


# --- the report ------------------------------------------------------------------------------------


def test_quick_mode_writes_its_traces_and_a_written_trace_replays_to_the_same_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--quick", "--trace-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"week-seed-{s}.json" for s in (1, 2, 3, 4, 5)]
    rows = [line for line in printed.splitlines() if line.startswith("| ") and "configuration" not in line]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == [c.name for c in CONFIGS]
    assert rows[0].split(" | ")[1] == "35/35" and " | 1.00 | " in rows[0]  # the baseline is its own unit
    # replaying the written files gives the very same table
    assert main([arg for f in files for arg in ("--trace", str(tmp_path / f))]) == 0
    again = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert again[1:] == rows
