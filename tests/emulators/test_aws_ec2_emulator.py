"""The EC2 spot emulator (gpu_provider/testing/emulators/aws_ec2.py) over real botocore requests: placement scores
and spot
price history as the test set them, AWS's rules for both calls, paging, throttling, the request log,
and the same calls answered through the Batch emulator's endpoint (one server for Batch and EC2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
from tests.batch_world import BatchWorld
from tests.harness import REPO

NOW = datetime.now(timezone.utc)


def test_placement_scores_are_the_chosen_ones_highest_first(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 3, "us-west-2": 9})
    answer = ec2_spot.client().get_spot_placement_scores(
        InstanceTypes=["g5.2xlarge"],
        TargetCapacity=2,
        SingleAvailabilityZone=False,
        RegionNames=["us-east-1", "us-west-2", "eu-west-1"],
    )
    assert answer["SpotPlacementScores"] == [
        {"Region": "us-west-2", "Score": 9},
        {"Region": "us-east-1", "Score": 3},
        {"Region": "eu-west-1", "Score": 1},  # not set: the lowest score
    ]
    (request,) = ec2_spot.requests("GetSpotPlacementScores")
    assert request["status"] == 200 and request["region"] == "us-east-1"
    assert request["body"]["RegionName.3"] == "eu-west-1" and request["body"]["TargetCapacity"] == "2"


def test_placement_scores_page_and_follow_aws_rules(ec2_spot: Ec2SpotEmulator) -> None:
    regions = [f"{p}-{d}-{n}" for p in ("us", "eu", "ap") for d in ("east", "west") for n in (1, 2)]
    ec2_spot.set_scores({r: 1 + i % 10 for i, r in enumerate(regions)})
    client = ec2_spot.client()
    first = client.get_spot_placement_scores(InstanceTypes=["g5.xlarge"], TargetCapacity=1, MaxResults=10)
    second = client.get_spot_placement_scores(
        InstanceTypes=["g5.xlarge"], TargetCapacity=1, MaxResults=10, NextToken=first["NextToken"]
    )
    assert "NextToken" not in second
    assert sorted(s["Region"] for s in first["SpotPlacementScores"] + second["SpotPlacementScores"]) == sorted(regions)
    with pytest.raises(ClientError, match="SingleAvailabilityZone=true is not emulated"):
        client.get_spot_placement_scores(InstanceTypes=["g5.xlarge"], TargetCapacity=1, SingleAvailabilityZone=True)
    with pytest.raises(ClientError, match="InvalidParameterCombination"):
        client.get_spot_placement_scores(TargetCapacity=1)
    with pytest.raises(ValueError, match="from 1 to 10"):
        ec2_spot.set_scores({"us-east-1": 11})


def test_price_history_is_the_chosen_one_with_the_price_in_effect_at_start(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_price("us-west-2", "us-west-2a", "g5.2xlarge", 0.9, at=NOW - timedelta(hours=3))
    ec2_spot.set_price("us-west-2", "us-west-2a", "g5.2xlarge", 0.5, at=NOW - timedelta(hours=1))
    ec2_spot.set_price("us-west-2", "us-west-2b", "g5.2xlarge", 0.7, at=NOW - timedelta(hours=2))
    ec2_spot.set_price("us-west-2", "us-west-2b", "g5.2xlarge", 0.2, product="Windows", at=NOW - timedelta(hours=2))
    ec2_spot.set_price("us-east-1", "us-east-1a", "g5.2xlarge", 0.1)  # another region
    client = ec2_spot.client(region_name="us-west-2")
    now = client.describe_spot_price_history(
        InstanceTypes=["g5.2xlarge"], ProductDescriptions=["Linux/UNIX"], StartTime=NOW
    )["SpotPriceHistory"]
    assert [(p["AvailabilityZone"], p["SpotPrice"], p["ProductDescription"]) for p in now] == [
        ("us-west-2a", "0.500000", "Linux/UNIX"),
        ("us-west-2b", "0.700000", "Linux/UNIX"),
    ]
    everything = client.describe_spot_price_history(InstanceTypes=["g5.2xlarge"])["SpotPriceHistory"]
    assert [p["SpotPrice"] for p in everything] == ["0.500000", "0.700000", "0.200000", "0.900000"]  # newest first
    zone = client.describe_spot_price_history(Filters=[{"Name": "availability-zone", "Values": ["us-west-2b"]}])
    assert {p["SpotPrice"] for p in zone["SpotPriceHistory"]} == {"0.700000", "0.200000"}
    paged = client.describe_spot_price_history(MaxResults=3)
    assert len(paged["SpotPriceHistory"]) == 3 and paged["NextToken"]
    assert [r["region"] for r in ec2_spot.requests("DescribeSpotPriceHistory")] == ["us-west-2"] * 4


def test_throttling_answers_request_limit_exceeded(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.throttle("*", 2)
    client = ec2_spot.client(config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    client.describe_spot_price_history()
    with pytest.raises(ClientError) as err:
        client.describe_spot_price_history()
    assert err.value.response["Error"]["Code"] == "RequestLimitExceeded"
    assert [r["throttled"] for r in ec2_spot.requests()] == [False, True]


def test_the_batch_emulators_endpoint_answers_the_spot_calls_too(ec2_spot: Ec2SpotEmulator, batch: BatchWorld) -> None:
    ec2_spot.set_scores({"us-east-1": 6})
    client = ec2_spot.client(endpoint_url=batch.emulator.endpoint_url)
    scores = client.get_spot_placement_scores(InstanceTypes=["g5.xlarge"], TargetCapacity=1, RegionNames=["us-east-1"])
    assert scores["SpotPlacementScores"] == [{"Region": "us-east-1", "Score": 6}]
    assert batch.emulator.client("batch").describe_job_queues(jobQueues=[batch.setup.spot_queue])["jobQueues"]
    assert len(ec2_spot.requests("GetSpotPlacementScores")) == 1


def test_without_a_server_of_its_own_it_serves_through_one_that_runs() -> None:
    # in a child process: one emulator per process, and this worker's session emulator is installed
    code = textwrap.dedent(
        """
        from moto.server import ThreadedMotoServer
        from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        with Ec2SpotEmulator(endpoint_url=f"http://{host}:{port}") as ec2:
            ec2.set_scores({"eu-west-1": 7})
            answer = ec2.client().get_spot_placement_scores(InstanceTypes=["g5.xlarge"], TargetCapacity=1)
            print(answer["SpotPlacementScores"], len(ec2.requests()))
        server.stop()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip().splitlines()[-1] == "[{'Region': 'eu-west-1', 'Score': 7}] 1"
