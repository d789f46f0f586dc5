"""Capacity policies: which capacity each attempt runs on, and how many interruptions a task absorbs.

(Moved here from ``gpu_provider.recovery``, which re-exports these names.)

A policy is a small strategy object. The operator asks it for the first attempt's capacity, and
after every interruption (a spot reclaim, or spot capacity that never came) for the next one. The
interruption budget is separate from Airflow's ``retries``: a job's own error raises and goes to
Airflow's retries; an interruption is absorbed here until the budget is spent.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_provider.job import safe_repr, to_seconds
from gpu_provider.names import CAPACITY_TIMEOUT, ON_DEMAND, PREEMPTED, SPOT

if TYPE_CHECKING:
    from gpu_provider.capacity.instances import InstanceFallback, Rung
    from gpu_provider.capacity.spot_return import SpotReturn

_DEFAULT_MAX_INTERRUPTIONS = 3
_DEFAULT_MAX_NODE_FAULTS = 2
_DEFAULT_SPOT_WAIT_S = 30 * 60.0

#: most interruptions one task instance may absorb (each one is a new attempt); also the cap of ``after_preemptions``
MAX_INTERRUPTIONS = 100
#: longest backoff base, in seconds; the delay itself never exceeds it either
MAX_BACKOFF_S = 300.0


def _count(field_name: str, value: Any) -> int:
    """An integer ``0 <= value <= MAX_INTERRUPTIONS``, or an error naming the field and the range."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(
            f"{field_name}={value!r} ({type(value).__name__}) must be an integer from 0 to {MAX_INTERRUPTIONS}"
        )
    if not 0 <= value <= MAX_INTERRUPTIONS:
        raise ValueError(f"{field_name}={safe_repr(value)} must be an integer from 0 to {MAX_INTERRUPTIONS}")
    return value


@dataclass(frozen=True)
class Interruption:
    """One attempt that ended without the job's own fault."""

    attempt: int
    capacity: str
    kind: str  # PREEMPTED | CAPACITY_TIMEOUT | LOST | NODE_FAULT
    instance_type: str | None = None
    """The instance type the policy chose for the attempt (instance fallback), else ``None``."""
    rung: int | None = None
    """Under a :class:`~gpu_provider.capacity.Ladder`: the rung the attempt ran on, else ``None``."""


