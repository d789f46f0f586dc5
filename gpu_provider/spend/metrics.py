"""Per-attempt spend metrics through Airflow's own stats client (StatsD or OpenTelemetry, as the
``[metrics]`` section configures it).

Emitted once per attempt when it ends, tagged ``team`` (``none`` without ``team=``), ``backend``
and ``capacity``:

- ``gpu_provider.gpu_hours`` (counter): GPU-hours the attempt held;
- ``gpu_provider.cost_usd`` (counter): its estimated cost (not sent when no price is known);
- ``gpu_provider.interruptions`` (counter): 1 for an attempt that was interrupted, plus the restarts
  the service absorbed inside it;
- ``gpu_provider.queue_wait_seconds`` (gauge): seconds from submission to start.

StatsD carries tags only in a tagged dialect: ``[metrics] statsd_influxdb_enabled = True``
(``name,team=a,backend=batch:1|c``) or ``statsd_datadog_enabled``; OpenTelemetry carries them as
attributes.
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_provider.records import AttemptRecord

log = logging.getLogger(__name__)

GPU_HOURS = "gpu_provider.gpu_hours"
COST_USD = "gpu_provider.cost_usd"
INTERRUPTIONS = "gpu_provider.interruptions"
QUEUE_WAIT_SECONDS = "gpu_provider.queue_wait_seconds"


def _stats() -> Any:
    """Airflow's stats module, set up from ``[metrics]`` when the task runner has not done it
    (``dag.test()`` and ``airflow tasks test`` run tasks without it)."""
    import sys

    from airflow.sdk.observability import stats

    shared = sys.modules[stats.Stats.__module__]
    if getattr(shared, "_factory", None) is None:
        from airflow.configuration import conf
        from airflow.sdk.observability.metrics import stats_utils

        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=False),
        )
    return stats


def emit_attempt(record: AttemptRecord, *, team: str | None, backend: str) -> None:
    """Send one ended attempt's figures; a metrics failure is logged, never raised."""
    tags = {"team": team or "none", "backend": backend, "capacity": record.capacity}
    try:
        stats = _stats()
        stats.incr(GPU_HOURS, count=record.gpu_hours, tags=tags)  # type: ignore[arg-type]  # statsd takes floats
        if record.cost_usd is not None:
            stats.incr(COST_USD, count=round(record.cost_usd, 6), tags=tags)  # type: ignore[arg-type]
        interruptions = (1 if record.interruption else 0) + record.restarts
        if interruptions:
            stats.incr(INTERRUPTIONS, count=interruptions, tags=tags)
        if record.queue_wait_s is not None:
            stats.gauge(QUEUE_WAIT_SECONDS, round(record.queue_wait_s, 3), tags=tags)
    except Exception as err:  # metrics must never fail a task
        log.warning("Could not send the spend metrics of job %s: %s", record.job_id, err)
