"""Hourly prices of the instances GPU jobs run on, and the price one attempt is charged at.

Where a price comes from, first found wins:

1. ``[gpu_provider] prices``: the user's own figures, JSON ``{"g5.xlarge": 0.9, "eu-west-1/ml.g5.xlarge": 1.6,
   "spot/g5.xlarge": 0.4}`` (USD per instance-hour; a ``region/`` key beats a plain one, ``spot/`` keys
   price spot capacity).
2. Live AWS prices when ``[gpu_provider] live_prices`` is on: on-demand from the Price List API
   (``pricing:GetProducts``), spot from EC2 ``DescribeSpotPriceHistory`` (the highest current price
   over the region's zones); read through an Airflow AWS connection, cached for
   :data:`LIVE_CACHE_TTL_S` in a file under ``$AIRFLOW_HOME`` so each task does not ask again.
3. The table shipped with the provider (``prices.json``: its source and date are in the file),
   for us-east-1, us-west-2 and eu-west-1; spot as on-demand x ``[gpu_provider] spot_price_ratio``
   (default :data:`DEFAULT_SPOT_PRICE_RATIO`).

The local backend costs ``[gpu_provider] local_gpu_hour_usd`` per GPU-hour (default 0).

An attempt's cost (see :func:`attempt_cost`): its GPU-hours (GPUs held x hours running, all nodes,
as the backend measured them) x the instance's hourly price / the instance's accelerators. Where
the service reports billable seconds (SageMaker), billable hours x instance price x nodes instead.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources as package_files
from pathlib import Path
from typing import Any

from gpu_provider import names
from gpu_provider.job import GpuResources

log = logging.getLogger(__name__)

#: the regions the shipped table covers
SHIPPED_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")
#: spot price as a share of on-demand when no live spot price is known
DEFAULT_SPOT_PRICE_RATIO = 0.4
#: the instance a job is priced as when nothing says which (no reported type, no instance_types, no gpu_type)
DEFAULT_PRICE_INSTANCE_TYPE = "g5.xlarge"
#: the region a job is priced in when its backend does not say (e.g. a handle of an older version)
DEFAULT_PRICE_REGION = "us-east-1"
#: how long a live price is reused
LIVE_CACHE_TTL_S = 24 * 3600.0

#: price catalogs: how a backend's instances are sold (see ``Backend.price_catalog``)
EC2 = "ec2"
SAGEMAKER = "sagemaker"
LOCAL = "local"
CATALOGS = (EC2, SAGEMAKER, LOCAL)


class PriceNotFoundError(ValueError):
    """No price is known for an instance type in a region (name it in ``[gpu_provider] prices``)."""


@dataclass(frozen=True)
class Price:
    """What one instance-hour costs, and where that figure came from."""

    usd_per_hour: float
    instance_type: str
    accelerators: int
    capacity: str
    region: str | None
    source: str

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / max(1, self.accelerators)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type,
            "region": self.region,
            "capacity": self.capacity,
            "usd_per_hour": round(self.usd_per_hour, 6),
            "usd_per_gpu_hour": round(self.usd_per_gpu_hour, 6),
            "source": self.source,
        }


@lru_cache(maxsize=1)
def shipped_table() -> dict[str, Any]:
    """The price table shipped in the package (read once per process)."""
    text = package_files.files("gpu_provider.spend").joinpath("prices.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def _config(key: str) -> str:
    from gpu_provider.backends.base import provider_config

    return provider_config(key)


def _number(option: str, text: str, default: float, *, low: float, high: float) -> float:
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not low <= value <= high:
        raise ValueError(f"[gpu_provider] {option}={text!r} must be a number from {low:g} to {high:g}")
    return value


def parse_overrides(text: str | Mapping[str, Any]) -> dict[str, float]:
    """``[gpu_provider] prices``: ``{"<[region/][spot/]instance type>": USD per hour}``."""
    if not text:
        return {}
    try:
        data = json.loads(text) if isinstance(text, str) else dict(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f'[gpu_provider] prices must be JSON like {{"g5.xlarge": 0.9, "eu-west-1/g5.xlarge": 1.1}}: {err}'
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"[gpu_provider] prices must be a JSON object of instance type to USD per hour, not {data!r}")
    out = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 10_000:
            raise ValueError(f"[gpu_provider] prices[{key!r}]={value!r} must be USD per instance-hour, 0 to 10000")
        out[str(key).strip()] = float(value)
    return out


class PriceBook:
    """Prices from overrides, live AWS answers (optional) and the shipped table.

    :param live: reads live prices: ``live(kind, instance_type, region)`` with ``kind`` ``"on_demand"``
        or ``"spot"``, returning USD per hour or ``None``; ``None`` here: no live prices
    """

    def __init__(
        self,
        *,
        overrides: Mapping[str, float] | None = None,
        spot_price_ratio: float = DEFAULT_SPOT_PRICE_RATIO,
        local_gpu_hour_usd: float = 0.0,
        default_instance_type: str = DEFAULT_PRICE_INSTANCE_TYPE,
        live: Callable[[str, str, str], float | None] | None = None,
    ) -> None:
        self.table = shipped_table()
        self.overrides = dict(overrides or {})
        self.spot_price_ratio = spot_price_ratio
        self.local_gpu_hour_usd = local_gpu_hour_usd
        self.default_instance_type = default_instance_type
        self.live = live

    @classmethod
    def from_config(cls) -> PriceBook:
        """The price book ``[gpu_provider]`` describes (``prices``, ``spot_price_ratio``, ``local_gpu_hour_usd``,
        ``price_instance_type``, ``live_prices`` with ``price_aws_conn_id``)."""
        from gpu_provider.job import to_bool

        live = None
        if to_bool("[gpu_provider] live_prices", _config("live_prices") or "false"):
            live = LivePrices(_config("price_aws_conn_id") or "aws_default")
        return cls(
            overrides=parse_overrides(_config("prices")),
            spot_price_ratio=_number(
                "spot_price_ratio", _config("spot_price_ratio"), DEFAULT_SPOT_PRICE_RATIO, low=0, high=1
            ),
            local_gpu_hour_usd=_number("local_gpu_hour_usd", _config("local_gpu_hour_usd"), 0.0, low=0, high=10_000),
            default_instance_type=_config("price_instance_type") or DEFAULT_PRICE_INSTANCE_TYPE,
            live=live,
        )

    # --- what is known ----------------------------------------------------------------------------
    def instance_types(self, catalog: str = EC2) -> list[str]:
        """Every instance type of a catalog the shipped table knows."""
        known = self.table["instances"]
        return sorted(t for t in known if t.startswith("ml.") == (catalog == SAGEMAKER))

    def accelerators(self, instance_type: str) -> int:
        info = self.table["instances"].get(instance_type)
        if info is None:
            bare = instance_type.removeprefix("ml.")
            info = self.table["instances"].get(bare)
        return int(info["accelerators"]) if info else 1

    # --- prices ---------------------------------------------------------------------------------
    def instance_price(self, instance_type: str, capacity: str, region: str | None, catalog: str = EC2) -> Price:
        """The hourly price of one instance of ``instance_type`` on ``capacity`` in ``region``."""
        if catalog == LOCAL:
            return Price(self.local_gpu_hour_usd, "local", 1, capacity, None, "[gpu_provider] local_gpu_hour_usd")
        if catalog == SAGEMAKER and not instance_type.startswith("ml."):
            instance_type = "ml." + instance_type
        region = region or DEFAULT_PRICE_REGION
        accel = self.accelerators(instance_type)
        spot = capacity == names.SPOT
        for key in (f"{region}/spot/{instance_type}", f"spot/{instance_type}") if spot else ():
            if key in self.overrides:
                return Price(self.overrides[key], instance_type, accel, capacity, region, "[gpu_provider] prices")
        if spot and self.live is not None and catalog == EC2:
            usd = self.live("spot", instance_type, region)
            if usd is not None:
                return Price(usd, instance_type, accel, capacity, region, "EC2 DescribeSpotPriceHistory")
        on_demand = self._on_demand(instance_type, region)
        if not spot:
            return on_demand
        # SageMaker bills managed spot at a discount it does not publish per type: the ratio applies
        return Price(
            on_demand.usd_per_hour * self.spot_price_ratio,
            instance_type,
            accel,
            capacity,
            region,
            f"{on_demand.source} x spot_price_ratio {self.spot_price_ratio:g}",
        )

    def _on_demand(self, instance_type: str, region: str) -> Price:
        accel = self.accelerators(instance_type)
        for key in (f"{region}/{instance_type}", instance_type):
            if key in self.overrides:
                return Price(
                    self.overrides[key], instance_type, accel, names.ON_DEMAND, region, "[gpu_provider] prices"
                )
        if self.live is not None:
            usd = self.live("on_demand", instance_type, region)
            if usd is not None:
                return Price(usd, instance_type, accel, names.ON_DEMAND, region, "AWS Price List API")
        usd = (self.table["on_demand"].get(region) or {}).get(instance_type)
        if usd is None:
            raise PriceNotFoundError(
                f"no price for {instance_type} in {region}: the shipped table covers {', '.join(SHIPPED_REGIONS)} "
                f"and {len(self.table['instances'])} GPU instance types; add it to [gpu_provider] prices, e.g. "
                f'{{"{region}/{instance_type}": <USD per hour>}}, or turn on [gpu_provider] live_prices'
            )
        source = f"shipped table ({self.table['retrieved']})"
        return Price(float(usd), instance_type, accel, names.ON_DEMAND, region, source)

    def instance_for(self, resources: GpuResources, capacity: str, region: str | None, catalog: str = EC2) -> str:
        """The instance type a job is priced as when the service has not said which it ran on.

        The dearest per GPU of ``resources.instance_types``; else the cheapest instance of
        ``resources.gpu_type`` with enough accelerators per node; else ``[gpu_provider]
        price_instance_type`` (default :data:`DEFAULT_PRICE_INSTANCE_TYPE`).
        """
        if catalog == LOCAL:
            return "local"
        if resources.instance_types:
            prices = [self.instance_price(t, capacity, region, catalog) for t in resources.instance_types]
            return max(prices, key=lambda p: p.usd_per_gpu_hour).instance_type
        if resources.gpu_type:
            need = max(1, math.ceil(resources.gpus))
            fits = [
                t
                for t in self.instance_types(catalog)
                if self.table["instances"][t]["accelerator"] == resources.gpu_type
                and int(self.table["instances"][t]["accelerators"]) >= need
            ]
            if fits:  # ranked by the shipped us-east-1 figures: the choice is the same in every region
                reference = self.table["on_demand"][DEFAULT_PRICE_REGION]
                return min(fits, key=lambda t: (float(reference[t]), t))
        default = self.default_instance_type
        return ("ml." + default) if catalog == SAGEMAKER and not default.startswith("ml.") else default

    def job_price(
        self,
        resources: GpuResources,
        capacity: str,
        region: str | None,
        catalog: str = EC2,
        *,
        instance_type: str | None = None,
    ) -> Price:
        """The price one attempt is charged at: of ``instance_type`` where the service reported it."""
        chosen = instance_type or self.instance_for(resources, capacity, region, catalog)
        return self.instance_price(chosen, capacity, region, catalog)


def attempt_cost(price: Price, *, gpu_seconds: float, nodes: int, billable_seconds: float | None = None) -> float:
    """USD of one attempt: GPU-hours x price per GPU-hour; or, where the service reports billable
    seconds (per instance, as SageMaker does), billable hours x instance price x nodes."""
    if billable_seconds is not None:
        return billable_seconds / 3600.0 * price.usd_per_hour * max(1, nodes)
    return gpu_seconds / 3600.0 * price.usd_per_gpu_hour


# --- live prices ---------------------------------------------------------------------------------


class LivePrices:
    """Live AWS prices through an Airflow AWS connection, cached in a file for a day.

    Any failure (no credentials, no permission, no network) is logged once and answered ``None``:
    the caller falls back to the shipped table.
    """

    _lock = threading.Lock()

    def __init__(self, aws_conn_id: str, cache_file: Path | None = None) -> None:
        self.aws_conn_id = aws_conn_id
        self.cache_file = cache_file or _default_cache_file()
        self._failed: set[str] = set()

    def __call__(self, kind: str, instance_type: str, region: str) -> float | None:
        key = f"{kind}|{region}|{instance_type}"
        cached = self._read_cache().get(key)
        if cached and time.time() - float(cached[1]) < LIVE_CACHE_TTL_S:
            return float(cached[0])
        try:
            usd = self._spot(instance_type, region) if kind == "spot" else self._on_demand(instance_type, region)
        except Exception as err:  # fall back to the table; say why once per kind
            if kind not in self._failed:
                self._failed.add(kind)
                log.warning("Live %s prices unavailable (%s); using the shipped price table.", kind, err)
            return None
        if usd is not None:
            self._write_cache(key, usd)
        return usd

    def _client(self, service: str, region: str) -> Any:
        from gpu_provider.backends.aws.calls import aws_client

        return aws_client(service, aws_conn_id=self.aws_conn_id, region_name=region)

    def _spot(self, instance_type: str, region: str) -> float | None:
        if instance_type.startswith("ml."):
            return None
        answer = self._client("ec2", region).describe_spot_price_history(
            InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX"], StartTime=time.time()
        )
        latest: dict[str, float] = {}
        for entry in sorted(answer.get("SpotPriceHistory") or [], key=lambda e: e["Timestamp"]):
            latest[str(entry.get("AvailabilityZone"))] = float(entry["SpotPrice"])
        return max(latest.values()) if latest else None

    def _on_demand(self, instance_type: str, region: str) -> float | None:
        # the Price List API answers in us-east-1 (and a few others) for every region
        client = self._client("pricing", "us-east-1")
        if instance_type.startswith("ml."):
            service, filters = "AmazonSageMaker", {"instanceName": instance_type, "regionCode": region}
        else:
            service = "AmazonEC2"
            filters = {
                "instanceType": instance_type,
                "regionCode": region,
                "operatingSystem": "Linux",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
            }
        answer = client.get_products(
            ServiceCode=service,
            Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
            MaxResults=100,
        )
        return on_demand_from_price_list(answer.get("PriceList") or [], training=instance_type.startswith("ml."))

    def _read_cache(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.cache_file.read_text()))
        except (OSError, ValueError):
            return {}

    def _write_cache(self, key: str, usd: float) -> None:
        with self._lock:
            data = self._read_cache()
            data[key] = [usd, time.time()]
            try:
                self.cache_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.cache_file.with_name(f".{self.cache_file.name}.{os.getpid()}")
                tmp.write_text(json.dumps(data))
                os.replace(tmp, self.cache_file)
            except OSError as err:
                log.debug("Could not write the price cache %s: %s", self.cache_file, err)


def _default_cache_file() -> Path:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return Path(home) / "gpu_provider" / "price-cache.json"


def on_demand_from_price_list(products: list[Any], *, training: bool = False) -> float | None:
    """The hourly USD price in Price List ``GetProducts`` entries (JSON text or dicts).

    For SageMaker (``training``) only training products count. Of several matching products, the highest.
    """
    found = []
    for item in products:
        product = json.loads(item) if isinstance(item, str) else item
        attributes = (product.get("product") or {}).get("attributes") or {}
        if training and "training" not in str(attributes.get("component", "")).lower():
            continue
        for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                usd = (dimension.get("pricePerUnit") or {}).get("USD")
                if usd and str(dimension.get("unit", "")).lower().startswith("hr") and float(usd) > 0:
                    found.append(float(usd))
    return max(found) if found else None