class CapacityPolicy(ABC):
    """Base of the capacity policies. Subclasses say which capacity comes next.

    :param max_interruptions: how many interruptions (preemptions plus spot wait timeouts) one
        task instance absorbs across all its tries before it fails; separate from ``retries``.
        0 to :data:`MAX_INTERRUPTIONS`.
    :param backoff: base delay before resubmitting after an interruption (a timedelta or seconds,
        0 to :data:`MAX_BACKOFF_S`); grows x2 per interruption, capped at 5 minutes, with full jitter.
        Default 0: the next attempt is submitted as soon as the interruption is known (it waits for capacity
        in the service's queue; a throttled submission is retried with its own jittered backoff). Set it to
        spread the resubmissions of many tasks interrupted at once.
    :param max_node_faults: how many GPU hardware faults (``node_fault``: an XID or ECC error, a GPU
        fallen off the bus, an NCCL watchdog timeout on several nodes, an unhealthy node) one task
        instance absorbs, each resubmitted on fresh hardware; its own budget, not counted in
        ``max_interruptions``. 0 to :data:`MAX_INTERRUPTIONS`.
    :param instances: an :class:`~gpu_provider.InstanceFallback`: each capacity this policy
        chooses tries ``resources.instance_types`` in their order, one attempt per type, the next type
        when capacity for one does not come (``docs/explanations/capacity-policies.md``). ``None``:
        ``instance_types`` is a set the backend picks from.
    """

    name = "policy"
    #: back to spot when spot returns (:class:`~gpu_provider.SpotReturn`; ``SpotFallback`` or ``Ladder``)
    spot_return: SpotReturn | None = None

    def __init__(
        self,
        *,
        max_interruptions: int = _DEFAULT_MAX_INTERRUPTIONS,
        backoff: Any = 0.0,
        max_node_faults: int = _DEFAULT_MAX_NODE_FAULTS,
        instances: InstanceFallback | None = None,
    ) -> None:
        self.max_interruptions = _count("capacity.max_interruptions", max_interruptions)
        self.max_node_faults = _count("capacity.max_node_faults", max_node_faults)
        self.backoff_s = to_seconds("capacity.backoff", backoff, allow_none=False, maximum=MAX_BACKOFF_S) or 0.0
        from gpu_provider.capacity.instances import check_instances

        self.instances = check_instances(instances)

    # --- what subclasses decide ---
    @abstractmethod
    def first_capacity(self) -> str:
        """Capacity of the first attempt."""

    @abstractmethod
    def capacity_after(self, interruptions: Sequence[Interruption]) -> str:
        """Capacity for the next attempt, given every interruption so far (oldest first)."""

    @property
    def spot_wait_timeout_s(self) -> float | None:
        """How long a spot attempt may stay queued before it is given up (None: wait forever)."""
        return None

    @property
    def may_use(self) -> frozenset[str]:
        """Every capacity type an attempt under this policy may run on."""
        return frozenset({self.first_capacity()})

    # --- composed with the other decisions (instance fallback) ---
    def rung_after(self, interruptions: Sequence[Interruption], instance_types: Sequence[str] = ()) -> Rung:
        """The capacity and instance type of the next attempt, given every interruption so far.

        Without :attr:`instances` (or without ``instance_types``) this is :meth:`first_capacity` /
        :meth:`capacity_after` and no instance type. With it, a capacity timeout on a type that is not
        the last one is the instance fallback's to absorb (the next type, same capacity); everything
        else (reclaims, a timeout on the last type) goes to this policy, whose capacity then starts
        again at the first type.
        """
        from gpu_provider.capacity.instances import Rung

        if self.instances is None or not instance_types:
            capacity = self.capacity_after(interruptions) if interruptions else self.first_capacity()
            return Rung(capacity)
        seen = [i for i in interruptions if not self.instances.absorbs(i, instance_types)]
        capacity = self.capacity_after(seen) if seen else self.first_capacity()
        last = interruptions[-1] if interruptions else None
        return Rung(capacity, self.instances.next_type(instance_types, last, capacity))

    # --- where an attempt runs (one place unless a :class:`~gpu_provider.capacity.Ladder` names several) ---
    def rung(self, index: int | None) -> Any:
        """The ladder rung ``index`` names (a :class:`~gpu_provider.capacity.LadderRung`); ``None`` here: a policy
        on one backend has no rungs."""
        return None

    def types_for(self, index: int | None, instance_types: Sequence[str] = ()) -> tuple[str, ...]:
        """The instance types an attempt on rung ``index`` chooses from: the task's here."""
        return tuple(instance_types)

    def rung_after_move(self, rungs_run: Sequence[int | None], instance_types: Sequence[str] = ()) -> Rung:
        """The next attempt after a move back to spot (``rungs_run``: the rungs of the run's attempts): spot, at the
        preferred instance type under instance fallback."""
        from gpu_provider.capacity.instances import Rung

        return Rung(SPOT, instance_types[0] if self.instances is not None and instance_types else None)

    def spot_watch(self, record: Any, run: Sequence[Any], instance_types: Sequence[str] = ()) -> dict[str, Any] | None:
        """What ``record``'s wait reads to move the job back to spot (:meth:`SpotReturn.watch_for`); ``None``:
        nothing to read."""
        if self.spot_return is None:
            return None
        return self.spot_return.watch_for(record, run, instance_types)

    def capacity_wait_for(
        self, capacity: str, instance_type: str | None, instance_types: Sequence[str] = ()
    ) -> float | None:
        """How long an attempt on ``capacity`` and ``instance_type`` may wait for capacity (``None``: no limit).

        Spot: :attr:`spot_wait_timeout_s`, for each instance type anew. On-demand: the instance
        fallback's ``capacity_wait`` on every type but the last (which waits as on-demand always does).
        """
        if capacity == SPOT:
            return self.spot_wait_timeout_s
        if self.instances is not None and instance_type and instance_type in instance_types[:-1]:
            return self.instances.capacity_wait_s
        return None

    # --- shared rules ---
    def budget_left(self, interruptions: Sequence[Interruption]) -> int:
        return self.max_interruptions - len(interruptions)

    def backoff_delay(self, interruptions: int, *, rng: random.Random | None = None) -> float:
        """Full-jitter exponential backoff before the next submission."""
        if self.backoff_s <= 0 or interruptions <= 0:
            return 0.0
        # the exponent is bounded so a long history cannot overflow the float
        cap = min(MAX_BACKOFF_S, self.backoff_s * 2.0 ** min(interruptions - 1, 32))
        return (rng or random).uniform(0, cap)

    def describe(self) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class OnDemand(CapacityPolicy):
    """Every attempt on on-demand capacity. Hosts can still fail; those interruptions are absorbed too."""

    name = "on_demand"

    def first_capacity(self) -> str:
        return ON_DEMAND

    def capacity_after(self, interruptions: Sequence[Interruption]) -> str:
        return ON_DEMAND


