"""SpotCapacitySensor and its trigger against the EC2 emulator (real botocore requests over HTTP, scores
and prices the test chooses): succeeds and times out in poke and deferrable mode, the exact requests
sent, throttling and errors, parse-time validation naming the field, and the trigger's JSON round trip."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException, TaskDeferred

from gpu_provider.exceptions import SpotCapacityError
from gpu_provider.sensors import SpotCapacitySensor
from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
from gpu_provider.triggers.spot_capacity import SpotCapacityTrigger
from tests.ec2_world import ec2_connection_env
from tests.harness import Harness

TYPES = ["g5.2xlarge", "g6.2xlarge"]
REGIONS = ["us-east-1", "us-west-2"]


def sensor(**kwargs: Any) -> SpotCapacitySensor:
    args: dict[str, Any] = {
        "task_id": "wait_for_spot",
        "instance_types": TYPES,
        "regions": REGIONS,
        "target_capacity": 4,
        "poll_interval": 0.2,
        **kwargs,
    }
    return SpotCapacitySensor(**args)


def run_trigger(trigger: SpotCapacityTrigger, timeout: float = 20) -> dict[str, Any]:
    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first_event(), timeout))


# ---------------------------------------------------------------------- placement scores


def test_score_reached_in_one_region_succeeds_with_the_exact_request(ec2_spot: Ec2SpotEmulator) -> None:
    wait = sensor(min_score=7)
    ec2_spot.set_scores({"us-east-1": 3, "us-west-2": 6})
    assert wait.poke({}) is False
    ec2_spot.set_scores({"us-east-1": 3, "us-west-2": 8})
    done = wait.poke({})
    assert done and done.xcom_value is not None  # type: ignore[union-attr]
    found = done.xcom_value  # type: ignore[union-attr]
    assert (found["satisfied_by"], found["region"], found["score"]) == ("score", "us-west-2", 8)
    assert found["seen"] == {"scores": {"us-east-1": 3, "us-west-2": 8}}
    requests = ec2_spot.requests("GetSpotPlacementScores")
    assert len(requests) == 2 and ec2_spot.requests("DescribeSpotPriceHistory") == []
    assert requests[0]["region"] == "us-east-1"  # asked from the first region
    assert requests[0]["body"] == {
        "Action": "GetSpotPlacementScores",
        "Version": "2016-11-15",
        "InstanceType.1": "g5.2xlarge",
        "InstanceType.2": "g6.2xlarge",
        "TargetCapacity": "4",
        "TargetCapacityUnitType": "units",
        "SingleAvailabilityZone": "false",
        "RegionName.1": "us-east-1",
        "RegionName.2": "us-west-2",
    }


# ---------------------------------------------------------------------- prices


def test_price_in_effect_now_at_or_under_the_bound_succeeds(ec2_spot: Ec2SpotEmulator) -> None:
    now = datetime.now(timezone.utc)
    ec2_spot.set_price("us-east-1", "us-east-1a", "g5.2xlarge", 0.40, at=now - timedelta(hours=3))
    ec2_spot.set_price("us-east-1", "us-east-1a", "g5.2xlarge", 0.90, at=now - timedelta(hours=1))  # now 0.90
    ec2_spot.set_price("us-east-1", "us-east-1b", "g6.2xlarge", 0.75, at=now - timedelta(hours=2))
    ec2_spot.set_price("us-east-1", "us-east-1b", "g6.2xlarge", 0.10, product="Windows", at=now - timedelta(hours=2))
    ec2_spot.set_price("us-west-2", "us-west-2c", "g5.2xlarge", 0.71, at=now - timedelta(minutes=5))
    wait = sensor(max_price=0.70)
    assert wait.poke({}) is False  # 0.40 is history, Windows is not asked for: cheapest now is 0.71
    ec2_spot.set_price("us-west-2", "us-west-2c", "g5.2xlarge", 0.70, at=now)
    done = wait.poke({})
    found = done.xcom_value  # type: ignore[union-attr]
    assert (found["satisfied_by"], found["region"], found["availability_zone"], found["instance_type"]) == (
        "price",
        "us-west-2",
        "us-west-2c",
        "g5.2xlarge",
    )
    assert found["price"] == 0.70 and found["score"] is None
    seen = {(p["region"], p["availability_zone"], p["instance_type"]): p["price"] for p in found["seen"]["prices"]}
    assert seen == {
        ("us-east-1", "us-east-1a", "g5.2xlarge"): 0.90,
        ("us-east-1", "us-east-1b", "g6.2xlarge"): 0.75,
        ("us-west-2", "us-west-2c", "g5.2xlarge"): 0.70,
    }
    last_two = ec2_spot.requests("DescribeSpotPriceHistory")[-2:]
    assert [r["region"] for r in last_two] == REGIONS  # one call per region
    for request in last_two:
        body = dict(request["body"])
        start = datetime.fromisoformat(body.pop("StartTime").replace("Z", "+00:00"))
        assert abs((start - datetime.now(timezone.utc)).total_seconds()) < 30
        assert body == {
            "Action": "DescribeSpotPriceHistory",
            "Version": "2016-11-15",
            "InstanceType.1": "g5.2xlarge",
            "InstanceType.2": "g6.2xlarge",
            "ProductDescription.1": "Linux/UNIX",
        }


def test_with_both_bounds_either_satisfies_it(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 2, "us-west-2": 2})
    ec2_spot.set_price("us-east-1", "us-east-1a", "g6.2xlarge", 0.30)
    found = sensor(min_score=9, max_price=0.5).poke({}).xcom_value  # type: ignore[union-attr]
    assert (found["satisfied_by"], found["instance_type"], found["price"]) == ("price", "g6.2xlarge", 0.30)
    assert found["seen"]["scores"] == {"us-east-1": 2, "us-west-2": 2}


# ---------------------------------------------------------------------- poke mode: success, timeout


def _raise_after_first_reading(ec2: Ec2SpotEmulator, scores: dict[str, int]) -> threading.Thread:
    """Set ``scores`` once the first reading has been answered (its answer is computed before its status is set)."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = [r for r in ec2.requests("GetSpotPlacementScores") if r["status"] is not None]
            if done:
                break
            time.sleep(0.02)
        ec2.set_scores(scores)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_poke_mode_waits_until_the_score_comes(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-west-2": 2})
    watcher = _raise_after_first_reading(ec2_spot, {"us-west-2": 9})
    found = sensor(min_score=8, deferrable=False, timeout=60).execute({})
    watcher.join(5)
    assert (found["region"], found["score"]) == ("us-west-2", 9)
    assert len(ec2_spot.requests("GetSpotPlacementScores")) >= 2  # not yet, then there


def test_poke_mode_times_out_and_soft_fail_skips(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 5})
    with pytest.raises(AirflowSensorTimeout):
        sensor(min_score=6, deferrable=False, timeout=0.6).execute({})
    with pytest.raises(AirflowSkipException):
        sensor(min_score=6, deferrable=False, timeout=0.6, soft_fail=True).execute({})


