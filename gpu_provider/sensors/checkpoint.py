"""``CheckpointSensor``: wait until a job has published a checkpoint at or beyond a step, or newer than one."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout

from gpu_provider.exceptions import CheckpointReadError
from gpu_provider.job import is_templated, safe_repr, validate_checkpoint_uri
from gpu_provider.names import DEFER_TIMEOUT_SLACK_S, MAX_POLL_INTERVAL_S
from gpu_provider.runtime.checkpoint import published_checkpoint
from gpu_provider.templates import WithTemplateFilters
from gpu_provider.triggers.checkpoint import (
    EVENT_STATUSES,
    SUCCESS,
    TIMEOUT,
    CheckpointTrigger,
    describe_wait,
    lowest_step,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

#: ``newer_than=`` this: the newest step the same task saw in an earlier run
PREVIOUS_RUN = "previous_run"
DEFAULT_POLL_INTERVAL_S = 60.0


def _poll_interval(value: Any) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise TypeError(f"poll_interval={safe_repr(value)} must be seconds (a number) or a timedelta")
    if not 0 < seconds <= MAX_POLL_INTERVAL_S:
        raise ValueError(
            f"poll_interval={safe_repr(value)} must be more than 0 and at most {MAX_POLL_INTERVAL_S:g} seconds"
        )
    return float(seconds)


def _step(value: Any, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{field}={safe_repr(value)} must be an integer step >= 0")
    if value < 0:
        raise ValueError(f"{field}={safe_repr(value)} must be an integer step >= 0")
    return value


def _newer_than(value: Any, *, rendered: bool) -> int | str | None:
    """``newer_than`` checked: ``None``, a step, ``"previous_run"``, or (before rendering) a template.

    After rendering, a string of digits is a step (templates render to strings) and an empty one is ``None``.
    """
    allowed = f"allowed: an integer step >= 0, {PREVIOUS_RUN!r}, or None"
    if value is None or value == PREVIOUS_RUN:
        return value  # type: ignore[no-any-return]
    if isinstance(value, str):
        if not rendered and is_templated(value):
            return value
        text = value.strip()
        if rendered and not text:
            return None
        if rendered and text.isdigit():
            return int(text)
        raise ValueError(f"newer_than={safe_repr(value)} is not a step; {allowed}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"newer_than={safe_repr(value)} has type {type(value).__name__}; {allowed}")
    return _step(value, "newer_than")


class CheckpointSensor(WithTemplateFilters, BaseSensorOperator):
    """Wait for a *published* checkpoint at ``uri``: the ``ckpt-<step>`` folder that ``LATEST`` names.

    A folder still being written (``.tmp-...``), or a ``ckpt-`` folder that ``LATEST`` does not name
    yet (e.g. still uploading to S3), never counts. Useful to evaluate intermediate checkpoints while
    training still runs, or to gate a downstream stage on a checkpoint that another DAG produces.

    Waits deferred by default (the triggerer reads the storage every ``poll_interval``);
    ``deferrable=False`` uses ``mode="poke"`` or ``"reschedule"``. After ``timeout`` (Airflow's sensor
    default, 7 days) the sensor fails, or is skipped with ``soft_fail=True``.

    ``newer_than="previous_run"``: the step this task pushed (XCom ``return_value``) in the latest
    earlier DAG run, by logical date (``run_after`` for runs without one), that has one: Airflow's
    ``xcom_pull(include_prior_dates=True)`` for this task and map index. A run's own value does not
    count (it is cleared when the task starts). With no earlier run that saw a checkpoint, any
    published checkpoint satisfies it. Use it with a ``uri`` that stays the same across runs (a
    long training job's checkpoints), so each run waits for a checkpoint the last one did not see.

    :param uri: the checkpoint URI a ``GpuJobOperator`` uses (``file://`` or ``s3://``; templated).
    :param min_step: succeed only on a step at least this (default 0: any).
    :param newer_than: succeed only on a step more than this: an integer step, ``"previous_run"``, or
        ``None`` (default: no bound). Templated: a template must render to digits, ``"previous_run"``
        or an empty string (no bound).
    :param aws_conn_id: Airflow AWS connection for ``s3://`` URIs (default ``aws_default``; a missing
        connection falls back to boto3's default credentials).
    :param deferrable: wait in the triggerer (default ``True``).
    :param poll_interval: seconds (or a timedelta) between reads of the storage (default 60; at most 3600).
    :return: (XCom) ``{"checkpoint": "<uri>/ckpt-...", "step": N}``
    """

    template_fields: Sequence[str] = ("uri", "newer_than")

    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        uri: str,
        min_step: int = 0,
        newer_than: int | str | None = None,
        aws_conn_id: str | None = "aws_default",
        deferrable: bool = True,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL_S,
        **kwargs: Any,
    ) -> None:
        if "poke_interval" in kwargs:
            raise TypeError("pass poll_interval=, not poke_interval=, to CheckpointSensor")
        if aws_conn_id is not None and not isinstance(aws_conn_id, str):
            raise TypeError(f"aws_conn_id={safe_repr(aws_conn_id)} must be an Airflow connection id (a string) or None")
        if not isinstance(deferrable, bool):
            raise TypeError(f"deferrable={safe_repr(deferrable)} must be True or False")
        if deferrable and kwargs.get("mode", "poke") != "poke":
            raise ValueError(f"mode={kwargs['mode']!r} applies only with deferrable=False")
        super().__init__(poke_interval=_poll_interval(poll_interval), **kwargs)
        if not is_templated(uri):
            validate_checkpoint_uri(uri, "uri")
        self.uri = uri
        self.min_step = _step(min_step, "min_step")
        self.newer_than = _newer_than(newer_than, rendered=False)
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable

    def _bound(self, context: Context) -> int | None:
        """``newer_than`` as a step, after rendering: ``"previous_run"`` is read from XCom here."""
        value = _newer_than(self.newer_than, rendered=True)
        if value != PREVIOUS_RUN:
            return value  # type: ignore[return-value]
        ti = context["ti"]
        seen = ti.xcom_pull(task_ids=self.task_id, include_prior_dates=True, map_indexes=ti.map_index)
        step = seen.get("step") if isinstance(seen, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            if seen is not None:
                self.log.warning(
                    "Ignoring this task's XCom from an earlier run: it holds no step (%s).", safe_repr(seen)
                )
            self.log.info("newer_than='previous_run': no earlier run of this task saw a checkpoint; any one will do.")
            return None
        self.log.info(
            "newer_than='previous_run': an earlier run of this task saw step %d (%s).", step, seen.get("checkpoint")
        )
        return step

    def _check(self, uri: str, newer_than: int | None) -> dict[str, Any] | None:
        from gpu_provider.backends.aws.calls import s3_client_for

        try:
            found = published_checkpoint(uri, s3_client=s3_client_for(uri, self.aws_conn_id))
        except Exception as err:
            raise CheckpointReadError(f"Could not read checkpoints at {uri}: {err}") from err
        wanted = lowest_step(self.min_step, newer_than)
        if found is None:
            self.log.info("No published checkpoint at %s yet.", uri)
            return None
        if found[1] < wanted:
            self.log.info("Newest checkpoint %s is at step %d; waiting for step %d.", found[0], found[1], wanted)
            return None
        self.log.info("Found checkpoint %s (step %d).", found[0], found[1])
        return {"checkpoint": found[0], "step": found[1]}

    def poke(self, context: Context) -> bool | PokeReturnValue:
        found = self._check(validate_checkpoint_uri(self.uri, "uri"), self._bound(context))
        return PokeReturnValue(is_done=True, xcom_value=found) if found else False

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        started = time.time()
        uri = validate_checkpoint_uri(self.uri, "uri")
        newer_than = self._bound(context)
        found = self._check(uri, newer_than)  # it may be there already: then no deferral at all
        if found is not None:
            return found
        self.log.info("Waiting for %s, at most %gs.", describe_wait(uri, self.min_step, newer_than), self.timeout)
        self.defer(
            trigger=CheckpointTrigger(
                uri=uri,
                min_step=self.min_step,
                newer_than=newer_than,
                aws_conn_id=self.aws_conn_id,
                poll_interval=self.poke_interval,
                end_time=started + self.timeout,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout + DEFER_TIMEOUT_SLACK_S),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if not isinstance(event, dict) or event.get("status") not in EVENT_STATUSES:
            raise CheckpointReadError(f"CheckpointSensor got an unexpected trigger event: {safe_repr(event)}")
        message = str(event.get("message", ""))
        if event["status"] == SUCCESS:
            self.log.info("%s", message)
            return {"checkpoint": event["checkpoint"], "step": event["step"]}
        if event["status"] == TIMEOUT:  # soft_fail turns this into a skip (BaseSensorOperator.resume_execution)
            self.log.warning("%s", message)
            raise AirflowSensorTimeout(message)
        raise CheckpointReadError(message)
