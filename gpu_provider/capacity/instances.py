"""Instance fallback: an ordered preference of instance types, tried one per attempt on each capacity rung.

A capacity policy (:class:`~gpu_provider.capacity.SpotFallback`, ...) chooses the capacity of the next
attempt; composed with an :class:`InstanceFallback` it also chooses the instance type, from
``resources.instance_types`` in the order written there:

- each capacity rung starts at the first type; an attempt whose capacity does not come within its
  wait (spot: ``spot_wait_timeout``; on-demand: ``capacity_wait``) is given up, and the next attempt
  runs on the next type, on the same capacity;
- a capacity timeout on the last type is the rung's own: the policy's usual fallback applies (spot ->
  on-demand), and the new rung starts again at the first type;
- a spot reclaim is not a lack of capacity: it goes to the policy as always, and the next attempt
  starts again at the first (the preferred) type.

Every timeout counts against the policy's ``max_interruptions``, as any interruption does: three
types on two rungs may take five timeouts before the last attempt. See
``docs/explanations/capacity-policies.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_provider.job import safe_repr, to_seconds
from gpu_provider.names import CAPACITY_TIMEOUT

if TYPE_CHECKING:
    from gpu_provider.capacity.policies import Interruption

#: how long an on-demand attempt waits for an instance type that is not the last one, by default
DEFAULT_CAPACITY_WAIT_S = 15 * 60.0
#: longest ``capacity_wait`` (a day: past that, naming the type at all is the mistake)
MAX_CAPACITY_WAIT_S = 24 * 3600.0


@dataclass(frozen=True)
class Rung:
    """Where the next attempt runs: a capacity type and, under instance fallback, one instance type."""

    capacity: str
    instance_type: str | None = None
    rung: int | None = None
    """Under a :class:`~gpu_provider.capacity.ladder.Ladder`: the index of the rung (its backend, options and
    overrides); ``None``: the task's own backend."""


class InstanceFallback:
    """Try ``resources.instance_types`` in order on every capacity rung, each with its own capacity wait.

    :param capacity_wait: how long an on-demand attempt may wait for an instance type that is not the
        last one before the next type is tried (a timedelta or seconds, 0 to a day; default 15 minutes).
        Spot attempts wait ``spot_wait_timeout`` per type.
    """

    def __init__(self, *, capacity_wait: Any = timedelta(seconds=DEFAULT_CAPACITY_WAIT_S)) -> None:
        self.capacity_wait_s = to_seconds(
            "capacity.instances.capacity_wait", capacity_wait, allow_none=False, maximum=MAX_CAPACITY_WAIT_S
        )

    def absorbs(self, interruption: Interruption, types: Sequence[str]) -> bool:
        """Whether ``interruption`` is this fallback's to answer (a capacity timeout on a type with a next one)."""
        return (
            interruption.kind == CAPACITY_TIMEOUT
            and interruption.instance_type in types
            and types.index(str(interruption.instance_type)) < len(types) - 1
        )

    def next_type(self, types: Sequence[str], last: Interruption | None, capacity: str) -> str:
        """The type of the next attempt on ``capacity``: the one after the last attempt's after a capacity
        timeout on the same capacity, else the first."""
        if (
            last is not None
            and last.kind == CAPACITY_TIMEOUT
            and last.capacity == capacity
            and last.instance_type in types
        ):
            k = types.index(str(last.instance_type))
            if k < len(types) - 1:
                return types[k + 1]
        return types[0]

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), self.capacity_wait_s))

    def __repr__(self) -> str:
        return f"InstanceFallback(capacity_wait={self.capacity_wait_s!r})"


def check_instances(value: Any) -> InstanceFallback | None:
    """``capacity.instances``: ``None`` or an :class:`InstanceFallback`, else an error naming the value."""
    if value is None or isinstance(value, InstanceFallback):
        return value
    raise TypeError(
        f"capacity.instances={safe_repr(value)} ({type(value).__name__}) must be InstanceFallback(...) or None"
    )


def known_instance_types() -> frozenset[str]:
    """The instance types of the shipped price table (EC2 names, and SageMaker's with ``ml.``)."""
    from gpu_provider.spend.prices import shipped_table

    return frozenset(shipped_table()["instances"])


def validate_instance_fallback(types: Sequence[str], *, backend: Any = None) -> tuple[str, ...]:
    """Parse-time checks of an ordered instance preference: at least one type, no repeats, each known to
    the price table (its price is what the attempt costs), and each allowed by ``backend``
    (:meth:`~gpu_provider.backends.base.Backend.validate_instance_fallback`)."""
    types = tuple(types)
    if not types:
        raise ValueError(
            "resources.instance_types=[]: capacity.instances=InstanceFallback(...) tries instance types in "
            "order, so name them, e.g. GpuResources(instance_types=('p5.48xlarge', 'p4d.24xlarge'))"
        )
    repeated = sorted({t for t in types if types.count(t) > 1})
    if repeated:
        raise ValueError(
            f"resources.instance_types={list(types)!r} names {', '.join(repeated)} more than once; "
            "an ordered preference names each type once"
        )
    known = known_instance_types()
    for t in types:
        if t not in known:
            raise ValueError(
                f"resources.instance_types: {t!r} is not in the price table (gpu_provider/spend/prices.json), so "
                f"its attempts could not be priced; allowed: {', '.join(sorted(known))}"
            )
    if backend is not None:
        backend.validate_instance_fallback(types)
    return types
