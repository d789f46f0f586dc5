"""The shared core of the emulators: moto's threaded server with a middleware in front that records
every request of the emulated services and injects faults, patching helpers, and what every job runner
gives its processes (the base environment, a signal to a process group).

A service emulator (:mod:`gpu_provider.testing.emulators.aws_batch`) gives the middleware two functions: one that names
a request's action (``SubmitJob``, ``logs:GetLogEvents``; ``None`` for requests it does not track)
and one that words an error as the service does (HTTP status, error code). Faults, per action
(``"*"``: every tracked action, each counted on its own):

* :meth:`Faults.throttle` - every n-th request is refused as throttled;
* :meth:`Faults.throttle_bursts` - n requests in a row are throttled, then one passes (longer than
  botocore's own retries, so the client's backoff is what gets it through);
* :meth:`Faults.deny` - every request of the action is refused, HTTP 400 ``AccessDeniedException`` (a role
  that lost a permission), until turned off;
* :meth:`Faults.lose_response` - the request is carried out (moto answers it), then the client gets
  HTTP 500 (``how="error"``) or a closed connection without an answer (``how="disconnect"``), as
  when a response is lost on the way back: a client that sends it again does it twice.

The request log (:class:`RequestLog`) keeps every tracked request, parsed:
``{"action", "body", "throttled", "lost", "time", "status"}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

logger = logging.getLogger(__name__)

#: how a lost response reaches the client
LOST_HOW = ("error", "disconnect")
#: the kinds of error :data:`ErrorStyle` words
THROTTLED, SERVER_ERROR = "throttled", "server_error"

ActionOf = Callable[[dict[str, Any]], "str | None"]
"""Names the action of a WSGI request (``None``: not a request of an emulated service)."""
ErrorStyle = Callable[[str, str], "tuple[int, str, str]"]
"""``(action, kind)`` -> (HTTP status, error code, message) as the service words that kind of error."""

#: what a job process inherits from the emulator's environment (the rest comes from the job)
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")


def python_env() -> dict[str, str]:
    """The base environment of a job process whose command may start with ``python``: :data:`BASE_ENV`,
    with this interpreter's directory first on ``PATH`` (``python`` is the emulator's Python) and
    ``PYTHONUNBUFFERED=1``, as most Python images set."""
    env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
    here = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in (here, env.get("PATH", os.defpath)) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Every emulated host of every job runs on this machine, where real hosts each have a network of their own: two
# multi-node jobs running at once would both rendezvous on MASTER_PORT (29500 unless set) of 127.0.0.1, and a rank
# of one could join rank 0 of the other (seen: two test workers' SageMaker jobs at once, "rank 1 disagrees on the
# run"). Each job gets a free port of this machine instead, the same for all its hosts and restarts.
_job_ports: dict[str, int] = {}
_job_ports_lock = threading.Lock()


def own_rendezvous_port(env: dict[str, str], job: str) -> None:
    """Set ``env``'s ``MASTER_PORT`` (when it has one) to the port of the job ``job`` on this machine: a key unique to
    the job in this process, the same for every host of it. Chosen free the first time, then kept."""
    if "MASTER_PORT" not in env:
        return
    with _job_ports_lock:
        port = _job_ports.get(job)
        if port is None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind(("", 0))
                port = int(probe.getsockname()[1])
            _job_ports[job] = port
    env["MASTER_PORT"] = str(port)


def kill_group(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    """Send ``sig`` to the process group of ``proc`` (started in its own session); gone already: nothing."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# The request being served, per server thread: the middleware stores the parsed body here so that
# patched backend methods (called on the same thread) see fields moto's request parser drops.
_request = threading.local()


def current_body(action: str) -> dict[str, Any] | None:
    """The parsed body of the request this server thread is serving, if it is ``action``."""
    if getattr(_request, "action", None) == action:
        return _request.body  # type: ignore[no-any-return]
    return None


