"""Prices: the shipped table covers every instance a backend can be priced as, in every shipped
region; overrides, the spot ratio and the local price apply; the cost formula on a fixed example."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpu_provider import names
from gpu_provider.backends.base import backend_class, registered_backends
from gpu_provider.backends.sagemaker.mapping import INSTANCE_TABLE
from gpu_provider.job import GPU_TYPES, MAX_GPUS_PER_NODE, GpuResources
from gpu_provider.spend.prices import (
    CATALOGS,
    DEFAULT_SPOT_PRICE_RATIO,
    SHIPPED_REGIONS,
    LivePrices,
    PriceBook,
    PriceNotFoundError,
    attempt_cost,
    on_demand_from_price_list,
    parse_overrides,
    shipped_table,
)
from gpu_provider.testing.emulators.aws_ec2 import PRICE_HISTORY, Ec2SpotEmulator

FAMILIES = ("g4dn", "g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e", "trn1", "inf2")


def test_the_shipped_table_names_its_source_and_date_and_covers_the_families() -> None:
    table = shipped_table()
    assert table["source"].startswith("AWS public On-Demand price pages") and table["retrieved"] == "2026-12-03"
    for region in SHIPPED_REGIONS:
        types = set(table["on_demand"][region])
        for family in FAMILIES:
            assert any(t.startswith(family + ".") for t in types), (region, family)
            assert any(t.startswith(f"ml.{family}.") for t in types), (region, family)
        # every instance the table describes has a positive price in every region
        assert types == set(table["instances"]) and all(v > 0 for v in table["on_demand"][region].values())


@pytest.mark.parametrize("region", SHIPPED_REGIONS)
def test_every_instance_type_a_backend_can_choose_has_a_price(region: str) -> None:
    """For each registered backend's catalog: every GPU type at every per-node GPU count an instance of
    that type offers, the default instance, and each instance type named outright."""
    book = PriceBook()
    catalogs = {backend_class(name).price_catalog for name in registered_backends()}
    assert catalogs <= set(CATALOGS)
    for catalog in catalogs:
        for gpu_type in GPU_TYPES:
            largest = max(
                int(v["accelerators"]) for k, v in book.table["instances"].items() if v["accelerator"] == gpu_type
            )
            for gpus in range(1, min(largest, MAX_GPUS_PER_NODE) + 1):
                for capacity in names.CAPACITY_TYPES:
                    price = book.job_price(GpuResources(gpus=gpus, gpu_type=gpu_type), capacity, region, catalog)
                    assert price.usd_per_hour >= 0, (catalog, gpu_type, gpus)
                    if catalog != "local":
                        assert book.accelerators(price.instance_type) >= gpus
                        assert book.table["instances"][price.instance_type]["accelerator"] == gpu_type
        for itype in book.instance_types("ec2"):
            book.job_price(GpuResources(instance_types=(itype,)), names.ON_DEMAND, region, catalog)
        book.job_price(GpuResources(), names.SPOT, region, catalog)


@pytest.mark.parametrize("region", SHIPPED_REGIONS)
def test_every_instance_of_the_sagemaker_table_has_a_price(region: str) -> None:
    """The SageMaker backend picks its training instance from its own table: each has a price, spot too."""
    book = PriceBook()
    for per_node in INSTANCE_TABLE.values():
        for itype in per_node.values():
            for capacity in names.CAPACITY_TYPES:
                price = book.instance_price(itype, capacity, region, "sagemaker")
                assert price.usd_per_hour > 0, (itype, capacity, region)


def test_instance_choice_and_spot_ratio_on_a_fixed_example() -> None:
    book = PriceBook()
    # 4 A10G per node: the cheapest g5 with 4 GPUs is g5.12xlarge ($5.672/h in us-east-1 -> $1.418/GPU-hour)
    price = book.job_price(GpuResources(gpus=4, gpu_type="a10g"), names.ON_DEMAND, "us-east-1")
    assert (price.instance_type, price.usd_per_hour, price.accelerators) == ("g5.12xlarge", 5.672, 4)
    assert price.usd_per_gpu_hour == pytest.approx(1.418)
    spot = book.job_price(GpuResources(gpus=4, gpu_type="a10g"), names.SPOT, "us-east-1")
    assert spot.usd_per_hour == pytest.approx(5.672 * DEFAULT_SPOT_PRICE_RATIO)
    assert "spot_price_ratio 0.4" in spot.source
    # SageMaker sells the ml. variant; eu-west-1 is dearer
    ml = book.job_price(GpuResources(gpu_type="a10g"), names.ON_DEMAND, "eu-west-1", "sagemaker")
    assert ml.instance_type == "ml.g5.xlarge" and ml.usd_per_hour == pytest.approx(1.408 * 1.10, abs=1e-4)
    # of several allowed types, the dearest per GPU prices the job
    dearest = book.job_price(GpuResources(instance_types=("g6.xlarge", "g5.xlarge")), names.ON_DEMAND, "us-west-2")
    assert dearest.instance_type == "g5.xlarge"
    # the cost: 2 nodes x 4 GPUs for 90 minutes = 12 GPU-hours at $1.418 = $17.016
    assert attempt_cost(price, gpu_seconds=8 * 5400, nodes=2) == pytest.approx(17.016)
    # billable seconds (SageMaker): per instance, times the instances
    assert attempt_cost(price, gpu_seconds=0, nodes=2, billable_seconds=3600) == pytest.approx(2 * 5.672)


def test_overrides_local_price_and_unknown_prices() -> None:
    book = PriceBook(
        overrides=parse_overrides(json.dumps({"g5.xlarge": 2.0, "eu-west-1/g5.xlarge": 3.0, "spot/g5.xlarge": 0.5})),
        local_gpu_hour_usd=1.25,
    )
    res = GpuResources(gpu_type="a10g")
    assert book.job_price(res, names.ON_DEMAND, "us-east-1").usd_per_hour == 2.0
    assert book.job_price(res, names.ON_DEMAND, "eu-west-1").usd_per_hour == 3.0
    assert book.job_price(res, names.SPOT, "eu-west-1").usd_per_hour == 0.5
    local = book.job_price(GpuResources(gpus=2), names.ON_DEMAND, None, "local")
    assert (local.usd_per_gpu_hour, local.source) == (1.25, "[gpu_provider] local_gpu_hour_usd")
    assert PriceBook().job_price(GpuResources(), names.ON_DEMAND, None, "local").usd_per_hour == 0.0
    with pytest.raises(PriceNotFoundError, match=r"no price for g5.xlarge in ap-south-1: .*\[gpu_provider\] prices"):
        PriceBook().job_price(res, names.ON_DEMAND, "ap-south-1")
    with pytest.raises(ValueError, match=r"prices\['g5.xlarge'\]=-1 must be USD"):
        parse_overrides('{"g5.xlarge": -1}')
    with pytest.raises(ValueError, match="must be JSON like"):
        parse_overrides("g5.xlarge=1")


def test_live_prices_come_first_and_a_failing_source_falls_back_to_the_table() -> None:
    asked: list[tuple[str, str, str]] = []

    def live(kind: str, itype: str, region: str) -> float | None:
        asked.append((kind, itype, region))
        return 0.31 if kind == "spot" else None  # the Price List API did not answer

    book = PriceBook(live=live)
    spot = book.job_price(GpuResources(gpu_type="a10g"), names.SPOT, "us-west-2")
    assert (spot.usd_per_hour, spot.source) == (0.31, "EC2 DescribeSpotPriceHistory")
    od = book.job_price(GpuResources(gpu_type="a10g"), names.ON_DEMAND, "us-west-2")
    assert od.usd_per_hour == 1.006 and od.source.startswith("shipped table")
    assert asked == [("spot", "g5.xlarge", "us-west-2"), ("on_demand", "g5.xlarge", "us-west-2")]


def test_price_list_answers_are_read_for_their_hourly_on_demand_price() -> None:
    product = {
        "product": {"attributes": {"instanceType": "g5.xlarge", "component": "Training"}},
        "terms": {
            "OnDemand": {
                "X.Y": {"priceDimensions": {"X.Y.Z": {"unit": "Hrs", "pricePerUnit": {"USD": "1.0060000000"}}}}
            }
        },
    }
    assert on_demand_from_price_list([json.dumps(product)]) == pytest.approx(1.006)
    hosting = json.loads(json.dumps(product))
    hosting["product"]["attributes"]["component"] = "Hosting"
    hosting["terms"]["OnDemand"]["X.Y"]["priceDimensions"]["X.Y.Z"]["pricePerUnit"]["USD"] = "9.9"
    assert on_demand_from_price_list([product, hosting], training=True) == pytest.approx(1.006)
    assert on_demand_from_price_list([]) is None
    assert not math.isnan(PriceBook().job_price(GpuResources(), names.ON_DEMAND, "us-east-1").usd_per_hour)


def test_live_spot_prices_from_describe_spot_price_history_are_cached_and_a_missing_price_list_falls_back(
    ec2_spot: Ec2SpotEmulator, tmp_path: Path
) -> None:
    ec2_spot.set_price("us-east-1", "us-east-1a", "g5.xlarge", 0.35)
    ec2_spot.set_price("us-east-1", "us-east-1b", "g5.xlarge", 0.42)
    live = LivePrices("aws_default", cache_file=tmp_path / "price-cache.json")
    book = PriceBook(live=live)
    spot = book.job_price(GpuResources(gpu_type="a10g"), names.SPOT, "us-east-1")
    # the highest current price over the region's zones (the attempt may land in either)
    assert (spot.usd_per_hour, spot.source) == (0.42, "EC2 DescribeSpotPriceHistory")
    (request,) = ec2_spot.requests(PRICE_HISTORY)
    assert request["region"] == "us-east-1"
    assert request["body"]["InstanceType.1"] == "g5.xlarge" and request["body"]["ProductDescription.1"] == "Linux/UNIX"
    # a second reader (another task) is answered from the cache file
    again = PriceBook(live=LivePrices("aws_default", cache_file=tmp_path / "price-cache.json"))
    assert again.job_price(GpuResources(gpu_type="a10g"), names.SPOT, "us-east-1").usd_per_hour == 0.42
    assert len(ec2_spot.requests(PRICE_HISTORY)) == 1
    # the emulator has no Price List API: on-demand falls back to the shipped table, said once
    on_demand = book.job_price(GpuResources(gpu_type="a10g"), names.ON_DEMAND, "us-east-1")
    assert on_demand.usd_per_hour == 1.006 and on_demand.source.startswith("shipped table")
    assert json.loads((tmp_path / "price-cache.json").read_text())["spot|us-east-1|g5.xlarge"][0] == 0.42
