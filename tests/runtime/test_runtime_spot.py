"""SpotInterruptionWatcher against a local stand-in for the instance metadata service (loopback only)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpu_provider.runtime import SpotInterruptionWatcher, SpotNotice, StopFlag

NOTICE = (200, json.dumps({"action": "terminate", "time": "2025-06-01T12:02:00Z"}).encode())
NO_NOTICE = (404, b"Not Found")


class FakeMetadataService:
    """Answers IMDSv2 token requests, then the queued instance-action answers (the last one repeats)."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.tokens_issued = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                service.requests.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    service.tokens_issued += 1
                    self._answer(200, f"token-{service.tokens_issued}".encode())
                else:
                    self._answer(400, b"bad token request")

            def do_GET(self) -> None:
                service.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path != "/latest/meta-data/spot/instance-action":
                    self._answer(404, b"")
                elif not self.headers.get("X-aws-ec2-metadata-token"):
                    self._answer(401, b"")
                else:
                    status, body = service.answers.pop(0) if len(service.answers) > 1 else service.answers[0]
                    self._answer(status, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata() -> Iterator[Callable[[list[tuple[int, bytes]]], FakeMetadataService]]:
    services: list[FakeMetadataService] = []

    def make(answers: list[tuple[int, bytes]]) -> FakeMetadataService:
        services.append(FakeMetadataService(answers))
        return services[-1]

    yield make
    for service in services:
        service.close()


def _poll_until(condition: Callable[[], bool], timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_notice_sets_the_flag_and_calls_back_once(
    metadata: Callable[[list[tuple[int, bytes]]], FakeMetadataService],
) -> None:
    service = metadata([NO_NOTICE, NO_NOTICE, NOTICE])
    stop = StopFlag()
    notices: list[SpotNotice] = []
    with SpotInterruptionWatcher(stop, endpoint=service.endpoint, interval=0.01, on_notice=notices.append) as watcher:
        assert stop.wait(timeout=5)
        assert _poll_until(lambda: not watcher.running)  # it stops polling after the notice
    assert stop.reason == "spot interruption notice: terminate at 2025-06-01T12:02:00Z"
    assert notices == [SpotNotice(action="terminate", time="2025-06-01T12:02:00Z")]
    assert watcher.notice == notices[0]

    # the exact requests: one IMDSv2 token (TTL 21600 s), then GETs carrying it
    puts = [r for r in service.requests if r[0] == "PUT"]
    gets = [r for r in service.requests if r[0] == "GET"]
    assert len(puts) == 1 and puts[0][1] == "/latest/api/token"
    assert puts[0][2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    assert len(gets) == 3
    assert all(path == "/latest/meta-data/spot/instance-action" for _, path, _ in gets)
    assert all(headers["x-aws-ec2-metadata-token"] == "token-1" for _, _, headers in gets)


def test_errors_and_unreadable_answers_are_tolerated(
    metadata: Callable[[list[tuple[int, bytes]]], FakeMetadataService],
) -> None:
    service = metadata([(500, b"oops"), (200, b"<html>not json</html>"), (200, b'{"time": "no action"}'), NOTICE])
    stop = StopFlag()
    with SpotInterruptionWatcher(stop, endpoint=service.endpoint, interval=0.01):
        assert stop.wait(timeout=5)
    assert "terminate" in stop.reason
    assert len([r for r in service.requests if r[0] == "GET"]) == 4


def test_expired_token_is_renewed(metadata: Callable[[list[tuple[int, bytes]]], FakeMetadataService]) -> None:
    service = metadata([(401, b""), NO_NOTICE, (200, b'{"action": "stop", "time": "T"}')])
    stop = StopFlag()
    with SpotInterruptionWatcher(stop, endpoint=service.endpoint, interval=0.01):
        assert stop.wait(timeout=5)
    assert service.tokens_issued == 2
    assert stop.reason == "spot interruption notice: stop at T"


def test_no_notice_leaves_the_flag_alone(metadata: Callable[[list[tuple[int, bytes]]], FakeMetadataService]) -> None:
    service = metadata([NO_NOTICE])
    watcher = SpotInterruptionWatcher(StopFlag(), endpoint=service.endpoint, interval=0.01)
    assert watcher.check_once() is None
    with watcher:
        assert _poll_until(lambda: watcher.polls >= 5)
        assert watcher.running
    assert not watcher.running
    assert not watcher.stop_flag.requested


def test_unreachable_endpoint_is_tolerated() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = StopFlag()
    watcher = SpotInterruptionWatcher(stop, endpoint=f"http://127.0.0.1:{port}", interval=0.01, timeout=0.5)
    assert watcher.check_once() is None
    with watcher:
        assert _poll_until(lambda: watcher.polls >= 5)
        assert watcher.running
    assert not watcher.running
    assert not stop.requested


def test_callback_failure_does_not_break_the_stop(
    metadata: Callable[[list[tuple[int, bytes]]], FakeMetadataService],
) -> None:
    service = metadata([NOTICE])

    def broken(notice: SpotNotice) -> None:
        raise RuntimeError("callback bug")

    stop = StopFlag()
    with SpotInterruptionWatcher(stop, endpoint=service.endpoint, interval=0.01, on_notice=broken):
        assert stop.wait(timeout=5)
    assert stop.requested


def test_defaults_and_validation() -> None:
    watcher = SpotInterruptionWatcher(StopFlag())  # constructed only: never started, nothing contacted
    assert (watcher.endpoint, watcher.interval, watcher.timeout) == ("http://169.254.169.254", 5.0, 1.0)
    assert not watcher.running
    with pytest.raises(ValueError, match="interval must be > 0"):
        SpotInterruptionWatcher(StopFlag(), interval=0)
