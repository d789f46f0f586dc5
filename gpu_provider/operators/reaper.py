"""``GpuReaperOperator``: stop GPU jobs this provider started that no live Airflow task waits for.

A thin adapter over :func:`gpu_provider.spend.reaper.reap`: it resolves the backends and the
Airflow API connection, runs one pass, logs the report and returns it to XCom. Schedule it every
few minutes (``dags/gpu_reaper.py`` runs it every 15).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from gpu_provider.backends.base import Backend, provider_config, resolve_backend
from gpu_provider.job import to_bool, to_seconds
from gpu_provider.spend.scope import backend_list, installed_backends

if TYPE_CHECKING:
    from airflow.sdk import Context

#: the Airflow connection of the REST API the reaper asks (``[gpu_provider] reaper_airflow_conn_id``)
DEFAULT_AIRFLOW_CONN_ID = "airflow_api"


class GpuReaperOperator(BaseOperator):
    """Stop the GPU jobs of task instances that are no longer live (see :mod:`gpu_provider.spend.reaper`).

    :param backends: the backends to sweep: backend objects, names or mappings as ``backend=`` takes
        them (default: ``[gpu_provider] reaper_backends``, a JSON list, else every registered backend
        whose extra is installed, with its configured options; each pass logs the ones skipped and why).
    :param airflow_conn_id: the Airflow connection of Airflow's own REST API (host, port, and a user
        and password exchanged for a token, or ``extra={"token": ...}``); default
        ``[gpu_provider] reaper_airflow_conn_id``, else ``airflow_api``.
    :param dry_run: report what would be stopped, stop nothing (default ``[gpu_provider]
        reaper_dry_run``, else ``True``: a first install only reports until you turn it off).
    :param grace_period: a job submitted less than this long ago is never stopped (timedelta or
        seconds; default ``[gpu_provider] reaper_grace_period``, else 600 s).

    The task fails when Airflow's API cannot be confirmed as Airflow 3's (or gives no token): that
    pass stops nothing. Errors about single jobs are logged and returned in the report's ``errors``.
    """

    ui_color = "#f0d6c9"
    # ``dry_run`` is BaseOperator's method: the flag is kept as ``report_only``

    def __init__(
        self,
        *,
        backends: Sequence[Backend | str | Mapping[str, Any]] | str | None = None,
        airflow_conn_id: str | None = None,
        dry_run: bool | str | None = None,
        grace_period: timedelta | float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        named = backend_list(backends)
        #: registered backends left out of the default sweep, and why (logged by each pass)
        self.skipped_backends: dict[str, str] = {}
        if named is None:
            self.backends, self.skipped_backends = installed_backends()
        else:
            self.backends = [resolve_backend(b) for b in named]
        conn_id = airflow_conn_id or provider_config("reaper_airflow_conn_id") or DEFAULT_AIRFLOW_CONN_ID
        if not isinstance(conn_id, str):
            raise TypeError(f"airflow_conn_id={airflow_conn_id!r} must be a connection id (a string)")
        self.airflow_conn_id = conn_id
        if dry_run is None:
            dry_run = provider_config("reaper_dry_run") or True
        self.report_only = to_bool("dry_run", dry_run)
        if grace_period is None:
            configured = provider_config("reaper_grace_period")
            grace_period = float(configured) if configured else None
        from gpu_provider.spend.reaper import DEFAULT_GRACE_PERIOD_S

        seconds = to_seconds("grace_period", grace_period)
        self.grace_period_s = DEFAULT_GRACE_PERIOD_S if seconds is None else seconds

    def execute(self, context: Context) -> dict[str, Any]:
        from gpu_provider.airflow_api import AirflowApi, AirflowApiError
        from gpu_provider.spend.reaper import reap

        for name, why in sorted(self.skipped_backends.items()):
            self.log.warning("Not sweeping the %s backend: %s.", name, why)
        api = AirflowApi.from_connection(self.airflow_conn_id)
        report = reap(self.backends, api, dry_run=self.report_only, grace_period_s=self.grace_period_s)
        verb = "Would stop" if self.report_only else "Stopped"
        for verdict in report.to_stop:
            rate = f"${verdict.usd_per_hour:.2f}/h" if verdict.usd_per_hour is not None else "cost unknown"
            outcome = verb if self.report_only or verdict.stopped else "Could not stop"
            handle = verdict.job.handle
            self.log.warning(
                "%s %s job %s (%s, %s): %s.", outcome, handle.backend, handle.name, handle.job_id, rate, verdict.why
            )
        for verdict in report.kept:
            self.log.info("Kept %s job %s: %s.", verdict.job.handle.backend, verdict.job.handle.name, verdict.why)
        for error in report.errors:
            self.log.error("%s", error)
        self.log.info(
            "Reaper %s: %d job(s) to stop, billing about $%.2f per hour; %d kept; %d error(s). %s",
            "dry run" if self.report_only else "pass",
            len(report.to_stop),
            report.usd_per_hour(),
            len(report.kept),
            len(report.errors),
            "Nothing was stopped (dry_run=True)." if self.report_only else "",
        )
        if report.api_error is not None:
            # the pass could not tell a live owner from a deleted one: fail, so a misconfigured reaper is seen
            raise AirflowApiError(
                f"The reaper stopped nothing: {report.api_error}. Fix connection {self.airflow_conn_id!r} "
                "(Airflow 3's API server: scheme, host, port and any path prefix, and a user that can get a token)."
            )
        return report.to_dict()
