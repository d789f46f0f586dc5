"""EC2 spot capacity signals for tests: spot placement scores and spot price history, as the test chooses.

moto 5.2.5 has no ``GetSpotPlacementScores`` (its EC2 answers "not implemented"), and its
``DescribeSpotPriceHistory`` answers one fixed price (``0.00001``, product ``Linux/UNIX (Amazon VPC)``,
timestamp 2006) for every instance type it knows, ignoring ``ProductDescriptions``, ``StartTime`` and
``EndTime``. :class:`Ec2SpotEmulator` serves both calls from tables a test fills:

* **GetSpotPlacementScores** (regional scores; ``SingleAvailabilityZone=false``): the score of each
  requested region is what :meth:`~Ec2SpotEmulator.set_scores` gave it, 1 (the lowest) for a region
  it did not name. Without ``RegionNames``, every region with a score. Highest score first, paged
  by ``MaxResults`` (10-1000) / ``NextToken``. As AWS: ``TargetCapacity`` 1-2,000,000,000,
  ``InstanceTypes`` or ``InstanceRequirementsWithMetadata`` (exactly one), at most 10 regions.
  Per-zone scores (``SingleAvailabilityZone=true``) and ``InstanceRequirementsWithMetadata`` are not
  emulated: they are refused with ``InvalidParameterValue`` saying so.
* **DescribeSpotPriceHistory** (in the region of the request): the entries
  :meth:`~Ec2SpotEmulator.set_price` recorded for that region, filtered by ``InstanceTypes``,
  ``ProductDescriptions``, ``AvailabilityZone`` and the filters ``availability-zone``,
  ``instance-type``, ``product-description``; with ``StartTime``/``EndTime``, as AWS: the entries in
  the window plus, per instance type, zone and product, the last one before ``StartTime`` (the price
  in effect then). Newest first, paged by ``MaxResults``/``NextToken``.

Both are added to moto's EC2 responses (patches undone by :meth:`~Ec2SpotEmulator.stop`), so **any**
moto server of this process answers them: the emulator's own (``Ec2SpotEmulator()``), or one that
already runs, e.g. the Batch emulator's (``Ec2SpotEmulator(endpoint_url=batch.endpoint_url)``): one
endpoint then serves Batch and EC2. Every request of the two actions is kept in the request log
(:meth:`~Ec2SpotEmulator.requests`, the form fields exactly as sent), and :meth:`~Ec2SpotEmulator.throttle`
answers every n-th request ``RequestLimitExceeded``, as EC2 throttles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response

from gpu_provider.testing.emulators.aws_common import OnePerProcess, aws_client
from gpu_provider.testing.emulators.core import Faults, Patches, RecordingMotoServer, RequestLog, aws_client_of

PLACEMENT_SCORES = "GetSpotPlacementScores"
PRICE_HISTORY = "DescribeSpotPriceHistory"
#: the score of a region no test named (the lowest AWS gives)
DEFAULT_SCORE = 1
#: the product of an entry that does not name one (what the provider asks for)
LINUX = "Linux/UNIX"


@dataclass(frozen=True)
class PriceEntry:
    """One spot price change: in ``availability_zone`` of ``region``, from ``timestamp`` on."""

    region: str
    availability_zone: str
    instance_type: str
    price: float
    product: str
    timestamp: datetime


def _error_style(action: str, kind: str) -> tuple[int, str, str]:  # the server's own middleware tracks nothing
    return 500, "InternalError", "Internal error"


def _param_list(query: Mapping[str, list[str]], prefix: str) -> list[str]:
    """``Prefix.1``, ``Prefix.2``, ... of a query-protocol request, in order."""
    items = []
    for key, values in query.items():
        head, _, index = key.rpartition(".")
        if head == prefix and index.isdigit():
            items.append((int(index), values[0]))
    return [value for _, value in sorted(items)]


def _filters(query: Mapping[str, list[str]]) -> dict[str, list[str]]:
    names = {k.split(".")[1]: v[0] for k, v in query.items() if k.startswith("Filter.") and k.endswith(".Name")}
    return {name: _param_list(query, f"Filter.{n}.Value") for n, name in names.items()}


def _time(value: str, field: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise EC2ClientError("InvalidParameterValue", f"{field} {value!r} is not a timestamp") from err
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _page(items: list[Any], query: Mapping[str, list[str]], low: int, high: int) -> tuple[list[Any], str | None]:
    raw_max = query.get("MaxResults", [None])[0]
    size = int(raw_max) if raw_max else high
    if not low <= size <= high:
        raise EC2ClientError("InvalidParameterValue", f"MaxResults must be between {low} and {high}; got {size}")
    token = query.get("NextToken", ["0"])[0]
    if not token.isdigit():
        raise EC2ClientError("InvalidNextToken", f"The token {token!r} is invalid.")
    start = int(token)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)


class Ec2SpotEmulator(OnePerProcess):
    """Spot placement scores and spot prices on moto's EC2 (see the module doc).

    :param port: TCP port of the emulator's own server on 127.0.0.1 (0: a free one).
    :param endpoint_url: serve through a moto server this process already runs (e.g. the Batch
        emulator's) instead of starting one.
    :param region: the region of :meth:`client`.
    """

    _one_of: ClassVar[str] = "ec2"
    _stop_at_exit: ClassVar[bool] = False

    def __init__(self, *, port: int = 0, endpoint_url: str | None = None, region: str = "us-east-1") -> None:
        self.port = port
        self.endpoint_url = endpoint_url or ""
        self.region = region
        self._own_server = endpoint_url is None
        self._server: RecordingMotoServer | None = None
        self._patches = Patches()
        self._added: list[str] = []
        self._lock = threading.Lock()
        self._scores: dict[str, int] = {}
        self._prices: list[PriceEntry] = []
        self._log = RequestLog()
        self._faults = Faults()

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        """Patch moto's EC2 and, unless ``endpoint_url`` was given, start a server."""
        self._install()
        if self._own_server:
            self._start_server(
                self.port,
                app=lambda app: app,
                action_of=lambda environ: None,  # recorded by the patched actions themselves
                error_style=_error_style,
                faults=Faults(),
                log=RequestLog(),
            )

    def _stop(self) -> None:
        """Stop the emulator's own server (if any) and undo the patches."""
        self._stop_server()
        self._patches.undo()
        for name in self._added:
            delattr(EC2Response, name)
        self._added.clear()

    def client(self, **kwargs: Any) -> Any:
        """A boto3 EC2 client pointed at the emulator, with dummy credentials."""
        endpoint_url = kwargs.pop("endpoint_url", self.endpoint_url)
        return aws_client("ec2", endpoint_url=endpoint_url, region=self.region, **kwargs)

    # ------------------------------------------------------------------ what the test chooses

    def set_scores(self, scores: Mapping[str, int]) -> None:
        """Spot placement scores (1-10) per region, replacing earlier ones; unnamed regions score 1."""
        for region, score in scores.items():
            if not isinstance(score, int) or not 1 <= score <= 10:
                raise ValueError(f"score of {region}={score!r} must be an integer from 1 to 10")
        with self._lock:
            self._scores = dict(scores)

    def set_price(
        self,
        region: str,
        availability_zone: str,
        instance_type: str,
        price: float,
        *,
        product: str = LINUX,
        at: datetime | None = None,
    ) -> None:
        """Record a spot price change (USD per hour) from ``at`` (default: now) on."""
        when = at or datetime.now(timezone.utc)
        entry = PriceEntry(region, availability_zone, instance_type, float(price), product, when)
        with self._lock:
            self._prices.append(entry)

    def reset(self) -> None:
        """Forget scores, prices, requests and faults."""
        with self._lock:
            self._scores = {}
            self._prices = []
        self._log.reset()
        self._faults.reset()

    def throttle(self, action: str, every: int) -> None:
        """Answer every ``every``-th request of ``action`` (``"*"``: of both) ``RequestLimitExceeded``; 0: off."""
        self._faults.throttle(action, every)

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """Requests received, oldest first: ``{"action", "body", "region", "throttled", "status", ...}``;
        ``body`` holds the form fields as sent (``InstanceType.1``, ``TargetCapacity``, ...)."""
        return self._log.requests(action, since=since)

    # ------------------------------------------------------------------ the patched actions

    def _install(self) -> None:
        emulator = self

        def get_spot_placement_scores(response: EC2Response) -> ActionResult:
            return emulator._serve(response, PLACEMENT_SCORES, emulator._placement_scores)

        def describe_spot_price_history(original: Callable[..., Any]) -> Callable[..., Any]:
            return lambda response: emulator._serve(response, PRICE_HISTORY, emulator._price_history)

        # moto dispatches an action to the EC2Response method of its snake_case name, if there is one
        if hasattr(EC2Response, "get_spot_placement_scores"):  # a newer moto: ours wins, and is undone
            self._patches.wrap(EC2Response, "get_spot_placement_scores", lambda original: get_spot_placement_scores)
        else:
            EC2Response.get_spot_placement_scores = get_spot_placement_scores  # type: ignore[attr-defined]
            self._added.append("get_spot_placement_scores")
        self._patches.wrap(EC2Response, "describe_spot_price_history", describe_spot_price_history)

    def _serve(
        self, response: EC2Response, action: str, answer: Callable[[Mapping[str, list[str]], str], dict[str, Any]]
    ) -> ActionResult:
        query: dict[str, list[str]] = dict(response.querystring)
        body = {k: v[0] if len(v) == 1 else list(v) for k, v in query.items()}
        throttled, _ = self._faults.decide(action)
        client = aws_client_of(response.headers.get("Authorization"))
        entry = self._log.record(action, body, throttled=throttled, lost=None, client=client)
        entry["region"] = response.region
        if throttled:
            entry["status"] = 400
            raise EC2ClientError("RequestLimitExceeded", "Request limit exceeded.")
        try:
            result = answer(query, response.region)
        except EC2ClientError:
            entry["status"] = 400
            raise
        entry["status"] = 200
        return ActionResult(result)

    def _placement_scores(self, query: Mapping[str, list[str]], region: str) -> dict[str, Any]:
        raw_capacity = query.get("TargetCapacity", [""])[0]
        if not raw_capacity.isdigit() or not 1 <= int(raw_capacity) <= 2_000_000_000:
            raise EC2ClientError(
                "InvalidParameterValue", f"TargetCapacity must be from 1 to 2000000000; got {raw_capacity!r}"
            )
        types = _param_list(query, "InstanceType")
        with_requirements = any(k.startswith("InstanceRequirementsWithMetadata.") for k in query)
        if bool(types) == with_requirements:
            raise EC2ClientError(
                "InvalidParameterCombination", "Specify either InstanceTypes or InstanceRequirementsWithMetadata."
            )
        if with_requirements:
            raise EC2ClientError("InvalidParameterValue", "emulator: InstanceRequirementsWithMetadata is not emulated")
        if query.get("SingleAvailabilityZone", ["false"])[0].lower() == "true":
            raise EC2ClientError("InvalidParameterValue", "emulator: SingleAvailabilityZone=true is not emulated")
        regions = _param_list(query, "RegionName")
        if len(regions) > 10:
            raise EC2ClientError("InvalidParameterValue", f"RegionNames accepts at most 10 regions; got {len(regions)}")
        with self._lock:
            scores = dict(self._scores)
        if not regions:
            regions = sorted(scores)
        ranked = sorted(
            ({"Region": r, "Score": scores.get(r, DEFAULT_SCORE)} for r in dict.fromkeys(regions)),
            key=lambda s: -int(s["Score"]),  # type: ignore[call-overload]
        )
        page, token = _page(ranked, query, 10, 1000)
        return {"SpotPlacementScores": page, **({"NextToken": token} if token else {})}

    def _price_history(self, query: Mapping[str, list[str]], region: str) -> dict[str, Any]:
        types = set(_param_list(query, "InstanceType"))
        products = set(_param_list(query, "ProductDescription"))
        zone = query.get("AvailabilityZone", [None])[0]
        filters = _filters(query)
        unknown = set(filters) - {"availability-zone", "instance-type", "product-description"}
        if unknown:
            raise EC2ClientError("InvalidParameterValue", f"emulator: filters {sorted(unknown)} are not emulated")
        start = _time(query["StartTime"][0], "StartTime") if "StartTime" in query else None
        end = _time(query["EndTime"][0], "EndTime") if "EndTime" in query else None
        with self._lock:
            entries = [e for e in self._prices if e.region == region]
        entries = [
            e
            for e in entries
            if (not types or e.instance_type in types)
            and (not products or e.product in products)
            and (zone is None or e.availability_zone == zone)
            and e.availability_zone in filters.get("availability-zone", [e.availability_zone])
            and e.instance_type in filters.get("instance-type", [e.instance_type])
            and e.product in filters.get("product-description", [e.product])
            and (end is None or e.timestamp <= end)
        ]
        if start is not None:
            in_effect: dict[tuple[str, str, str], PriceEntry] = {}
            for e in entries:  # the last change before the window is the price in effect at its start
                key = (e.instance_type, e.availability_zone, e.product)
                if e.timestamp < start and (key not in in_effect or e.timestamp > in_effect[key].timestamp):
                    in_effect[key] = e
            entries = [e for e in entries if e.timestamp >= start] + list(in_effect.values())
        entries.sort(key=lambda e: e.timestamp, reverse=True)
        page, token = _page(entries, query, 1, 1000)
        history = [
            {
                "AvailabilityZone": e.availability_zone,
                "InstanceType": e.instance_type,
                "ProductDescription": e.product,
                "SpotPrice": f"{e.price:.6f}",
                "Timestamp": e.timestamp,
            }
            for e in page
        ]
        return {"SpotPriceHistory": history, **({"NextToken": token} if token else {})}
