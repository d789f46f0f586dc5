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
    """The URL the operator stored under ``key``, or "" when it stored none.

    No link is normal: a task that failed before submitting has none, and a backend without a log
    view never writes the logs link. ``XCom.get_value`` on an absent key makes the supervisor log
    "XCom not found" at error level, so the key is first looked up with ``get_all``, which answers
    an absent key with ``None`` quietly.

    :param key: the link's XCom key.
    :param ti_key: the task instance whose link is asked for.
    """
    from airflow.sdk.execution_time.xcom import XCom

    found = XCom.get_all(key=key, dag_id=ti_key.dag_id, task_id=ti_key.task_id, run_id=ti_key.run_id)
    if not found:
        return ""
    # an unmapped task has one value; a mapped one has one per map index that stored one (position != index)
    url = found[0] if ti_key.map_index < 0 else XCom.get_value(key=key, ti_key=ti_key)
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
