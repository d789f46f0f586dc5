"""Capacity policies: which capacity comes next, and the backoff between attempts."""

from __future__ import annotations

import random

from gpu_provider import OnDemand, Spot, SpotFallback
from gpu_provider.recovery import CAPACITY_TIMEOUT, ON_DEMAND, PREEMPTED, SPOT, Interruption


def _reclaims(n: int) -> list[Interruption]:
    return [Interruption(attempt=i + 1, capacity=SPOT, kind=PREEMPTED) for i in range(n)]


def test_spot_fallback_switches_after_the_configured_number_of_reclaims() -> None:
    policy = SpotFallback(after_preemptions=2)
    assert policy.first_capacity() == SPOT
    assert policy.capacity_after(_reclaims(1)) == SPOT
    assert policy.capacity_after(_reclaims(2)) == ON_DEMAND
    assert policy.may_use == {SPOT, ON_DEMAND}


def test_spot_fallback_goes_on_demand_when_spot_never_came() -> None:
    timeout = [Interruption(attempt=1, capacity=SPOT, kind=CAPACITY_TIMEOUT)]
    assert SpotFallback(after_preemptions=5).capacity_after(timeout) == ON_DEMAND


def test_after_preemptions_zero_means_on_demand_from_the_start() -> None:
    policy = SpotFallback(after_preemptions=0)
    assert policy.first_capacity() == ON_DEMAND
    assert policy.may_use == {ON_DEMAND}


def test_spot_and_on_demand_stay_put() -> None:
    assert Spot().capacity_after(_reclaims(3)) == SPOT
    assert OnDemand().capacity_after(_reclaims(3)) == ON_DEMAND
    assert Spot().spot_wait_timeout_s is None
    assert Spot(spot_wait_timeout=90).spot_wait_timeout_s == 90.0


def test_budget_counts_every_interruption() -> None:
    policy = Spot(max_interruptions=2)
    assert policy.budget_left(_reclaims(1)) == 1
    assert policy.budget_left(_reclaims(3)) == -1


def test_backoff_has_full_jitter_grows_and_is_capped() -> None:
    policy = OnDemand(backoff=2)
    rng = random.Random(7)
    assert policy.backoff_delay(0, rng=rng) == 0.0
    first = [policy.backoff_delay(1, rng=rng) for _ in range(200)]
    third = [policy.backoff_delay(3, rng=rng) for _ in range(200)]
    assert min(first) >= 0 and max(first) <= 2.0
    assert max(third) <= 8.0 and max(third) > 2.0  # grows x2 per interruption
    assert len({round(x, 6) for x in first}) > 100  # jittered, not a fixed delay
    assert max(policy.backoff_delay(30, rng=rng) for _ in range(50)) <= 300.0
    assert OnDemand(backoff=0).backoff_delay(5) == 0.0


def test_backoff_after_a_long_history_does_not_overflow() -> None:
    # interruptions come from stored records: a long (or corrupted) history must not crash the delay
    rng = random.Random(3)
    assert 0.0 <= OnDemand(backoff=2).backoff_delay(5000, rng=rng) <= 300.0
