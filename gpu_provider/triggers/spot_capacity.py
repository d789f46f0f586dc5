"""Spot capacity: what a ``SpotCapacitySensor`` asks EC2, how it reads the answer, and its trigger.

* :class:`SpotCapacityQuery`: instance types, regions, target capacity and the thresholds, checked
  once (parse time) with errors that name the field;
* :func:`read_spot_capacity`: one reading: EC2 ``GetSpotPlacementScores`` (regional scores for the
  instance types and target capacity) and/or ``DescribeSpotPriceHistory`` (the price in effect now,
  Linux/UNIX, per instance type and availability zone, one call per region);
* :class:`SpotCapacityTrigger`: the same reading every ``poll_interval`` in the triggerer (the
  blocking boto3 calls in a thread), until it is satisfied or the deadline passes.

Clients come from the Airflow AWS connection through the amazon provider's ``AwsBaseHook``
(:func:`gpu_provider.backends.aws.calls.aws_client`); boto3 is imported only when a reading is taken.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: the events a :class:`SpotCapacityTrigger` fires (``status`` of the event payload)
SUCCESS, TIMEOUT, ERROR = "success", "timeout", "error"
EVENT_STATUSES = (SUCCESS, TIMEOUT, ERROR)

#: EC2's product description of Linux instances (what GPU jobs run on)
LINUX = "Linux/UNIX"
#: GetSpotPlacementScores accepts at most this many regions, and this target capacity
MAX_REGIONS = 10
MAX_TARGET_CAPACITY = 2_000_000_000
MAX_INSTANCE_TYPES = 100
#: pages of one call read at most (a price history of a few instance types fits in one)
MAX_PAGES = 20
#: EC2's error codes for throttled requests: a reading that is throttled counts as "not yet"
THROTTLING_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException"})

# AWS region names: partition prefix, direction, number (us-east-1, eu-central-2, us-gov-west-1, cn-north-1)
_REGION = re.compile(
    r"(us|us-gov|us-iso|us-isob|eu|eusc-de|ap|sa|ca|me|af|il|mx|cn)"
    r"-(north|south|east|west|central|northeast|northwest|southeast|southwest)-[1-9][0-9]?"
)
# EC2 instance type names: family, dot, size (g5.2xlarge, p4d.24xlarge, u-6tb1.metal, m7i.metal-24xl)
_INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*\.[a-z0-9]+(-[a-z0-9]+)?")


def _names(value: Any, field: str, what: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{field}={value!r} must be a list of {what}, e.g. {field}=[{value!r}]")
    if not value:
        raise ValueError(f"{field} must name at least one of the {what}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"{field}[{i}]={item!r} must be a string")
    duplicates = sorted({v for v in value if list(value).count(v) > 1})
    if duplicates:
        raise ValueError(f"{field} names {', '.join(duplicates)} more than once")
    return tuple(value)


def validate_instance_types(value: Any, field: str = "instance_types") -> tuple[str, ...]:
    """EC2 instance type names (``g5.2xlarge``); SageMaker's ``ml.`` types are refused with a hint."""
    types = _names(value, field, "EC2 instance types")
    if len(types) > MAX_INSTANCE_TYPES:
        raise ValueError(f"{field} names {len(types)} instance types; at most {MAX_INSTANCE_TYPES} are allowed")
    for i, name in enumerate(types):
        if name.startswith("ml."):
            raise ValueError(
                f"{field}[{i}]={name!r} is a SageMaker instance type: EC2 spot capacity is asked with the EC2 "
                f"name, {name.removeprefix('ml.')!r}"
            )
        if not _INSTANCE_TYPE.fullmatch(name):
            raise ValueError(
                f"{field}[{i}]={name!r} is not an EC2 instance type name: expected family.size in lower case, "
                "like 'g5.2xlarge' or 'p4d.24xlarge'"
            )
    return types


