"""Old home of the capacity policies: they live in :mod:`gpu_provider.capacity` now; these names stay."""

from __future__ import annotations

from gpu_provider.capacity import (
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
    "CapacityPolicy",
    "Interruption",
    "OnDemand",
    "Spot",
    "SpotFallback",
    "resolve_capacity",
]