class Spot(CapacityPolicy):
    """Every attempt on spot capacity; each reclaim resumes from the latest checkpoint, on spot again.

    :param spot_wait_timeout: give up an attempt still waiting for spot capacity after this long
        (a timedelta or seconds, at most 366 days) and submit the next one, on spot again; ``None`` waits forever.
    """

    name = "spot"

    def __init__(self, *, spot_wait_timeout: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._spot_wait_s = to_seconds("capacity.spot_wait_timeout", spot_wait_timeout)

    @property
    def spot_wait_timeout_s(self) -> float | None:
        return self._spot_wait_s

    def first_capacity(self) -> str:
        return SPOT

    def capacity_after(self, interruptions: Sequence[Interruption]) -> str:
        return SPOT


class SpotFallback(CapacityPolicy):
    """Spot first; on-demand once spot has been reclaimed ``after_preemptions`` times, or has not
    come within ``spot_wait_timeout``.

    :param after_preemptions: spot reclaims tolerated before switching to on-demand (default 1:
        the attempt after the first reclaim runs on-demand). 0 means on-demand from the start.
    :param spot_wait_timeout: how long an attempt may wait for spot capacity before it is cancelled
        and resubmitted on-demand (default 30 minutes; ``None`` waits forever).
    :param spot_return: a :class:`~gpu_provider.SpotReturn`: while an attempt runs on on-demand, watch spot
        capacity and move the job back to spot at a checkpoint when it returns and saves enough (a planned
        move, not an interruption). ``None`` (default): an on-demand attempt runs to its end.
    """

    name = "spot_fallback"

    def __init__(
        self,
        *,
        after_preemptions: int = 1,
        spot_wait_timeout: Any = timedelta(seconds=_DEFAULT_SPOT_WAIT_S),
        spot_return: SpotReturn | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.after_preemptions = _count("capacity.after_preemptions", after_preemptions)
        self._spot_wait_s = to_seconds("capacity.spot_wait_timeout", spot_wait_timeout)
        from gpu_provider.capacity.spot_return import check_spot_return

        self.spot_return = check_spot_return(spot_return)

    @property
    def spot_wait_timeout_s(self) -> float | None:
        return self._spot_wait_s

    def first_capacity(self) -> str:
        return SPOT if self.after_preemptions > 0 else ON_DEMAND

    def capacity_after(self, interruptions: Sequence[Interruption]) -> str:
        spot_reclaims = sum(1 for i in interruptions if i.kind == PREEMPTED and i.capacity == SPOT)
        if any(i.kind == CAPACITY_TIMEOUT for i in interruptions):
            return ON_DEMAND
        return SPOT if spot_reclaims < self.after_preemptions else ON_DEMAND

    @property
    def may_use(self) -> frozenset[str]:
        spot = self.after_preemptions > 0 or self.spot_return is not None
        return frozenset({SPOT, ON_DEMAND}) if spot else frozenset({ON_DEMAND})


_BY_NAME: dict[str, type[CapacityPolicy]] = {"on_demand": OnDemand, "spot": Spot, "spot_fallback": SpotFallback}


def resolve_capacity(value: CapacityPolicy | str | None) -> CapacityPolicy:
    """``capacity=``: a policy object, or one of ``"on_demand"`` (default), ``"spot"``, ``"spot_fallback"``."""
    if value is None:
        return OnDemand()
    if isinstance(value, CapacityPolicy):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if key in _BY_NAME:
            return _BY_NAME[key]()
        raise ValueError(
            f"capacity={value!r} is not a capacity policy; allowed: {', '.join(_BY_NAME)} or a policy object"
        )
    raise TypeError(
        f"capacity={value!r} ({type(value).__name__}) must be OnDemand(), Spot(), SpotFallback(...) "
        f"or one of {', '.join(map(repr, _BY_NAME))}"
    )
