"""Back to spot when spot returns: end an on-demand attempt at a checkpoint and continue on spot.

An opt-in piece of a capacity policy (``SpotFallback(spot_return=SpotReturn(...))``, or a ``Ladder``'s, which
reads and moves to the spot rung the job was last on: :meth:`~gpu_provider.capacity.Ladder.spot_watch`). While
an attempt runs on on-demand capacity, every ``check_every`` the wait (the worker's, or the trigger's) reads EC2's
spot signals for the attempt's instance types, the same reads ``SpotCapacitySensor`` makes: the spot
placement score (``GetSpotPlacementScores``) and the spot price in effect now
(``DescribeSpotPriceHistory``). When

- spot is available (a score of at least ``min_score`` in one of the regions),
- spot is cheaper by at least ``min_saving`` (``1 - spot price / on-demand price``, the on-demand price
  from the price book), and
- enough work remains (``expected_runtime`` minus the time the job's run has had; always when
  ``expected_runtime`` is not given),

the owning try, after a fresh read that the attempt still runs and is its own, asks the job to checkpoint
and stop through the same path a spot interruption takes (the backend's stop: SIGTERM, the grace period,
SIGKILL), waits for it to end, and submits the next attempt on spot, resuming from that checkpoint.

The move is *planned*: recorded as ``interruption="moved_to_spot"`` (:data:`gpu_provider.names.MOVED_TO_SPOT`)
with the reading and the estimated saving in the attempt record (``spot_return``), not counted against
``max_interruptions`` and not seen by the capacity policy. It is bounded: at most ``max_moves`` per run of
the job, none within ``cooldown`` after a spot reclaim, and a reading that fails (throttled, refused,
unreachable) never moves anything. See ``docs/explanations/capacity-policies.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from gpu_provider.job import safe_repr, to_seconds
from gpu_provider.names import MOVED_TO_SPOT, ON_DEMAND, PREEMPTED, SPOT

DEFAULT_MIN_SAVING = 0.3
DEFAULT_MIN_SCORE = 7
DEFAULT_MIN_REMAINING_S = 30 * 60.0
DEFAULT_CHECK_EVERY_S = 10 * 60.0
DEFAULT_MAX_MOVES = 2
DEFAULT_COOLDOWN_S = 3600.0
#: most planned moves one run of a job may make
MAX_MOVES = 20
#: the longest ``check_every``: a day (EC2's scores change within hours)
MAX_CHECK_EVERY_S = 24 * 3600.0
#: the shortest ``check_every`` (tests use fractions of a second; EC2 throttles readings far apart anyway)
MIN_CHECK_EVERY_S = 0.1


def _fraction(field: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{field}={safe_repr(value)} ({type(value).__name__}) must be a number from 0 to less than 1")
    if not math.isfinite(value) or not 0 <= value < 1:
        raise ValueError(f"{field}={safe_repr(value)} must be a number from 0 to less than 1 (0.3: spot 30% cheaper)")
    return float(value)


def _integer(field: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{field}={safe_repr(value)} ({type(value).__name__}) must be an integer from {low} to {high}")
    if not low <= value <= high:
        raise ValueError(f"{field}={safe_repr(value)} must be an integer from {low} to {high}")
    return value


def _iso_seconds(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).timestamp()


class SpotReturn:
    """Move an on-demand attempt back to spot, at a checkpoint, when spot capacity returns and pays.

    :param min_saving: the least saving that justifies a move, as a share of the on-demand price (0 to less
        than 1; default 0.3: spot at most 70% of on-demand).
    :param min_score: the spot placement score (1-10) that counts as "spot is available" (default 7).
    :param min_remaining: the least work that must remain for a move to pay for its restart (a timedelta or
        seconds, 0 to 366 days; default 30 minutes). Needs ``expected_runtime``; without it, work always remains.
    :param expected_runtime: how long the job runs in all, uninterrupted (a timedelta or seconds); the time
        left is this minus what the run's attempts have run so far. ``None`` (default): unknown.
    :param check_every: time between two readings of spot capacity while an attempt runs on on-demand (a
        timedelta or seconds, 0.1 s to a day; default 10 minutes).
    :param max_moves: planned moves one run of the job may make (0 to 20; default 2).
    :param cooldown: no move within this long after a spot reclaim of the run (a timedelta or seconds;
        default an hour).
    :param instance_types: the EC2 instance types whose spot capacity is read; default the attempt's own
        type (instance fallback), else the task's ``resources.instance_types`` (``ml.`` removed). One of the
        two must name a type: checked when the DAG is parsed.
    :param regions: the AWS regions read (at most 10); default the AWS connection's region.
    :param aws_conn_id: the Airflow AWS connection the readings use (default ``aws_default``).
    """

    def __init__(
        self,
        *,
        min_saving: float = DEFAULT_MIN_SAVING,
        min_score: int = DEFAULT_MIN_SCORE,
        min_remaining: Any = timedelta(seconds=DEFAULT_MIN_REMAINING_S),
        expected_runtime: Any = None,
        check_every: Any = timedelta(seconds=DEFAULT_CHECK_EVERY_S),
        max_moves: int = DEFAULT_MAX_MOVES,
        cooldown: Any = timedelta(seconds=DEFAULT_COOLDOWN_S),
        instance_types: Sequence[str] | None = None,
        regions: Sequence[str] | None = None,
        aws_conn_id: str | None = "aws_default",
    ) -> None:
        from gpu_provider.triggers.spot_capacity import validate_instance_types, validate_regions

        prefix = "capacity.spot_return."
        self.min_saving = _fraction(prefix + "min_saving", min_saving)
        self.min_score = _integer(prefix + "min_score", min_score, 1, 10)
        self.min_remaining_s = to_seconds(prefix + "min_remaining", min_remaining, allow_none=False) or 0.0
        self.expected_runtime_s = to_seconds(prefix + "expected_runtime", expected_runtime)
        if self.expected_runtime_s == 0:
            raise ValueError(f"{prefix}expected_runtime=0: give the job's expected runtime (more than 0) or None")
        every = to_seconds(prefix + "check_every", check_every, allow_none=False, maximum=MAX_CHECK_EVERY_S) or 0.0
        if every < MIN_CHECK_EVERY_S:
            raise ValueError(
                f"{prefix}check_every={safe_repr(check_every)} is too short: use {MIN_CHECK_EVERY_S:g} s to a day"
            )
        self.check_every_s = every
        self.max_moves = _integer(prefix + "max_moves", max_moves, 0, MAX_MOVES)
        self.cooldown_s = to_seconds(prefix + "cooldown", cooldown, allow_none=False) or 0.0
        self.instance_types = (
            None if instance_types is None else validate_instance_types(list(instance_types), prefix + "instance_types")
        )
        self.regions = None if regions is None else validate_regions(list(regions), prefix + "regions")
        if aws_conn_id is not None and (not isinstance(aws_conn_id, str) or not aws_conn_id):
            raise TypeError(f"{prefix}aws_conn_id={safe_repr(aws_conn_id)} must be an Airflow connection id or None")
        self.aws_conn_id = aws_conn_id

    # --- parse time -------------------------------------------------------------------------------
    def watched_types(self, resources_types: Sequence[str], choice: str | None = None) -> tuple[str, ...]:
        """The EC2 instance types whose spot capacity is read for an attempt (``ml.`` removed)."""
        if self.instance_types:
            return self.instance_types
        types = [choice] if choice else list(resources_types)
        return tuple(dict.fromkeys(t.removeprefix("ml.") for t in types))

    def validate(self, resources_types: Sequence[str]) -> None:
        """Parse-time: some instance type to read spot capacity for, each an EC2 name; the AWS clients installed."""
        from gpu_provider.extras import require_extra
        from gpu_provider.triggers.spot_capacity import validate_instance_types

        require_extra("aws", "capacity.spot_return (reads EC2 spot placement scores and prices)")

        types = self.watched_types(resources_types)
        if not types:
            raise ValueError(
                "capacity.spot_return needs instance types to read spot capacity for: give "
                "GpuResources(instance_types=(...)) or SpotReturn(instance_types=(...)), e.g. ('p4d.24xlarge',)"
            )
        validate_instance_types(list(types), "resources.instance_types")

    # --- what an attempt's wait needs (JSON: it travels to the triggerer) ---------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "min_saving": self.min_saving,
            "min_score": self.min_score,
            "min_remaining": self.min_remaining_s,
            "expected_runtime": self.expected_runtime_s,
            "check_every": self.check_every_s,
            "max_moves": self.max_moves,
            "cooldown": self.cooldown_s,
            "instance_types": list(self.instance_types) if self.instance_types else None,
            "regions": list(self.regions) if self.regions else None,
            "aws_conn_id": self.aws_conn_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpotReturn:
        return cls(**{k: v for k, v in data.items() if k in _KEYS})

    def watch_for(self, record: Any, run: Sequence[Any], resources_types: Sequence[str]) -> dict[str, Any] | None:
        """What the wait of ``record``'s attempt needs to read spot capacity (``None``: no reading is due at
        all: the attempt is not on on-demand, a move was already asked of it, or ``max_moves`` is spent).

        :param run: the attempts of the job's current run, oldest first (``record`` among them)
        """
        if record.capacity != ON_DEMAND or record.interruption or record.state.terminal:
            return None
        moves = sum(1 for r in run if r.interruption == MOVED_TO_SPOT)
        if moves >= self.max_moves:
            return None
        reclaims = [_iso_seconds(r.ended_at) for r in run if r.capacity == SPOT and r.interruption == PREEMPTED]
        ran_before = 0.0
        for r in run:
            if r is record:
                continue
            start, end = _iso_seconds(r.started_at), _iso_seconds(r.ended_at)
            if start is not None and end is not None and end > start:
                ran_before += end - start
        return {
            "policy": self.to_dict(),
            "instance_types": list(self.watched_types(resources_types, record.instance_choice)),
            "instance_type": (record.instance_choice or record.instance_type or "").removeprefix("ml.") or None,
            "nodes": int(record.nodes or 1),
            "moves": moves,
            "last_reclaim_at": max((t for t in reclaims if t is not None), default=None),
            "ran_before_s": round(ran_before, 3),
        }

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, str(v)) for k, v in vars(self).items())))

    def __repr__(self) -> str:
        return f"SpotReturn({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


_KEYS = frozenset(
    {
        "min_saving",
        "min_score",
        "min_remaining",
        "expected_runtime",
        "check_every",
        "max_moves",
        "cooldown",
        "instance_types",
        "regions",
        "aws_conn_id",
    }
)


def check_spot_return(value: Any) -> SpotReturn | None:
    """``capacity.spot_return``: ``None`` or a :class:`SpotReturn`, else an error naming the value."""
    if value is None or isinstance(value, SpotReturn):
        return value
    raise TypeError(f"capacity.spot_return={safe_repr(value)} ({type(value).__name__}) must be SpotReturn(...) or None")


class SpotReturnWatch:
    """The spot readings of one on-demand attempt's wait (worker or triggerer), and the decision.

    :param watch: :meth:`SpotReturn.watch_for`'s mapping.
    :param on_demand_price: ``instance_type -> USD per instance-hour`` on on-demand (default: the price book).
    :param clients: ``region -> EC2 client`` to read spot capacity with (default: built from the policy's AWS
        connection on the first reading; a replay or a test gives its own).
    """

    def __init__(
        self,
        watch: Mapping[str, Any],
        *,
        on_demand_price: Callable[[str, str | None], float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        clients: Callable[[str], Any] | None = None,
    ) -> None:
        self.watch = dict(watch)
        self.policy = SpotReturn.from_dict(self.watch["policy"])
        self.clock = clock
        self._next = clock() + self.policy.check_every_s
        self._on_demand_price = on_demand_price
        self._clients: Any = clients
        #: why the last reading did not move the attempt (for the log and tests)
        self.why_not = ""
        self.readings = 0

    def due(self) -> bool:
        return self.clock() >= self._next

    def check(self, status: Any, log: Any = None) -> dict[str, Any] | None:
        """One reading, once ``check_every`` has passed: the decision to move (the reading and the saving), or
        ``None`` (``why_not`` says why). A reading that fails is no move. Blocking (boto3)."""
        self._next = self.clock() + self.policy.check_every_s
        if getattr(status, "state", None) is None or status.state.value != "RUNNING":
            self.why_not = "the attempt is not running"
            return None
        blocked = self._blocked()
        if blocked:
            if log is not None and blocked.split(" (")[0] != self.why_not.split(" (")[0]:
                log.info("Spot return: no reading now: %s.", blocked)
            self.why_not = blocked
            return None
        self.readings += 1
        try:
            reading, region = self._read()
        except Exception as err:  # throttled, refused, unreachable: no evidence, no move
            self.why_not = f"could not read spot capacity ({type(err).__name__}: {err}); no move on a guess"
            if log is not None:
                log.warning("Spot return: %s.", self.why_not)
            return None
        decision, why = self.decide(reading, region, status)
        self.why_not = why
        if log is not None:
            log.info("Spot return: %s", why if decision is None else decision["summary"])
        return decision

    def _blocked(self) -> str:
        policy, watch = self.policy, self.watch
        if int(watch.get("moves") or 0) >= policy.max_moves:
            return f"max_moves={policy.max_moves} reached"
        last = watch.get("last_reclaim_at")
        if last is not None and time.time() - float(last) < policy.cooldown_s:
            return f"spot was reclaimed {time.time() - float(last):.0f}s ago (cooldown {policy.cooldown_s:.0f}s)"
        return ""

    def _read(self) -> tuple[dict[str, Any], str]:
        from gpu_provider.triggers.spot_capacity import SpotCapacityQuery, ec2_clients, read_spot_capacity

        policy = self.policy
        if self._clients is None:
            self._clients = ec2_clients(policy.aws_conn_id)
        regions = policy.regions
        if not regions:
            from gpu_provider.backends.aws.calls import aws_client

            regions = (str(aws_client("ec2", aws_conn_id=policy.aws_conn_id).meta.region_name),)
        query = SpotCapacityQuery(
            instance_types=tuple(self.watch["instance_types"]),
            regions=tuple(regions),
            target_capacity=int(self.watch.get("nodes") or 1),
            min_score=policy.min_score,
            max_price=1e9,  # every price is read, the saving decides
        )
        return read_spot_capacity(query, self._clients), regions[0]

    def on_demand_usd(self, instance_type: str, region: str | None) -> float:
        if self._on_demand_price is not None:
            return self._on_demand_price(instance_type, region)
        from gpu_provider.spend.prices import PriceBook

        return PriceBook.from_config().instance_price(instance_type, ON_DEMAND, region).usd_per_hour

    def remaining_s(self, status: Any) -> float | None:
        """Seconds of work left: ``expected_runtime`` minus what the run has run (``None``: unknown)."""
        expected = self.policy.expected_runtime_s
        if expected is None:
            return None
        started = getattr(status, "started_at", None)
        ran = float(self.watch.get("ran_before_s") or 0.0) + (max(0.0, time.time() - started) if started else 0.0)
        return max(0.0, expected - ran)

    def decide(self, reading: Mapping[str, Any], region: str, status: Any) -> tuple[dict[str, Any] | None, str]:
        """The move, from a reading: spot available, cheap enough, enough work left; else ``None`` and why not."""
        policy = self.policy
        if reading.get("satisfied_by") != "score":
            scores = reading.get("seen", {}).get("scores") or {}
            shown = ", ".join(f"{r} {s}" for r, s in scores.items()) or "none"
            return None, f"spot placement scores {shown} are under min_score={policy.min_score}; staying on on-demand"
        prices = list(reading.get("seen", {}).get("prices") or [])
        wanted = self.watch.get("instance_type")
        if wanted:
            prices = [p for p in prices if p["instance_type"] == wanted] or prices
        if not prices:
            return None, "no spot price for these instance types; staying on on-demand"
        cheapest = min(prices, key=lambda p: float(p["price"]))
        instance_type = str(wanted or cheapest["instance_type"])
        price_region = str(cheapest.get("region") or region)
        try:
            on_demand = self.on_demand_usd(instance_type, price_region)
        except Exception as err:
            return None, f"no on-demand price for {instance_type} ({err}); staying on on-demand"
        spot = float(cheapest["price"])
        if on_demand <= 0:
            return None, f"the on-demand price of {instance_type} is {on_demand}; staying on on-demand"
        saving = 1.0 - spot / on_demand
        if saving < policy.min_saving:
            return None, (
                f"spot {instance_type} ${spot:g}/h vs on-demand ${on_demand:g}/h saves {saving:.0%}, under "
                f"min_saving={policy.min_saving:.0%}; staying on on-demand"
            )
        remaining = self.remaining_s(status)
        if remaining is not None and remaining < policy.min_remaining_s:
            return None, (
                f"about {remaining:.0f}s of work remain, under min_remaining={policy.min_remaining_s:.0f}s; "
                "staying on on-demand"
            )
        nodes = int(self.watch.get("nodes") or 1)
        per_hour = (on_demand - spot) * nodes
        saving_usd = None if remaining is None else round(per_hour * remaining / 3600.0, 6)
        decision = {
            "score": reading.get("score"),
            "region": reading.get("region") or region,
            "instance_type": instance_type,
            "availability_zone": cheapest.get("availability_zone"),
            "spot_usd_per_hour": round(spot, 6),
            "on_demand_usd_per_hour": round(on_demand, 6),
            "saving_pct": round(100.0 * saving, 1),
            "saving_usd_per_hour": round(per_hour, 6),
            "remaining_s": None if remaining is None else round(remaining, 1),
            "saving_usd": saving_usd,
            "nodes": nodes,
            "checked_at": reading.get("checked_at"),
        }
        left = "the rest of the run" if remaining is None else f"the remaining ~{remaining:.0f}s"
        worth = f"${per_hour:.4f}/h" if saving_usd is None else f"~${saving_usd:.4f} over {left}"
        decision["summary"] = (
            f"spot placement score {decision['score']} in {decision['region']} (>= {policy.min_score}); spot "
            f"{instance_type} ${spot:g}/h vs on-demand ${on_demand:g}/h saves {saving:.0%} (>= "
            f"{policy.min_saving:.0%}), {worth}"
        )
        return decision, ""
