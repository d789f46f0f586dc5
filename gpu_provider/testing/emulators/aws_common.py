"""What the AWS emulators share: one of each kind per process, moto's server behind the recording middleware,
boto3 clients with dummy credentials, a job process's AWS settings, and the fault and request-log knobs."""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import boto3

from gpu_provider.testing.emulators.core import (
    ActionOf,
    ErrorStyle,
    Faults,
    Middleware,
    RecordingMotoServer,
    RequestLog,
)
from gpu_provider.testing.emulators.serve import stop_event, write_atomically

#: botocore signs every request; the emulators check no signature (the key id names the client in the request log)
DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

_E = TypeVar("_E", bound="OnePerProcess")
_active_lock = threading.Lock()
_active: dict[str, OnePerProcess] = {}  # kind -> the emulator of that kind started in this process


def aws_client(service: str, *, endpoint_url: str, region: str, **kwargs: Any) -> Any:
    """A boto3 client for ``service`` at ``endpoint_url``, in ``region`` unless ``kwargs`` give a ``region_name``,
    with dummy credentials unless they give their own."""
    kwargs.setdefault("region_name", region)
    return boto3.client(service, endpoint_url=endpoint_url, **{**DUMMY_CREDENTIALS, **kwargs})


def job_aws_env(endpoint_url: str, region: str) -> dict[str, str]:
    """What a task role and the region give a job's container: the endpoint (the emulator), dummy
    credentials, the region."""
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
    }


class OnePerProcess(ABC):
    """The lifecycle of an emulator that patches moto, whose state and patches are per process: one of each
    kind runs at a time. :meth:`start` (or ``with``) claims the kind and calls ``_start``; :meth:`stop` calls
    ``_stop`` and frees it (idempotent; also run at interpreter exit when ``_stop_at_exit``)."""

    #: the kind (one of each runs at a time, whatever subclass starts it)
    _one_of: ClassVar[str]
    #: the emulator's name in log lines (``None``: it logs nothing on start)
    _title: ClassVar[str | None] = None
    _stop_at_exit: ClassVar[bool] = True

    port: int
    region: str
    endpoint_url: str
    _server: RecordingMotoServer | None

    @classmethod
    def running(cls: type[_E]) -> _E | None:
        """The emulator of this kind started in this process, if any (only one can run at a time: moto's
        state and the patches are per process)."""
        return _active.get(cls._one_of)  # type: ignore[return-value]

    def start(self: _E) -> _E:
        """Start the emulator on 127.0.0.1 (its server, its patches of moto); returns ``self``."""
        name = type(self).__name__
        with _active_lock:
            other = _active.get(self._one_of)
            if other is not None:
                raise RuntimeError(
                    f"another {name} is running at {other.endpoint_url}: moto's state and the patches are per "
                    f"process, so only one can run at a time; stop it, or use {name}.running()"
                )
            _active[self._one_of] = self
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        if self._stop_at_exit:
            atexit.register(self.stop)
        if self._title is not None:
            logging.getLogger(type(self).__module__).info(
                "%s listening on %s (region %s)", self._title, self.endpoint_url, self.region
            )
        return self

    def stop(self) -> None:
        """Stop what :meth:`start` started and undo its patches. Idempotent."""
        with _active_lock:
            if _active.get(self._one_of) is not self:
                return
        atexit.unregister(self.stop)
        self._stop()
        with _active_lock:
            _active.pop(self._one_of, None)

    @abstractmethod
    def _start(self) -> None:
        """Start the server and patch moto (called by :meth:`start` once the kind is claimed)."""

    @abstractmethod
    def _stop(self) -> None:
        """Stop what :meth:`_start` started and undo its patches (called by :meth:`stop`)."""

    def __enter__(self: _E) -> _E:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start_server(
        self,
        port: int,
        *,
        app: Callable[[Any], Any],
        action_of: ActionOf,
        error_style: ErrorStyle,
        faults: Faults,
        log: RequestLog,
    ) -> None:
        """Start moto's server on ``port`` with ``app(moto's app)`` behind the recording middleware, and set
        :attr:`endpoint_url`."""
        self._server = RecordingMotoServer(
            port,
            lambda moto: Middleware(app(moto), action_of=action_of, error_style=error_style, faults=faults, log=log),
        )
        self._server.start()
        host, bound = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{bound}"

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


