"""The Kubernetes emulator's HTTP side: the paths of the API it serves, each request parsed, recorded in the
request log (throttled where a fault says so) and answered as JSON, and watches streamed in chunks."""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from gpu_provider.testing.emulators.kubernetes_store import ApiError, _public

if TYPE_CHECKING:
    from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator


class _Server(ThreadingHTTPServer):
    """A thread per connection, as the API server serves many clients at once."""

    daemon_threads = True
    #: connections waiting to be accepted: a burst of new ones (KubernetesPodTrigger opens one per read)
    #: waits instead of being refused, as with a real API server (the standard library's default is 5)
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # the client went away before its answer (a stopped process): nothing to report
        super().handle_error(request, client_address)


_PATH = re.compile(
    r"/(?:api/v1|apis/batch/v1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<kind>pods|jobs|services|events|nodes)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>log|status))?"
)


class _Handler(BaseHTTPRequestHandler):
    emulator: KubernetesEmulator
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        match = _PATH.fullmatch(url.path)
        if url.path in ("/version", "/api", "/apis"):
            self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator"})
            return
        if match is None:
            self._send(404, ApiError(404, "NotFound", f"the server could not find {url.path}").body())
            return
        kind, ns, name, sub = match.group("kind"), match.group("ns"), match.group("name"), match.group("sub")
        watching = str(query.get("watch")).lower() in ("true", "1")
        verbs = {"GET": "get" if name else ("watch" if watching else "list"), "POST": "create"}
        verb = verbs.get(method, method.lower())
        action = f"{verb} {kind}" + (f"/{sub}" if sub else "")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else {}
        emulator = self.emulator
        throttled, _lost = emulator.faults.decide(action)
        token = str(self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        entry = emulator.log.record(
            action,
            {"path": url.path, "query": query, "body": body},
            throttled=throttled,
            lost=None,
            client=token or None,
        )
        if throttled:
            entry["status"] = 429
            self._send(429, ApiError(429, "TooManyRequests", "the server has received too many requests").body())
            return
        try:
            if method == "GET" and sub == "log":
                text = emulator.pod_log(ns or "default", name or "", query)
                entry.update(status=200, bytes=len(text), objects=0)
                self._send(200, text, "text/plain")
                return
            if method == "GET" and watching:
                self._stream(emulator.watch(kind, ns, query))
                return
            if method == "GET":
                answer = (
                    emulator.list(kind, ns, query) if name is None else _public(emulator._obj(kind, ns or "", name))
                )
                code = 200
            elif method == "POST":
                answer, code = emulator.create(kind, ns or "", body), 201
            elif method == "PATCH":
                answer, code = emulator.patch(kind, ns or "", name or "", body), 200
            elif method == "DELETE":
                answer, code = emulator.delete(kind, ns or "", name or "", body), 200
            else:
                raise ApiError(405, "MethodNotAllowed", method)
        except ApiError as err:
            entry["status"] = err.code
            self._send(err.code, err.body())
            return
        entry["status"] = code
        # what the answer cost: objects sent (a LIST's items, else one) and bytes
        entry["objects"] = len(answer.get("items") or []) if str(answer.get("kind", "")).endswith("List") else 1
        data = json.dumps(answer).encode()
        entry["bytes"] = len(data)
        self._send(code, data)

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def _stream(self, events: Iterator[dict[str, Any] | None]) -> None:
        # in HTTP/1.1 chunks, one or more events each, as the API server streams a watch: clients read
        # each event as it comes (a plain HTTP/1.0 body would be read to its end first)
        self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            try:
                for event in events:
                    if event is None:
                        if self._client_gone():
                            return
                        continue
                    data = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            finally:
                if isinstance(events, Iterator) and hasattr(events, "close"):
                    events.close()

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")
