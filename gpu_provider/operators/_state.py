"""What a ``GpuJobOperator`` keeps outside itself: attempt records in the task state store, the newest
checkpoint to resume from, and the job's output on the asset events it emits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from gpu_provider.names import STATE_KEY
from gpu_provider.records import AttemptRecord, AttemptSummary, dump_records, load_records, load_summary

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic import JsonValue

    from gpu_provider.backends.base import Backend


def stored_records(context: Context, log: Any) -> tuple[list[AttemptRecord], AttemptSummary | None]:
    """The attempt records in the task state store, and the summary of those folded out of them."""
    store = context.get("task_state_store")
    if store is None:
        return [], None
    try:
        data = store.get(STATE_KEY)
        return load_records(data), load_summary(data)
    except Exception as err:  # the store is an optimisation; the backend lookup still works
        log.warning("Could not read the task state store (%s); asking the backend instead.", err)
        return [], None


def persist_records(context: Context, records: list[AttemptRecord], summary: AttemptSummary | None, log: Any) -> None:
    """Save the attempt records in the task state store (a failure is logged: the backend's lookup still works)."""
    store = context.get("task_state_store")
    if store is None:
        return
    try:
        store.set(STATE_KEY, cast("JsonValue", dump_records(records, summary)))
    except Exception as err:  # reattach still works through the backend's lookup
        log.warning("Could not save attempts to the task state store (%s).", err)


def describe_outlets(outlets: Iterable[Any], context: Context, result: dict[str, Any]) -> None:
    """Put the job's declared output in the extra of each asset event this task emits (its ``outlets``),
    so a DAG scheduled on the asset finds the new data: ``{"output_uri": ...}``."""
    from airflow.sdk import Asset

    events = context.get("outlet_events")
    if not result.get("output_uri") or events is None:
        return
    for outlet in outlets:
        if isinstance(outlet, Asset):
            events[outlet].extra["output_uri"] = str(result["output_uri"])


def latest_checkpoint(backend: Backend, uri: str | None) -> str | None:
    """The newest complete checkpoint at ``uri`` (S3 through the backend's AWS connection, or aws_default)."""
    if not uri:
        return None
    from gpu_provider.backends.aws.calls import s3_client_for
    from gpu_provider.runtime.checkpoint import latest_checkpoint as newest

    return newest(uri, s3_client=s3_client_for(uri, getattr(backend, "aws_conn_id", None)))