# ---------------------------------------------------------------------- deferrable: success, timeout


def test_deferrable_checks_once_then_defers_and_the_trigger_fires_on_capacity(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 4})
    wait = sensor(min_score=7, timeout=30)
    with pytest.raises(TaskDeferred) as deferred:
        wait.execute({})
    assert len(ec2_spot.requests("GetSpotPlacementScores")) == 1  # the first reading, in the worker
    trigger = deferred.value.trigger
    assert isinstance(trigger, SpotCapacityTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert trigger.end_time == pytest.approx(time.time() + 30, abs=5)
    ec2_spot.reset()  # the trigger's first reading is then the first one in the log
    ec2_spot.set_scores({"us-east-1": 4})
    watcher = _raise_after_first_reading(ec2_spot, {"us-east-1": 7})
    event = run_trigger(trigger)
    watcher.join(5)
    assert event["status"] == "success"
    assert (event["result"]["region"], event["result"]["score"]) == ("us-east-1", 7)
    assert wait.execute_complete({}, event) == event["result"]


def test_deferrable_returns_at_once_when_capacity_is_already_there(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-west-2": 10})
    found = sensor(min_score=7).execute({})
    assert (found["region"], found["score"]) == ("us-west-2", 10)


def test_trigger_times_out_with_what_it_saw(ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 3, "us-west-2": 5})
    wait = sensor(min_score=6)
    trigger = SpotCapacityTrigger(
        query=wait.query.to_dict(), aws_conn_id="aws_default", poll_interval=0.2, end_time=time.time() + 0.8
    )
    started = time.monotonic()
    event = run_trigger(trigger)
    assert 0.7 < time.monotonic() - started < 30
    assert event["status"] == "timeout"
    assert event["result"]["seen"]["scores"] == {"us-east-1": 3, "us-west-2": 5}
    assert "us-west-2 5 (want >= 6)" in event["message"]
    assert ec2_spot.requests("GetSpotPlacementScores"), "the trigger read the scores before it gave up"
    with pytest.raises(AirflowSensorTimeout, match="No spot capacity"):
        wait.execute_complete({}, event)


def test_trigger_round_trips_through_json() -> None:
    wait = sensor(min_score=7, max_price=1.25)
    trigger = SpotCapacityTrigger(
        query=wait.query.to_dict(), aws_conn_id="aws_ml", poll_interval=30.0, end_time=1_800_000_000.5
    )
    path, kwargs = trigger.serialize()
    assert path == "gpu_provider.triggers.spot_capacity.SpotCapacityTrigger"
    again = SpotCapacityTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (path, kwargs)
    assert kwargs["query"] == {
        "instance_types": TYPES,
        "regions": REGIONS,
        "target_capacity": 4,
        "min_score": 7,
        "max_price": 1.25,
    }


# ---------------------------------------------------------------------- throttling and errors


def _no_retries(monkeypatch: pytest.MonkeyPatch, ec2: Ec2SpotEmulator, endpoint: str | None = None) -> None:
    extra = {
        "endpoint_url": endpoint or ec2.endpoint_url,
        "region_name": "us-east-1",
        "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 1}},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))


def test_a_throttled_reading_counts_as_not_yet(ec2_spot: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_retries(monkeypatch, ec2_spot)
    ec2_spot.set_scores({"us-east-1": 10})
    ec2_spot.throttle("GetSpotPlacementScores", 1)
    wait = sensor(min_score=7)
    assert wait.poke({}) is False
    assert [r["throttled"] for r in ec2_spot.requests("GetSpotPlacementScores")] == [True]
    ec2_spot.throttle("GetSpotPlacementScores", 0)
    assert wait.poke({})


def test_an_ec2_error_fails_the_sensor_and_the_trigger(
    ec2_spot: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    _no_retries(monkeypatch, ec2_spot, endpoint=f"http://127.0.0.1:{port}")
    wait = sensor(min_score=7, soft_fail=True)
    with pytest.raises(SpotCapacityError, match="Could not read spot capacity from EC2"):
        wait.poke({})
    trigger = SpotCapacityTrigger(
        query=wait.query.to_dict(), aws_conn_id="aws_default", poll_interval=0.2, end_time=time.time() + 30
    )
    event = run_trigger(trigger)
    assert event["status"] == "error"
    with pytest.raises(SpotCapacityError):
        wait.execute_complete({}, event)


# ---------------------------------------------------------------------- parse-time validation


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"instance_types": ["ml.g5.2xlarge"]},
            ValueError,
            r"instance_types\[0\]='ml.g5.2xlarge' is a SageMaker.*'g5.2xlarge'",
        ),
        (
            {"instance_types": ["g5.2xlarge", "G6.2xlarge"]},
            ValueError,
            r"instance_types\[1\]='G6.2xlarge' is not an EC2",
        ),
        ({"instance_types": ["g5"]}, ValueError, r"instance_types\[0\]='g5' is not an EC2 instance type"),
        ({"instance_types": ["g5.*"]}, ValueError, r"instance_types\[0\]='g5.\*'"),
        ({"instance_types": "g5.2xlarge"}, TypeError, r"instance_types='g5.2xlarge' must be a list"),
        ({"instance_types": []}, ValueError, r"instance_types must name at least one"),
        (
            {"instance_types": ["g5.2xlarge", "g5.2xlarge"]},
            ValueError,
            r"instance_types names g5.2xlarge more than once",
        ),
        ({"regions": ["us-east1"]}, ValueError, r"regions\[0\]='us-east1' is not an AWS region name"),
        ({"regions": ["us-east-1", "mars-east-1"]}, ValueError, r"regions\[1\]='mars-east-1' is not an AWS region"),
        ({"regions": ["us-est-1"]}, ValueError, r"regions\[0\]='us-est-1'"),
        ({"regions": ["us-east-1a"]}, ValueError, r"regions\[0\]='us-east-1a'"),
        ({"regions": "us-east-1"}, TypeError, r"regions='us-east-1' must be a list"),
        (
            {"regions": [f"us-east-{i}" for i in range(1, 12)]},
            ValueError,
            r"regions names 11 regions; EC2 scores at most 10",
        ),
        ({"target_capacity": 0}, ValueError, r"target_capacity=0 must be from 1 to 2000000000"),
        ({"target_capacity": 2_000_000_001}, ValueError, r"target_capacity=2000000001"),
        ({"target_capacity": True}, TypeError, r"target_capacity=True must be an integer"),
        ({"min_score": 0}, ValueError, r"min_score=0 must be from 1 to 10"),
        ({"min_score": 11}, ValueError, r"min_score=11"),
        ({"min_score": 7.5}, TypeError, r"min_score=7.5 must be an integer"),
        ({"min_score": None, "max_price": 0}, ValueError, r"max_price=0 must be a finite number of USD per hour"),
        ({"min_score": None, "max_price": -1.0}, ValueError, r"max_price=-1.0"),
        ({"min_score": None, "max_price": math.nan}, ValueError, r"max_price=nan"),
        ({"min_score": None, "max_price": math.inf}, ValueError, r"max_price=inf"),
        ({"min_score": None, "max_price": "0.5"}, TypeError, r"max_price='0.5' must be a number"),
        ({"min_score": None}, ValueError, r"give min_score \(1-10\), max_price \(USD per hour\), or both"),
        ({"poll_interval": 0}, ValueError, r"poll_interval=0 must be more than 0"),
        ({"timeout": -5}, ValueError, r"timeout=-5"),
        ({"mode": "reschedule"}, ValueError, r"mode='reschedule' applies only with deferrable=False"),
        ({"deferrable": "yes"}, TypeError, r"deferrable='yes' must be True or False"),
        ({"aws_conn_id": 42}, TypeError, r"aws_conn_id=42 must be an Airflow connection id"),
    ],
)
def test_bad_arguments_are_refused_at_parse_time_naming_the_field(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        sensor(**{"min_score": 7, **kwargs})


def test_valid_names_are_accepted() -> None:
    wait = sensor(
        instance_types=["p4d.24xlarge", "u-6tb1.metal", "m7i.metal-24xl", "g6e.xlarge", "p6-b200.48xlarge"],
        regions=["us-gov-west-1", "cn-northwest-1", "eu-central-2", "ap-southeast-5", "il-central-1"],
        min_score=10,
        max_price=98.32,
        target_capacity=2_000_000_000,
        deferrable=False,
        mode="reschedule",
        poll_interval=timedelta(minutes=2),
    )
    assert wait.poke_interval == 120 and wait.timeout == 3600  # the default timeout: one hour
    assert wait.query.max_price == 98.32 and wait.mode == "reschedule"


# ---------------------------------------------------------------------- reschedule mode, in Airflow


def test_reschedule_mode_frees_the_worker_between_readings(harness: Harness, ec2_spot: Ec2SpotEmulator) -> None:
    ec2_spot.set_scores({"us-east-1": 2})

    def raise_later() -> None:  # after two rescheduled readings
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(ec2_spot.requests("GetSpotPlacementScores")) < 2:
            time.sleep(0.05)
        ec2_spot.set_scores({"us-east-1": 8})

    watcher = threading.Thread(target=raise_later, daemon=True)
    watcher.start()
    dag_file = harness.write_dag(
        "spot_reschedule",
        """
        from gpu_provider.sensors import SpotCapacitySensor
        job = SpotCapacitySensor(task_id="job", instance_types=["g5.xlarge"], regions=["us-east-1"], min_score=8,
                                 deferrable=False, mode="reschedule", poll_interval=0.5, timeout=60)
        """,
    )
    run = harness.run(dag_file, "spot_reschedule", extra_env=ec2_connection_env(ec2_spot))
    watcher.join(5)
    assert run.result["state"].endswith("success"), run.log[-4000:]
    assert run.task()["xcom"]["score"] == 8
    assert run.log.count("Rescheduling task") >= 1  # the worker was given back between readings
