"""A minimal client of Airflow 3's REST API (``/api/v2``), over HTTP with the standard library.

The reaper (:mod:`gpu_provider.spend.reaper`), the pool sync (:mod:`gpu_provider.quotas.pools`) and the CLI use
it; it knows no Airflow internals and touches no metadata database.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_provider.backends.base import TaskKey


class AirflowApiError(Exception):
    """Airflow's REST API could not answer (unreachable, refused, an unexpected status, an answer
    that is not Airflow's)."""


#: what ``GET /api/v2/version`` must answer: Airflow 3's version endpoint
_AIRFLOW_3_VERSION = re.compile(r"3\.\d+(\.\d+)?([.+\-a-z0-9]*)?", re.IGNORECASE)


def _is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() in ("application/json", "application/problem+json")


def _snippet(body: bytes) -> str:
    text = body[:300].decode(errors="replace").strip().replace("\n", " ")
    return text if len(body) <= 300 else text + "..."


class AirflowApi:
    """A minimal client of Airflow 3's REST API (``/api/v2``).

    :param base_url: the API server, e.g. ``http://airflow-api:8080``
    :param username: with ``password``, exchanged for a JWT at ``/auth/token`` (simple auth manager
        and FAB both serve it); neither: requests go without a token
    :param token: a ready JWT (``Authorization: Bearer``), instead of a user and password
    """

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: the URL as messages show it (without any user:password@ written into it)
        self.shown_url = re.sub(r"//[^/@]*@", "//", self.base_url)
        self._username = username
        self._password = password
        self._token = token
        self.timeout = timeout

    @classmethod
    def from_connection(cls, conn_id: str) -> AirflowApi:
        """From an Airflow connection: host (with scheme, or ``schema`` as the scheme), port, login,
        password, or ``extra={"token": "..."}``."""
        from gpu_provider.connections import get_connection

        conn = get_connection(conn_id)
        host = str(conn.host or "").strip()
        if not host:
            raise ValueError(f"Airflow connection {conn_id!r} has no host: set it to the Airflow API server's URL")
        if "://" not in host:
            host = f"{conn.schema or 'http'}://{host}"
        if conn.port:
            host = f"{host}:{conn.port}"
        extra = conn.extra_dejson or {}
        return cls(host, username=conn.login or None, password=conn.password or None, token=extra.get("token"))

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token is None and self._username and self._password:
            # any failure here (a 404 included) is an error: no answer of /auth/token says an object is gone
            try:
                answer = self._request("POST", "/auth/token", {"username": self._username, "password": self._password})
                self._token = str(answer["access_token"])
            except urllib.error.HTTPError as err:
                raise AirflowApiError(
                    f"Airflow API at {self.shown_url}: POST /auth/token answered HTTP {err.code} {err.reason} "
                    f"({err.headers.get('Content-Type') or 'no content type'}); no token, so no task instance "
                    "could be asked about"
                ) from err
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise AirflowApiError(
                    f"Airflow API at {self.shown_url}: POST /auth/token gave no token: {type(err).__name__}: {err}"
                ) from err
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def check_identity(self) -> str:
        """Make sure ``base_url`` is Airflow 3's API and a token can be had; return Airflow's version.

        ``GET /api/v2/version`` must answer 200 with a JSON object whose ``version`` is 3.x (a wrong
        base URL, a proxy's page, a missing path prefix or an Airflow 2 server do not); then the token
        is fetched (user and password), so a failing ``/auth/token`` is found here, once per pass.

        :raises AirflowApiError: naming what was answered instead
        """
        url = self.base_url + "/api/v2/version"
        headers = {"Accept": "application/json"}
        if self._token:  # a ready token goes along (a proxy may want one even where Airflow does not)
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, method="GET", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body, content_type = response.read(65536), response.headers.get("Content-Type")
        except urllib.error.HTTPError as err:
            body = err.read(2000)
            raise AirflowApiError(
                f"Airflow API at {self.shown_url} is not Airflow 3's: GET /api/v2/version answered HTTP {err.code} "
                f"{err.reason} ({err.headers.get('Content-Type') or 'no content type'}: {_snippet(body)!r}). "
                "Check the connection's host, port and path prefix (an Airflow 2 server has no /api/v2)"
            ) from err
        except (OSError, ValueError) as err:
            raise AirflowApiError(f"Airflow API at {self.shown_url} could not be reached: {err}") from err
        try:
            answer = json.loads(body) if _is_json(content_type) else None
        except ValueError:
            answer = None
        version = answer.get("version") if isinstance(answer, dict) else None
        if not isinstance(version, str) or not _AIRFLOW_3_VERSION.fullmatch(version):
            raise AirflowApiError(
                f"Airflow API at {self.shown_url} is not Airflow 3's: GET /api/v2/version answered "
                f"{content_type or 'no content type'} {_snippet(body)!r}, not a JSON object with a 3.x 'version'. "
                "Check the connection's host, port and path prefix"
            )
        self._headers()
        return version

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers=headers or {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read() or b"null")

    def get(self, path: str, *, object_id: str | None = None) -> Any | None:
        """GET ``/api/v2<path>``; ``None`` only for Airflow's own "not found".

        A 404 means "no such object" only when its body is Airflow's: JSON with a ``detail`` that
        says "not found" and names ``object_id`` (the DAG id; Airflow's answer for an unknown route,
        ``{"detail": "Not Found"}``, names nothing). Any other 404 (an HTML page from a proxy, a
        wrong path prefix) is an :class:`AirflowApiError`.
        """
        try:
            return self._request("GET", "/api/v2" + path, headers=self._headers())
        except urllib.error.HTTPError as err:
            body = err.read(2000)
            content_type = err.headers.get("Content-Type")
            if err.code == 404 and _airflow_not_found(body, content_type, object_id):
                return None
            unsure = "; not Airflow's own 'not found' for this object, so nothing is taken as deleted"
            raise AirflowApiError(
                f"Airflow API GET {path} answered HTTP {err.code} {err.reason} "
                f"({content_type or 'no content type'}): {_snippet(body)}" + (unsure if err.code == 404 else "")
            ) from err
        except (OSError, ValueError) as err:
            raise AirflowApiError(f"Airflow API GET {path} failed: {err}") from err

    def send(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """``method`` ``/api/v2<path>`` with a JSON body; any HTTP error is an :class:`AirflowApiError`."""
        try:
            return self._request(method, "/api/v2" + path, body, headers=self._headers())
        except urllib.error.HTTPError as err:
            detail = err.read(2000).decode(errors="replace").strip()
            raise AirflowApiError(
                f"Airflow API {method} {path} answered HTTP {err.code} {err.reason}: {detail}"
            ) from err
        except (OSError, ValueError) as err:
            raise AirflowApiError(f"Airflow API {method} {path} failed: {err}") from err

    def task_instance(self, task: TaskKey) -> dict[str, Any] | None:
        q = urllib.parse.quote
        run = f"/dags/{q(task.dag_id, safe='')}/dagRuns/{q(task.run_id, safe='')}"
        path = f"{run}/taskInstances/{q(task.task_id, safe='')}"
        if task.map_index >= 0:
            path += f"/{task.map_index}"
        found = self.get(path, object_id=task.dag_id)
        if found is not None and not isinstance(found, dict):
            raise AirflowApiError(f"Airflow API GET {path} answered {found!r}, not a task instance")
        return found

    def dag_run(self, task: TaskKey) -> dict[str, Any] | None:
        """The task's DAG run; ``None`` only when Airflow says it does not exist."""
        q = urllib.parse.quote
        path = f"/dags/{q(task.dag_id, safe='')}/dagRuns/{q(task.run_id, safe='')}"
        found = self.get(path, object_id=task.dag_id)
        if found is not None and not isinstance(found, dict):
            raise AirflowApiError(f"Airflow API GET {path} answered {found!r}, not a DAG run")
        return found

    def dag_exists(self, dag_id: str) -> bool:
        """Whether Airflow knows the DAG (``False`` only on Airflow's own "not found")."""
        return self.get(f"/dags/{urllib.parse.quote(dag_id, safe='')}", object_id=dag_id) is not None

    def dag_run_state(self, task: TaskKey) -> str | None:
        found = self.dag_run(task)
        return str(found.get("state")) if found is not None else None


def _airflow_not_found(body: bytes, content_type: str | None, object_id: str | None) -> bool:
    """Whether a 404's body is Airflow 3's answer for a missing object (see :meth:`AirflowApi.get`)."""
    if not _is_json(content_type) or not object_id:
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    detail = answer.get("detail") if isinstance(answer, dict) else None
    return isinstance(detail, str) and "not found" in detail.lower() and object_id in detail
