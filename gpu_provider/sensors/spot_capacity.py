"""``SpotCapacitySensor``: wait until EC2 spot capacity looks available (placement score) or cheap (price)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout

from gpu_provider.exceptions import SpotCapacityError
from gpu_provider.names import DEFER_TIMEOUT_SLACK_S, MAX_POLL_INTERVAL_S
from gpu_provider.triggers.spot_capacity import (
    EVENT_STATUSES,
    SUCCESS,
    TIMEOUT,
    ClientFactory,
    SpotCapacityQuery,
    SpotCapacityTrigger,
    ec2_clients,
    is_throttling,
    read_spot_capacity,
    summarise,
    validate_instance_types,
    validate_regions,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

#: how long the sensor waits by default: long enough for capacity to come back, short enough that
#: the on-demand fallback of the DAG still starts the same hour
DEFAULT_TIMEOUT_S = 3600.0
#: seconds between readings by default: scores and prices change slowly
DEFAULT_POLL_INTERVAL_S = 300.0


def _seconds(value: Any, field: str, *, low: float, high: float) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise TypeError(f"{field}={value!r} must be seconds (a number) or a timedelta")
    if not low < seconds <= high:
        raise ValueError(f"{field}={value!r} must be more than {low:g} and at most {high:g} seconds")
    return float(seconds)


class SpotCapacitySensor(BaseSensorOperator):
    """Wait for EC2 spot capacity before committing a large spot job.

    Succeeds when EC2's **spot placement score** (``GetSpotPlacementScores``: how likely a spot request
    for ``target_capacity`` instances of ``instance_types`` succeeds, 1-10, per region) reaches
    ``min_score`` in one of ``regions``, **or** when the **spot price** in effect now
    (``DescribeSpotPriceHistory``, Linux/UNIX) of one of the instance types in some availability zone
    of those regions is at most ``max_price``. Give one of the two, or both.

    Waits deferred by default (the triggerer reads EC2 every ``poll_interval``); ``deferrable=False``
    uses ``mode="poke"`` or ``"reschedule"``. After ``timeout`` (default 1 hour) the sensor fails, or is
    skipped with ``soft_fail=True``: route the DAG to on-demand capacity then (see
    ``dags/gpu_spot_routing.py``). A throttled reading counts as "not yet"; other EC2 errors (e.g.
    missing ``ec2:GetSpotPlacementScores`` permission) fail the task, also with ``soft_fail``.

    :param instance_types: EC2 instance types the job can use, e.g. ``["g5.2xlarge", "g6.2xlarge"]``
        (SageMaker ``ml.`` names are refused).
    :param regions: AWS regions it may run in, e.g. ``["us-east-1", "us-west-2"]`` (at most 10).
    :param target_capacity: instances the job needs (default 1).
    :param min_score: the spot placement score to wait for, 1-10 (10: a spot request is most likely to succeed).
    :param max_price: the spot price to wait for, USD per instance-hour.
    :param aws_conn_id: the Airflow AWS connection (default ``aws_default``).
    :param deferrable: wait in the triggerer (default ``True``).
    :param poll_interval: seconds (or a timedelta) between readings (default 300; at most 3600).
    :param timeout: seconds (or a timedelta) to wait in all (default 3600).
    :return: (XCom) ``{"satisfied_by": "score" | "price", "region", "availability_zone",
        "instance_type", "score", "price", "seen": {"scores": {...}, "prices": [...]}, "checked_at"}``
    """

    ui_color = "#fdf1e1"

    def __init__(
        self,
        *,
        instance_types: Sequence[str],
        regions: Sequence[str],
        target_capacity: int = 1,
        min_score: int | None = None,
        max_price: float | None = None,
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = True,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL_S,
        timeout: float | timedelta = DEFAULT_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        if aws_conn_id is not None and not isinstance(aws_conn_id, str):
            raise TypeError(f"aws_conn_id={aws_conn_id!r} must be an Airflow connection id (a string) or None")
        if "poke_interval" in kwargs:
            raise TypeError("pass poll_interval=, not poke_interval=, to SpotCapacitySensor")
        if not isinstance(deferrable, bool):
            raise TypeError(f"deferrable={deferrable!r} must be True or False")
        if deferrable and kwargs.get("mode", "poke") != "poke":
            raise ValueError(f"mode={kwargs['mode']!r} applies only with deferrable=False")
        interval = _seconds(poll_interval, "poll_interval", low=0, high=MAX_POLL_INTERVAL_S)
        wait = _seconds(timeout, "timeout", low=0, high=366 * 86400)
        super().__init__(poke_interval=interval, timeout=wait, **kwargs)
        self.query = SpotCapacityQuery(
            instance_types=validate_instance_types(instance_types),
            regions=validate_regions(regions),
            target_capacity=target_capacity,
            min_score=min_score,
            max_price=max_price,
        )
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        self._clients: ClientFactory | None = None

    def _read(self) -> dict[str, Any] | None:
        """One reading, ``None`` when EC2 throttled it (the next reading tries again)."""
        try:
            if self._clients is None:  # built on the first reading, kept for the next pokes
                self._clients = ec2_clients(self.aws_conn_id)
            reading = read_spot_capacity(self.query, self._clients)
        except Exception as err:
            if is_throttling(err):
                self.log.warning("EC2 throttled the spot capacity reading; trying again next time.")
                return None
            raise SpotCapacityError(f"Could not read spot capacity from EC2: {err}") from err
        self.log.info("%s", summarise(self.query, reading))
        return reading

    def poke(self, context: Context) -> bool | PokeReturnValue:
        reading = self._read()
        if reading is None or reading["satisfied_by"] is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=reading)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        started = time.time()
        self.log.info("Waiting for %s, at most %gs.", self.query.describe(), self.timeout)
        reading = self._read()  # capacity may be there already: then no deferral at all
        if reading is not None and reading["satisfied_by"] is not None:
            return reading
        self.defer(
            trigger=SpotCapacityTrigger(
                query=self.query.to_dict(),
                aws_conn_id=self.aws_conn_id,
                poll_interval=self.poke_interval,
                end_time=started + self.timeout,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + DEFER_TIMEOUT_SLACK_S),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if not isinstance(event, dict) or event.get("status") not in EVENT_STATUSES:
            raise SpotCapacityError(f"SpotCapacitySensor got an unexpected trigger event: {event!r}")
        message = str(event.get("message", ""))
        if event["status"] == SUCCESS:
            self.log.info("%s", message)
            return event["result"]
        if event["status"] == TIMEOUT:  # soft_fail turns this into a skip (BaseSensorOperator.resume_execution)
            self.log.warning("%s", message)  # the skip's own message does not say what was seen
            raise AirflowSensorTimeout(message)
        raise SpotCapacityError(message)  # ERROR: EC2 refused a call
