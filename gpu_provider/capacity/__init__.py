"""Capacity decisions, in one place: small policy objects the attempt engine asks, composed.

- :mod:`~gpu_provider.capacity.policies`: which capacity (spot, on-demand) each attempt runs on and how
  many interruptions a task absorbs (:class:`OnDemand`, :class:`Spot`, :class:`SpotFallback`);
- :mod:`~gpu_provider.capacity.instances`: which instance type, from an ordered preference
  (:class:`InstanceFallback`, composed into a policy with ``instances=``);
- :mod:`~gpu_provider.capacity.spot_return`: back to spot when spot returns (:class:`SpotReturn`, composed
  into ``SpotFallback`` or a ``Ladder`` with ``spot_return=``): a planned move of an on-demand attempt at a
  checkpoint.
- :mod:`~gpu_provider.capacity.ladder`: rungs on several backends or regions, one checkpoint for all
  (:class:`Ladder` of :class:`LadderRung`); composed with ``instances=`` and ``spot_return=`` too.

The engine (:mod:`gpu_provider.engine.attempts`) asks the policy for the next :class:`Rung`; a backend
only answers whether it can run a rung (``Backend.validate``, ``Backend.validate_instance_fallback``)
and runs it (``Backend.submit`` with ``JobRequest.capacity`` and ``JobRequest.instance_type``).
See ``docs/explanations/capacity-policies.md``.
"""

from __future__ import annotations

from gpu_provider.capacity.instances import InstanceFallback, Rung, validate_instance_fallback
from gpu_provider.capacity.ladder import Ladder, LadderRung
from gpu_provider.capacity.policies import (
    MAX_BACKOFF_S,
    MAX_INTERRUPTIONS,
    CapacityPolicy,
    Interruption,
    OnDemand,
    Spot,
    SpotFallback,
    resolve_capacity,
)
from gpu_provider.capacity.spot_return import SpotReturn

__all__ = [
    "MAX_BACKOFF_S",
    "MAX_INTERRUPTIONS",
    "CapacityPolicy",
    "InstanceFallback",
    "Interruption",
    "Ladder",
    "LadderRung",
    "OnDemand",
    "Rung",
    "Spot",
    "SpotFallback",
    "SpotReturn",
    "resolve_capacity",
    "validate_instance_fallback",
]