def validate_regions(value: Any, field: str = "regions") -> tuple[str, ...]:
    """AWS region names (``us-east-1``); at most :data:`MAX_REGIONS` (GetSpotPlacementScores' limit)."""
    regions = _names(value, field, "AWS regions")
    if len(regions) > MAX_REGIONS:
        raise ValueError(f"{field} names {len(regions)} regions; EC2 scores at most {MAX_REGIONS} in one request")
    for i, name in enumerate(regions):
        if not _REGION.fullmatch(name):
            raise ValueError(f"{field}[{i}]={name!r} is not an AWS region name, like 'us-east-1' or 'eu-west-2'")
    return regions


@dataclass(frozen=True)
class SpotCapacityQuery:
    """What a spot capacity check asks, validated on construction (errors name the field).

    :param instance_types: EC2 instance types the job can run on (``g5.2xlarge``).
    :param regions: AWS regions where it may run.
    :param target_capacity: instances needed (1 to 2,000,000,000).
    :param min_score: satisfied when the spot placement score of some region is at least this (1-10).
    :param max_price: satisfied when the spot price (USD per instance-hour) of one of the instance
        types in some zone of the regions is at most this. At least one of ``min_score``/``max_price``.
    """

    instance_types: tuple[str, ...]
    regions: tuple[str, ...]
    target_capacity: int = 1
    min_score: int | None = None
    max_price: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "instance_types", validate_instance_types(self.instance_types))
        object.__setattr__(self, "regions", validate_regions(self.regions))
        capacity = self.target_capacity
        if not isinstance(capacity, int) or isinstance(capacity, bool):
            raise TypeError(f"target_capacity={capacity!r} must be an integer (instances)")
        if not 1 <= capacity <= MAX_TARGET_CAPACITY:
            raise ValueError(f"target_capacity={capacity!r} must be from 1 to {MAX_TARGET_CAPACITY}")
        if self.min_score is None and self.max_price is None:
            raise ValueError("give min_score (1-10), max_price (USD per hour), or both: the sensor waits for either")
        score = self.min_score
        if score is not None:
            if not isinstance(score, int) or isinstance(score, bool):
                raise TypeError(f"min_score={score!r} must be an integer from 1 to 10")
            if not 1 <= score <= 10:
                raise ValueError(f"min_score={score!r} must be from 1 to 10 (EC2's spot placement scores)")
        price = self.max_price
        if price is not None:
            if not isinstance(price, (int, float)) or isinstance(price, bool):
                raise TypeError(f"max_price={price!r} must be a number (USD per instance-hour)")
            if not math.isfinite(price) or price <= 0:
                raise ValueError(f"max_price={price!r} must be a finite number of USD per hour, more than 0")
            object.__setattr__(self, "max_price", float(price))

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_types": list(self.instance_types),
            "regions": list(self.regions),
            "target_capacity": self.target_capacity,
            "min_score": self.min_score,
            "max_price": self.max_price,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpotCapacityQuery:
        return cls(
            instance_types=tuple(data["instance_types"]),
            regions=tuple(data["regions"]),
            target_capacity=data.get("target_capacity", 1),
            min_score=data.get("min_score"),
            max_price=data.get("max_price"),
        )

    def describe(self) -> str:
        wants = []
        if self.min_score is not None:
            wants.append(f"a spot placement score >= {self.min_score}")
        if self.max_price is not None:
            wants.append(f"a spot price <= ${self.max_price:g}/h")
        return (
            f"{' or '.join(wants)} for {self.target_capacity} x {'|'.join(self.instance_types)} "
            f"in {', '.join(self.regions)}"
        )


ClientFactory = Callable[[str], Any]
"""``region -> EC2 client``."""


def ec2_clients(aws_conn_id: str | None) -> ClientFactory:
    """EC2 clients per region from the Airflow connection, each built once."""
    from gpu_provider.backends.aws.calls import aws_client

    built: dict[str, Any] = {}

    def client(region: str) -> Any:
        if region not in built:
            built[region] = aws_client("ec2", aws_conn_id=aws_conn_id, region_name=region)
        return built[region]

    return client


