"""The Kubernetes backend's API client and its calls.

The client comes from the cncf-kubernetes provider's ``KubernetesHook`` and its Airflow connection
(in-cluster, a kubeconfig file or one held in the connection's extras); ``kubernetes`` is imported
only when the first client is built. Calls answer the API's JSON as plain dicts
(``_preload_content=False``): no model classes, and a field a newer server adds is never dropped.

Throttling (HTTP 429, the API server's priority and fairness) and server errors are retried with
full-jitter backoff within a bound, as the Batch backend's calls are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpu_provider.backends.common import keep_bounded
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


#: how long a process shares the API objects built from one connection and kubeconfig: a token fetched by a
#: kubeconfig ``exec`` plugin (EKS: 15 minutes) is loaded when they are built, so no shared client gets old
SHARED_API_TTL_S = 300.0
#: most API object pairs kept for the process
SHARED_APIS_KEPT = 16
_SHARED_APIS: dict[str, tuple[float, tuple[Any, Any]]] = {}
_SHARED_LOCK = threading.Lock()
#: the in-cluster service account token (rotated by the kubelet: a new token is a new client)
_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _source_hash(hook: Any) -> str | None:
    """A hash of what the hook builds its client from: the connection's fields, the ``KUBECONFIG`` and
    ``KUBERNETES_*`` environment and the bytes of the kubeconfig files and the service account token it may
    read; ``None`` (nothing shared) when the connection cannot be read."""
    try:
        conn = hook.get_connection(hook.conn_id) if hook.conn_id else None
        extras = conn.extra_dejson if conn is not None else {}
    except Exception:
        return None
    fields = (
        None
        if conn is None
        else (conn.conn_type, conn.host, conn.login, conn.password, conn.schema, conn.port, conn.extra)
    )
    paths = [extras.get("kube_config_path") or extras.get("extra__kubernetes__kube_config_path") or ""]
    paths += os.environ.get("KUBECONFIG", "").split(os.pathsep)
    paths += [os.path.expanduser("~/.kube/config"), _TOKEN_FILE]
    digest = hashlib.sha256(repr(fields).encode())
    for path in paths:
        digest.update(b"\0" + path.encode())
        if path:
            with contextlib.suppress(OSError), open(path, "rb") as f:
                digest.update(f.read(4 * 1024 * 1024))
    env = sorted((k, v) for k, v in os.environ.items() if k == "KUBECONFIG" or k.startswith("KUBERNETES_"))
    digest.update(repr(env).encode())
    return digest.hexdigest()


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
        """The API objects the process built from the same connection and kubeconfig in the last
        :data:`SHARED_API_TTL_S` seconds (a worker builds a backend object per task), else new ones."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
        from kubernetes import client

        hook = KubernetesHook(conn_id=self.conn_id)
        key = _source_hash(hook)
        shared = _SHARED_APIS.get(key) if key else None  # a plain dict read: no lock (a signal handler may be here)
        if shared is not None and time.monotonic() - shared[0] < SHARED_API_TTL_S:
            return shared[1]
        api_client = hook.get_conn()
        apis = (client.CoreV1Api(api_client), client.BatchV1Api(api_client))
        if key and _SHARED_LOCK.acquire(blocking=False):  # never wait: keep them next time instead
            try:
                keep_bounded(_SHARED_APIS, key, (time.monotonic(), apis), limit=SHARED_APIS_KEPT)
            finally:
                _SHARED_LOCK.release()
        return apis

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
