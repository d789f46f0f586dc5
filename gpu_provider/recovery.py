"""Old home of the capacity policies: they live in :mod:`gpu_provider.capacity` now; these names stay."""

from __future__ import annotations

from gpu_provider.capacity.policies import (
    _BY_NAME,
    _DEFAULT_MAX_INTERRUPTIONS,
    _DEFAULT_MAX_NODE_FAULTS,
    _DEFAULT_SPOT_WAIT_S,
    MAX_BACKOFF_S,
    MAX_INTERRUPTIONS,
    CapacityPolicy,
    Interruption,
    OnDemand,
    Spot,
    SpotFallback,
    resolve_capacity,
)
from gpu_provider.names import CAPACITY_TIMEOUT, ON_DEMAND, PREEMPTED, SPOT

__all__ = [
    "CAPACITY_TIMEOUT",
    "MAX_BACKOFF_S",
    "MAX_INTERRUPTIONS",
    "ON_DEMAND",
    "PREEMPTED",
    "SPOT",
    "_BY_NAME",
    "_DEFAULT_MAX_INTERRUPTIONS",
    "_DEFAULT_MAX_NODE_FAULTS",
    "_DEFAULT_SPOT_WAIT_S",
    "CapacityPolicy",
    "Interruption",
    "OnDemand",
    "Spot",
    "SpotFallback",
    "resolve_capacity",
]
