"""A small HTTP server that answers as Airflow 3's REST API does for the reaper's reads, and the
shapes a reaper must not mistake for it (a proxy's HTML 404, an Airflow 2 server, a missing path
prefix, a token endpoint that answers 404).

Task instances by ``dag_id`` (``tis``): a state, ``None`` (no state yet), ``"404"`` (Airflow's own
not-found) or ``"500"``. DAG runs by ``dag_id`` (``runs``): a state, or ``"404"`` (deleted). DAGs in
``dags_gone`` answer Airflow's not-found. Every request's method and path is kept in ``paths``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "jwt-for-the-reaper"
USER = {"username": "reaper", "password": "s3cret"}

#: what each shape answers
AIRFLOW_3 = "airflow3"
#: Airflow 3 behind ``/airflow``, asked without the prefix (a wrong base URL): FastAPI's route 404s
MISSING_PREFIX = "missing_prefix"
#: a proxy in front that passes the version and token endpoints and answers 404 pages in HTML to the rest
PROXY_HTML_404 = "proxy_html_404"
#: a proxy that answers every request with its own HTML 404 page
PROXY_HTML_ALL = "proxy_html_all"
#: Airflow 3, but ``/auth/token`` answers 404
TOKEN_404 = "token_404"
#: an Airflow 2 server: ``/api/v1`` only, connexion's problem+json 404 for anything else, no ``/auth/token``
AIRFLOW_2 = "airflow2"
#: an Airflow-2-shaped API that answers ``/api/v2/version`` with a 2.x version
AIRFLOW_2_VERSION = "airflow2_version"

HTML_404 = b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>"


class FakeAirflowApi(ThreadingHTTPServer):
    def __init__(self, shape: str = AIRFLOW_3) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.shape = shape
        self.tis: dict[str, Any] = {}
        self.runs: dict[str, str] = {}
        self.dags_gone: set[str] = set()
        self.paths: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def gets(self) -> list[str]:
        with self.lock:
            return [p for p in self.paths if p.startswith("GET ")]


class _Handler(BaseHTTPRequestHandler):
    server: FakeAirflowApi

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route_404(self) -> None:
        if self.server.shape == AIRFLOW_2 or self.server.shape == AIRFLOW_2_VERSION:
            problem = {
                "detail": "The requested URL was not found on the server. If you entered the URL manually please "
                "check your spelling and try again.",
                "status": 404,
                "title": "Not Found",
                "type": "about:blank",
            }
            self._send(404, problem, "application/problem+json")
        elif self.server.shape in (PROXY_HTML_404, PROXY_HTML_ALL):
            self._send(404, HTML_404, "text/html")
        else:
            self._send(404, {"detail": "Not Found"})  # FastAPI's answer for an unknown route

    def _path(self) -> str | None:
        """The path as Airflow 3 sees it, ``None`` when this shape routes it nowhere."""
        shape, path = self.server.shape, self.path
        if shape == PROXY_HTML_ALL:
            return None
        if shape == MISSING_PREFIX:
            return path.removeprefix("/airflow") if path.startswith("/airflow/") else None
        if shape in (AIRFLOW_2, AIRFLOW_2_VERSION):
            if shape == AIRFLOW_2_VERSION and path == "/api/v2/version":
                return path
            return path if path == "/api/v1/version" else None
        return path

    def do_POST(self) -> None:
        with self.server.lock:
            self.server.paths.append(f"POST {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        path = self._path()
        if path is None or self.server.shape == TOKEN_404 or self.server.shape in (AIRFLOW_2, AIRFLOW_2_VERSION):
            self._route_404()
        elif path == "/auth/token" and body == USER:
            self._send(201, {"access_token": TOKEN})
        else:
            self._send(401, {"detail": "Invalid credentials"})

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(f"GET {self.path}")
        path = self._path()
        if path is None:
            self._route_404()
            return
        if path == "/api/v1/version":
            self._send(200, {"version": "2.10.5", "git_version": None})
            return
        if path == "/api/v2/version":
            version = "2.10.5" if self.server.shape == AIRFLOW_2_VERSION else "3.3.2"
            self._send(200, {"version": version, "git_version": None})
            return
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, {"detail": "Not authenticated"})
            return
        if self.server.shape == PROXY_HTML_404:
            self._route_404()
            return
        parts = path.split("/")  # /api/v2/dags/<dag>[/dagRuns/<run>[/taskInstances/<task>[/<map>]]]
        if len(parts) < 5 or parts[:4] != ["", "api", "v2", "dags"]:
            self._route_404()
            return
        dag_id = parts[4]
        if len(parts) == 5:
            if dag_id in self.server.dags_gone:
                self._send(404, {"detail": f"The Dag with ID: `{dag_id}` was not found"})
            else:
                self._send(200, {"dag_id": dag_id})
            return
        if len(parts) == 7:
            state = self.server.runs.get(dag_id, "success")
            if state == "404":
                self._send(
                    404, {"detail": f"The DagRun with dag_id: `{dag_id}` and run_id: `{parts[6]}` was not found"}
                )
            else:
                self._send(200, {"dag_id": dag_id, "dag_run_id": parts[6], "state": state})
            return
        state = self.server.tis.get(dag_id, "404")
        if state == "404":
            self._send(
                404,
                {
                    "detail": f"The Task Instance with dag_id: `{dag_id}`, run_id: `{parts[6]}` and task_id: "
                    f"`{parts[8]}` was not found"
                },
            )
        elif state == "500":
            self._send(500, {"detail": "database is locked"})
        else:
            self._send(200, {"state": state, "try_number": 1})


@contextmanager
def serving(shape: str = AIRFLOW_3) -> Iterator[FakeAirflowApi]:
    """A running :class:`FakeAirflowApi` of ``shape``, shut down on exit."""
    server = FakeAirflowApi(shape)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