def is_throttling(err: BaseException) -> bool:
    """Whether a botocore error says EC2 throttled the request."""
    response = getattr(err, "response", None)
    return isinstance(response, dict) and str(response.get("Error", {}).get("Code", "")) in THROTTLING_CODES


def read_spot_capacity(query: SpotCapacityQuery, client: ClientFactory) -> dict[str, Any]:
    """One reading: scores and/or prices, and whether (and by what) the query is satisfied.

    Returns ``{"satisfied_by": "score" | "price" | None, "region", "availability_zone",
    "instance_type", "score", "price", "seen": {"scores": {region: score}, "prices": [...]},
    "checked_at"}``; when both thresholds are met, the score is what satisfied it. Blocking (boto3).
    """
    seen: dict[str, Any] = {}
    reading: dict[str, Any] = {
        "satisfied_by": None,
        "region": None,
        "availability_zone": None,
        "instance_type": None,
        "score": None,
        "price": None,
    }
    if query.min_score is not None:
        scores = _placement_scores(query, client(query.regions[0]))
        seen["scores"] = scores
        if scores:
            region = max(scores, key=lambda r: scores[r])  # the first of equal scores, in the order asked
            if scores[region] >= query.min_score:
                reading.update(satisfied_by="score", region=region, score=scores[region])
    if query.max_price is not None:
        prices = [p for region in query.regions for p in _current_prices(query, region, client(region))]
        seen["prices"] = prices
        cheapest = min(prices, key=lambda p: p["price"], default=None)
        if reading["satisfied_by"] is None and cheapest is not None and cheapest["price"] <= query.max_price:
            reading.update(
                satisfied_by="price",
                region=cheapest["region"],
                availability_zone=cheapest["availability_zone"],
                instance_type=cheapest["instance_type"],
                price=cheapest["price"],
            )
    reading["seen"] = seen
    reading["checked_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return reading


def _placement_scores(query: SpotCapacityQuery, ec2: Any) -> dict[str, int]:
    """Best score per region, in the order of ``query.regions`` (regions EC2 did not score left out)."""
    request: dict[str, Any] = {
        "InstanceTypes": list(query.instance_types),
        "TargetCapacity": query.target_capacity,
        "TargetCapacityUnitType": "units",
        "SingleAvailabilityZone": False,
        "RegionNames": list(query.regions),
    }
    best: dict[str, int] = {}
    for _ in range(MAX_PAGES):
        answer = ec2.get_spot_placement_scores(**request)
        for item in answer.get("SpotPlacementScores", []):
            region, score = item.get("Region"), item.get("Score")
            if isinstance(region, str) and isinstance(score, int):
                best[region] = max(score, best.get(region, 0))
        token = answer.get("NextToken")
        if not token:
            break
        request["NextToken"] = token
    return {r: best[r] for r in query.regions if r in best}


def _current_prices(query: SpotCapacityQuery, region: str, ec2: Any) -> list[dict[str, Any]]:
    """The spot price in effect now per instance type and zone of one region (Linux/UNIX)."""
    # StartTime = now: EC2 returns the last change before it per type and zone, the price in effect now
    request: dict[str, Any] = {
        "InstanceTypes": list(query.instance_types),
        "ProductDescriptions": [LINUX],
        "StartTime": datetime.now(timezone.utc),
    }
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(MAX_PAGES):
        answer = ec2.describe_spot_price_history(**request)
        for item in answer.get("SpotPriceHistory", []):
            try:
                price = float(item["SpotPrice"])
                key = (str(item["InstanceType"]), str(item["AvailabilityZone"]))
                stamp = item["Timestamp"]
            except (KeyError, TypeError, ValueError):
                continue
            if key not in latest or stamp > latest[key]["_stamp"]:
                latest[key] = {
                    "region": region,
                    "availability_zone": key[1],
                    "instance_type": key[0],
                    "price": price,
                    "timestamp": stamp.isoformat() if hasattr(stamp, "isoformat") else str(stamp),
                    "_stamp": stamp,
                }
        token = answer.get("NextToken")
        if not token:
            break
        request["NextToken"] = token
    prices = [{k: v for k, v in p.items() if k != "_stamp"} for p in latest.values()]
    return sorted(prices, key=lambda p: (p["price"], p["availability_zone"], p["instance_type"]))


def summarise(query: SpotCapacityQuery, reading: dict[str, Any]) -> str:
    """One line for the log: what was seen against what is wanted."""
    parts = []
    scores = reading.get("seen", {}).get("scores")
    if scores is not None:
        shown = ", ".join(f"{r} {s}" for r, s in scores.items()) or "none"
        parts.append(f"spot placement scores: {shown} (want >= {query.min_score})")
    prices = reading.get("seen", {}).get("prices")
    if prices is not None:
        if prices:
            p = min(prices, key=lambda q: q["price"])
            parts.append(
                f"cheapest spot price: {p['instance_type']} in {p['availability_zone']} ${p['price']:g}/h "
                f"(want <= ${query.max_price:g}/h)"
            )
        else:
            parts.append("no spot price for these instance types in these regions")
    return "; ".join(parts)


class SpotCapacityTrigger(BaseTrigger):
    """Reads spot capacity every ``poll_interval`` seconds until the query is satisfied or ``end_time``.

    Fires one event ``{"status": "success" | "timeout" | "error", "result": reading | None,
    "message": str}``: ``success`` with the satisfying reading, ``timeout`` with the last reading
    (what was seen), ``error`` when EC2 refused a call (e.g. permissions). A throttled reading counts
    as "not yet".

    :param query: :meth:`SpotCapacityQuery.to_dict`.
    :param aws_conn_id: the Airflow AWS connection.
    :param poll_interval: seconds between readings.
    :param end_time: Unix time when the wait ends with ``timeout``.
    """

    def __init__(
        self,
        *,
        query: dict[str, Any],
        aws_conn_id: str | None,
        poll_interval: float,
        end_time: float,
        **_newer: Any,
    ) -> None:
        # ``_newer``: arguments a newer provider version added; a triggerer one version behind still runs it
        super().__init__()  # type: ignore[no-untyped-call]
        self.query = dict(query)
        self.aws_conn_id = aws_conn_id
        self.poll_interval = float(poll_interval)
        self.end_time = float(end_time)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "query": self.query,
                "aws_conn_id": self.aws_conn_id,
                "poll_interval": self.poll_interval,
                "end_time": self.end_time,
            },
        )

    @staticmethod
    def _event(status: str, result: dict[str, Any] | None, message: str) -> TriggerEvent:
        return TriggerEvent({"status": status, "result": result, "message": message})  # type: ignore[no-untyped-call]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        query = SpotCapacityQuery.from_dict(self.query)
        client = ec2_clients(self.aws_conn_id)
        self.log.info("Waiting for %s; checking every %gs.", query.describe(), self.poll_interval)
        last: dict[str, Any] | None = None
        while True:
            try:
                reading = await asyncio.to_thread(read_spot_capacity, query, client)
            except Exception as err:
                if not is_throttling(err):
                    yield self._event(ERROR, last, f"Could not read spot capacity from EC2: {err}")
                    return
                self.log.warning("EC2 throttled the spot capacity reading; trying again next time.")
            else:
                last = reading
                self.log.info("%s", summarise(query, reading))
                if reading["satisfied_by"] is not None:
                    yield self._event(SUCCESS, reading, f"Spot capacity found: {summarise(query, reading)}")
                    return
            remaining = self.end_time - time.time()
            if remaining <= 0:
                seen = summarise(query, last) if last is not None else "no reading succeeded"
                yield self._event(TIMEOUT, last, f"No spot capacity: {query.describe()} not seen in time; {seen}.")
                return
            await asyncio.sleep(min(self.poll_interval, remaining))
