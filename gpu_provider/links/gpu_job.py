"""Extra link from a task to its GPU job in the backend's console."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

#: XCom key of the link (Airflow's ``_link_<class>`` convention): the operator writes the latest
#: attempt's URL there when it submits or reattaches, so the link works while the job runs, and
#: Airflow's own end-of-task link refresh (``get_link``) keeps it.
CONSOLE_URL_XCOM_KEY = "_link_GpuJobConsoleLink"
#: XCom key of the log link: the log group view at submit, the attempt's own stream once known
LOGS_URL_XCOM_KEY = "_link_GpuJobLogsLink"


def _stored_link(key: str, ti_key: TaskInstanceKey) -> str:
    from airflow.sdk.execution_time.xcom import XCom

    url = XCom.get_value(key=key, ti_key=ti_key)
    return str(url) if url else ""


class GpuJobConsoleLink(BaseOperatorLink):
    """ "GPU job" button: the latest attempt in its backend's console (Batch, SageMaker, k8s, local log)."""

    name = "GPU job"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return _stored_link(CONSOLE_URL_XCOM_KEY, ti_key)


class GpuJobLogsLink(BaseOperatorLink):
    """ "GPU job logs" button: the latest attempt's log where the backend keeps it (e.g. CloudWatch)."""

    name = "GPU job logs"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return _stored_link(LOGS_URL_XCOM_KEY, ti_key)