class Patches:
    """Attribute replacements on moto's classes, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` with ``make(original)``."""
        original = getattr(owner, name)
        if name in owner.__dict__:
            saved = owner.__dict__[name]
            self._undo.append(lambda: setattr(owner, name, saved))
        else:  # inherited (threading.Thread.start): remove ours to uncover it again
            self._undo.append(lambda: delattr(owner, name))
        setattr(owner, name, make(original))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


class Faults:
    """Fault rules per action, counted from when each rule is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._throttles: dict[str, tuple[str, int]] = {}  # action or "*" -> ("every" | "burst", n)
        self._seen: dict[tuple[str, str], int] = {}  # (rule key, action) -> requests since the rule was set
        self._lost: dict[str, list[str]] = {}  # action or "*" -> how the next responses are lost
        self._denied: set[str] = set()  # actions refused as AccessDeniedException

    def throttle(self, action: str, every: int) -> None:
        """Throttle every ``every``-th request of ``action`` (``"*"``: of every action); 0 turns it off."""
        self._set_throttle(action, "every", every)

    def throttle_bursts(self, action: str, burst: int) -> None:
        """Throttle ``burst`` requests of ``action`` in a row, then let one pass, and again; 0 turns it off."""
        self._set_throttle(action, "burst", burst)

    def _set_throttle(self, action: str, kind: str, n: int) -> None:
        with self._lock:
            if n <= 0:
                self._throttles.pop(action, None)
            else:
                self._throttles[action] = (kind, n)
            self._seen = {k: v for k, v in self._seen.items() if k[0] != action}

    def lose_response(self, action: str, count: int = 1, *, how: str = "error") -> None:
        """Carry out the next ``count`` requests of ``action``, then lose their responses (see module doc)."""
        if how not in LOST_HOW:
            raise ValueError(f"how={how!r} must be one of {LOST_HOW}")
        with self._lock:
            self._lost.setdefault(action, []).extend([how] * count)

    def deny(self, action: str, on: bool = True) -> None:
        """Refuse every request of ``action`` as ``AccessDeniedException`` (``on=False``: stop refusing)."""
        with self._lock:
            (self._denied.add if on else self._denied.discard)(action)

    def denied(self, action: str) -> bool:
        with self._lock:
            return action in self._denied

    def reset(self) -> None:
        with self._lock:
            self._denied.clear()
            self._throttles.clear()
            self._seen.clear()
            self._lost.clear()

    def decide(self, action: str) -> tuple[bool, str | None]:
        """For one request: whether it is throttled, and how its response is lost (``None``: it is not)."""
        with self._lock:
            key = action if action in self._throttles else "*"
            rule = self._throttles.get(key)
            throttled = False
            if rule is not None:
                seen = self._seen[(key, action)] = self._seen.get((key, action), 0) + 1
                kind, n = rule
                throttled = seen % n == 0 if kind == "every" else seen % (n + 1) != 0
            lost = None
            if not throttled:
                for key in (action, "*"):
                    queue = self._lost.get(key)
                    if queue:
                        lost = queue.pop(0)
                        break
        return throttled, lost


class RequestLog:
    """Every tracked request, parsed, oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []

    def record(
        self, action: str, body: dict[str, Any], *, throttled: bool, lost: str | None, client: str | None = None
    ) -> dict[str, Any]:
        entry = {
            "action": action,
            "body": body,
            "throttled": throttled,
            "lost": lost,
            "time": time.time(),
            "status": None,
            "client": client,
        }
        with self._lock:
            self._entries.append(entry)
        return entry

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """Copies of the requests, oldest first; ``since`` skips the log's first ``since`` entries (of every
        action), so a reader that counts what it has read copies only the new ones."""
        with self._lock:
            return [dict(r) for r in self._entries[since:] if action is None or r["action"] == action]

    def count(self, action: str) -> int:
        with self._lock:
            return sum(1 for r in self._entries if r["action"] == action)

    def reset(self) -> None:
        with self._lock:
            self._entries.clear()


