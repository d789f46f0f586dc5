"""The Kubernetes backend's API client and its calls.

The client comes from the cncf-kubernetes provider's ``KubernetesHook`` and its Airflow connection
(in-cluster, a kubeconfig file or one held in the connection's extras); ``kubernetes`` is imported
only when the first client is built. Calls answer the API's JSON as plain dicts
(``_preload_content=False``): no model classes, and a field a newer server adds is never dropped.

Throttling (HTTP 429, the API server's priority and fairness) and server errors are retried with
full-jitter backoff within a bound, as the Batch backend's calls are.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpu_provider.exceptions import GpuBackendThrottledError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: tries of a status read before it is reported as throttled (the watch reads again next tick)
POLL_ATTEMPTS = 4
#: tries of a call outside the wait loop (create, lookups, cancel, marks)
PATIENT_ATTEMPTS = 8
BASE_DELAY_S = 0.2
MAX_DELAY_S = 5.0
#: seconds one HTTP request may take (connect, read)
REQUEST_TIMEOUT = (10, 60)


def status_of(err: BaseException) -> int:
    """The HTTP status of a ``kubernetes`` ``ApiException`` (0 for anything else)."""
    is_api = any(cls.__name__ == "ApiException" for cls in type(err).__mro__)
    return int(getattr(err, "status", 0) or 0) if is_api else 0


def is_retryable(err: BaseException) -> bool:
    status = status_of(err)
    return status == 429 or status >= 500


def call(what: str, fn: Callable[[], T], *, attempts: int = PATIENT_ATTEMPTS) -> T:
    """Run one API call, backing off while the API server throttles it or answers 5xx."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            if not is_retryable(err):
                raise
            if attempt == attempts:
                raise GpuBackendThrottledError(
                    f"the Kubernetes API server answered {what} with HTTP {status_of(err)} {attempts} times in a "
                    "row; will try again"
                ) from err
            delay = random.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2**attempt))
            log.debug("%s: HTTP %s; retrying in %.2fs", what, status_of(err), delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class Api:
    """The ``kubernetes`` API objects of one backend, built on first use from the Airflow connection.

    A build never waits for another (``cancel()`` may run in a signal handler that interrupted a
    build): the loser builds its own, uncached.
    """

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self._lock = threading.Lock()
        self._apis: tuple[Any, Any] | None = None

    def _build(self) -> tuple[Any, Any]:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from kubernetes import client

        api_client = KubernetesHook(conn_id=self.conn_id).get_conn()
        return client.CoreV1Api(api_client), client.BatchV1Api(api_client)

    def _get(self) -> tuple[Any, Any]:
        apis = self._apis
        if apis is not None:
            return apis
        if not self._lock.acquire(blocking=False):
            return self._build()
        try:
            if self._apis is None:
                self._apis = self._build()
            return self._apis
        finally:
            self._lock.release()

    @property
    def core(self) -> Any:
        return self._get()[0]

    @property
    def batch(self) -> Any:
        return self._get()[1]


def raw(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a ``kubernetes`` API method and answer its JSON body as a dict."""
    response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    try:
        data = response.data
    finally:
        response.release_conn()
    return json.loads(data) if data else {}


def exists(fn: Callable[[], Any]) -> bool:
    """Run ``fn``; ``False`` when the API answered 404 (the object is gone), ``True`` otherwise."""
    try:
        fn()
    except Exception as err:
        if status_of(err) == 404:
            return False
        raise
    return True


def read_log(api: Api, pod: str, namespace: str, query: list[tuple[str, Any]]) -> bytes:
    """One read of a pod's log (``GET .../pods/<pod>/log``) with the query given as is: the ``kubernetes``
    client's ``read_namespaced_pod_log`` has no ``sinceTime``. The answer is bounded by the caller's
    ``limitBytes`` or ``tailLines``."""
    response = api.core.api_client.call_api(
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
        "GET",
        {"name": pod, "namespace": namespace},
        query,
        {"Accept": "text/plain"},
        auth_settings=["BearerToken"],  # no response type: the raw answer is read (_preload_content=False)
        _return_http_data_only=True,
        _preload_content=False,
        _request_timeout=REQUEST_TIMEOUT,
    )
    try:
        return bytes(response.data or b"")
    finally:
        response.release_conn()
