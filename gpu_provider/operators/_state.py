"""What a ``GpuJobOperator`` keeps outside itself: attempt records in the task state store, the newest
checkpoint to resume from, and the job's output on the asset events it emits."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from gpu_provider.backends.base import JobState
from gpu_provider.engine.attempts import reattached
from gpu_provider.engine.places import recover_at_start
from gpu_provider.names import STATE_KEY
from gpu_provider.records import AttemptRecord, AttemptSummary, dump_records, load_records, load_summary

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic import JsonValue

    from gpu_provider.backends.base import Backend, JobHandle, TaskKey


def found_line(backend_name: str, record: AttemptRecord, stored: bool) -> str:
    """What the task log says when a try's first step is an attempt an earlier try (or an earlier execution of
    this one) left live or succeeded; ``stored``: its record was in the task state store (else the backend's
    lookup found it)."""
    how = "in the task state store" if stored else "by the backend's lookup"
    then = f"it is {record.state.value}: watching it, not submitting a new one"
    if record.state is JobState.SUCCEEDED:
        then = "it already succeeded: returning its result"
    return f"{reattached(backend_name, record, how)}; {then}"


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


def attempts_at_start(
    context: Context, backend: Backend, task: TaskKey, rungs: Sequence[Backend], log: Any
) -> tuple[list[AttemptRecord], list[AttemptRecord], AttemptSummary | None]:
    """The task's attempts when ``execute()`` starts: what the backends' lookups find (on every rung's backend)
    and the task state store holds, the store read only where it can hold something and while the lookup runs
    where it may be (:func:`gpu_provider.engine.places.recover_at_start`). Returns the records, those read from
    the store, and the store's summary."""
    return recover_at_start(
        backend,
        task,
        lambda: stored_records(context, log),
        log,
        others=rungs,
        first_execution=first_execution(context),
        in_parallel=store_reads_in_parallel(),
    )


def first_execution(context: Context) -> bool:
    """Whether this ``execute()`` is the first execution of its task instance, so that the task state store
    can hold no attempt record of an earlier one: try 1, never rescheduled.

    Airflow 3.3 scopes the store by (dag_id, run_id, task_id, map_index), across tries; every later
    execution of a task instance runs under a higher try number (the scheduler adds one to it each time it
    schedules the task instance, after a failure, a retry or a clear; only a reschedule keeps it, and
    ``task_reschedule_count`` counts those), and a resume from a deferral enters ``next_method``, not
    ``execute()``. The lines of Airflow this rests on are in the docs (explanations, reattach);
    ``tests/operators/test_first_execution.py`` checks them against the installed Airflow.
    """
    ti = context.get("ti")
    try_number = getattr(ti, "try_number", None)
    return isinstance(try_number, int) and try_number == 1 and not context.get("task_reschedule_count")


def store_reads_in_parallel() -> bool:
    """Whether the task state store may be read from a thread while the task talks to the services.

    Airflow's task runner sends its messages to the supervisor through a ``CommsDecoder``, which holds a
    lock around each request and its answer, so a read from another thread waits its turn. ``dag.test()``
    replaces it with an in-process stand-in without a lock (it also unsets the runner's comms while it
    answers), where two threads could take each other's answers: there the store is read first, alone.
    """
    task_runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
    if comms is None:  # not under Airflow's task runner: the store is the caller's own
        return True
    from airflow.sdk.execution_time.comms import CommsDecoder

    return isinstance(comms, CommsDecoder)


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


def task_key(context: Context) -> TaskKey:
    """The identity of the task instance running in ``context`` (dag, task, run, map index)."""
    from gpu_provider.backends.base import TaskKey

    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    map_index = -1 if map_index is None else int(map_index)
    return TaskKey(dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=map_index)


def publish_links(context: Context, backend: Backend, handle: JobHandle, known: str | None) -> str | None:
    """Point the task's "GPU job" buttons at the attempt's console and log; returns the log link now shown."""
    from gpu_provider.links.gpu_job import CONSOLE_URL_XCOM_KEY

    url = backend.console_url(handle)
    if url:
        context["ti"].xcom_push(key=CONSOLE_URL_XCOM_KEY, value=url)
    return publish_log_link(context, backend.logs_url(handle), known)


def publish_log_link(context: Context, url: str | None, known: str | None) -> str | None:
    """Point the "GPU job logs" button at ``url`` (the newest known place of the attempt's log) unless it
    shows ``known`` already; returns the link now shown."""
    from gpu_provider.links.gpu_job import LOGS_URL_XCOM_KEY

    if url and url != known:
        context["ti"].xcom_push(key=LOGS_URL_XCOM_KEY, value=url)
        return url
    return known
