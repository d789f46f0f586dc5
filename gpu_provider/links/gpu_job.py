"""Extra link from a task to its GPU job in the backend's console."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

#: XCom key under which the operator records the latest attempt's console URL
CONSOLE_URL_XCOM_KEY = "gpu_job_console_url"


class GpuJobConsoleLink(BaseOperatorLink):
    """ "GPU job" button: the latest attempt in its backend's console (Batch, SageMaker, k8s, local log)."""

    name = "GPU job"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        url = XCom.get_value(key=CONSOLE_URL_XCOM_KEY, ti_key=ti_key)
        return str(url) if url else ""