class _QuietRequestHandler(MotoRequestHandler):
    """moto's request handler without werkzeug's one line per request on stderr."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class RecordingMotoServer(ThreadedMotoServer):
    """moto's threaded server with :class:`Middleware` in front of moto's WSGI app."""

    def __init__(self, port: int, middleware: Callable[[Any], Middleware]) -> None:
        super().__init__(ip_address="127.0.0.1", port=port, verbose=False)
        self._middleware = middleware

    def _server_entry(self) -> None:  # same as moto's, plus the middleware and a quiet handler
        app = self._middleware(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=_QuietRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()

    def stop(self) -> None:
        super().stop()
        if self._server is not None:
            self._server.server_close()


_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def aws_client_of(authorization: str | None) -> str | None:
    """The access key id a request was signed with (who sent it), from its ``Authorization`` header;
    ``None`` for an unsigned one."""
    match = _CREDENTIAL.search(authorization or "")
    return match.group(1) if match else None


class Middleware:
    """Records tracked requests, applies :class:`Faults`, and passes the parsed body on to moto."""

    def __init__(self, app: Any, *, action_of: ActionOf, error_style: ErrorStyle, faults: Faults, log: RequestLog):
        self._app = app
        self._action_of = action_of
        self._error_style = error_style
        self._faults = faults
        self._log = log

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        action = self._action_of(environ)
        if action is None:
            return self._app(environ, start_response)
        raw = _read_body(environ)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        throttled, lost = self._faults.decide(action)
        client = aws_client_of(environ.get("HTTP_AUTHORIZATION"))
        entry = self._log.record(action, body, throttled=throttled, lost=lost, client=client)
        if self._faults.denied(action):
            entry["status"] = 400
            return _error_response(400, "AccessDeniedException", f"not authorized to perform {action}", start_response)
        if throttled:
            logger.info("throttled a %s request", action)
            entry["status"], code, message = self._error_style(action, THROTTLED)
            return _error_response(entry["status"], code, message, start_response)

        def recording_start_response(status: str, headers: Any, *args: Any) -> Any:
            entry["status"] = int(status.split()[0])
            return start_response(status, headers, *args)

        _request.action, _request.body = action, body
        try:
            if lost is None:
                return self._app(environ, recording_start_response)
            # carry the request out (moto builds the whole answer here), then lose the answer
            answer = self._app(environ, lambda status, headers, *args: entry.update(status=int(status.split()[0])))
            with contextlib.closing(answer) if hasattr(answer, "close") else contextlib.nullcontext():
                for _ in answer:
                    pass
        finally:
            _request.action = _request.body = None
        logger.info("carried out a %s request (HTTP %s) and lost its response (%s)", action, entry["status"], lost)
        if lost == "disconnect":
            connection = environ.get("werkzeug.socket")
            if connection is not None:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            # werkzeug treats a ConnectionError as a dropped client and writes nothing more
            raise ConnectionResetError(f"emulator: dropped the response to {action}")
        status, code, message = self._error_style(action, SERVER_ERROR)
        return _error_response(status, code, message, start_response)


def _read_body(environ: dict[str, Any]) -> bytes:
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        raw = stream.read(int(length))
    elif environ.get("wsgi.input_terminated"):
        raw = stream.read()
    else:
        raw = b""
    environ["wsgi.input"] = io.BytesIO(raw)
    environ["CONTENT_LENGTH"] = str(len(raw))
    return raw


_REASONS = {400: "Bad Request", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


def _error_response(status: int, code: str, message: str, start_response: Callable[..., Any]) -> list[bytes]:
    # botocore takes the error code from x-amzn-ErrorType (restJson), else from __type (awsJson)
    payload = json.dumps({"__type": code, "message": message}).encode()
    start_response(
        f"{status} {_REASONS.get(status, 'Error')}",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload))),
            ("x-amzn-ErrorType", code),
            ("x-amzn-RequestId", str(uuid.uuid4())),
        ],
    )
    return [payload]