class ServiceKnobs:
    """The request log and the faults of an emulated service, as a test reaches them (a mixin over the
    emulator's ``_faults`` and ``_log``; how a throttled or lost request is answered is the service's own
    wording: see the emulator's module doc)."""

    _faults: Faults
    _log: RequestLog

    def client(self, service: str, **kwargs: Any) -> Any:
        """A boto3 client for ``service`` pointed at the emulator, with dummy credentials unless ``kwargs``
        give their own (an ``aws_access_key_id`` is recorded as each request's ``client``)."""
        return aws_client(service, endpoint_url=self.endpoint_url, region=self.region, **kwargs)  # type: ignore[attr-defined]

    def throttle(self, action: str, every: int) -> None:
        """Answer every ``every``-th request of ``action`` (counted from now; ``"*"``: of every tracked action,
        each counted on its own) as the service does when throttling (Batch: HTTP 429
        ``TooManyRequestsException``; SageMaker and CloudWatch Logs: HTTP 400 ``ThrottlingException``).
        ``every=0`` turns it off."""
        self._faults.throttle(action, every)

    def throttle_bursts(self, action: str, burst: int) -> None:
        """Throttle ``burst`` requests of ``action`` in a row (``"*"``: of every action, each counted on its
        own), then let one through, and so on. With ``burst`` of 4 or more, botocore's own retries give up
        (``retries={"max_attempts": 3}`` is 3 retries, 4 attempts): only a client's own backoff gets a call
        through. 0 turns it off."""
        self._faults.throttle_bursts(action, burst)

    def deny(self, action: str, on: bool = True) -> None:
        """Refuse every ``action`` request (``DescribeTrainingJob``) as HTTP 400 ``AccessDeniedException``, as
        for a role that lost that permission, until ``on=False``. The refused requests are in the log."""
        self._faults.deny(action, on)

    def lose_response(self, action: str, count: int = 1, *, how: str = "error") -> None:
        """Carry out the next ``count`` requests of ``action`` (a SubmitJob creates its job), then lose the
        response: ``how="error"`` answers HTTP 500, ``how="disconnect"`` closes the connection without an
        answer. A client that simply sends the request again does it twice."""
        self._faults.lose_response(action, count, how=how)

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """The service's, CloudWatch Logs' and SQS's requests received, oldest first: ``{"action", "body",
        "throttled", "lost", "time", "status", "client"}``; ``action`` is the API name (``SubmitJob``;
        ``logs:GetLogEvents``; ``sqs:ReceiveMessage``, the event queues' reads); ``lost`` says how the
        response was lost (:meth:`lose_response`), ``None`` when it was not; ``client`` is the access key id
        the request was signed with. ``since`` skips the log's first ``since`` entries."""
        return self._log.requests(action, since=since)

    def count(self, action: str) -> int:
        """How many ``action`` requests were received (throttled ones included)."""
        return self._log.count(action)

    def reset_requests(self) -> None:
        """Forget the requests received so far."""
        self._log.reset()


# ---------------------------------------------------------------------- command line (``make demo``)


def serve_parser(
    module: str, doc: str, *, help: str, ready_help: str
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``python -m <module> serve`` (``doc``: the module's docstring): the parser and its ``serve`` command, with
    the options every AWS emulator takes (``--port``, ``--job-cwd``, ``--ready-file``, ``--region``,
    ``--step-seconds``, ``--grace-period``)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help=help)
    serve.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: a free one)")
    serve.add_argument("--job-cwd", default=None, help="working directory of job processes")
    serve.add_argument("--ready-file", default=None, help=ready_help)
    serve.add_argument("--region", default="us-east-1")
    serve.add_argument("--step-seconds", type=float, default=0.5)
    serve.add_argument("--grace-period", type=float, default=5.0)
    return parser, serve


def serve_until_signalled(
    emulator: OnePerProcess, ready_file: str | None, prepare: Callable[[], dict[str, Any]], *, title: str
) -> int:
    """Run ``emulator`` until SIGTERM or SIGINT: start it, ``prepare()`` it (what it returns goes into the ready
    file, between the endpoint and region and the pid), write ``ready_file`` (JSON) once ready and remove it
    at the end, stopping the emulator's jobs first where it has ``stop_all``."""
    stop = stop_event()
    ready = Path(ready_file) if ready_file else None
    with emulator:
        extra = prepare()
        if ready is not None:
            info = {"endpoint_url": emulator.endpoint_url, "region": emulator.region, **extra, "pid": os.getpid()}
            write_atomically(ready, json.dumps(info))
        print(f"{title} ready at {emulator.endpoint_url}", flush=True)
        try:
            stop.wait()
        finally:
            stop_all = getattr(emulator, "stop_all", None)
            if callable(stop_all):
                stop_all("emulator stopped")
            if ready is not None:
                ready.unlink(missing_ok=True)
    print(f"{title} stopped", flush=True)
    return 0
