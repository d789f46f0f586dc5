"""Watch the EC2 instance metadata service for a spot interruption notice.

EC2 posts the notice about two minutes before it reclaims a spot instance, at
``/latest/meta-data/spot/instance-action`` (404 until then; then JSON such as
``{"action": "terminate", "time": "2025-01-01T12:00:00Z"}``). The SIGTERM from the backend may come
later than that, or only shortly before the SIGKILL, so a job on spot capacity that polls the notice
gains most of those two minutes to save a checkpoint::

    stop = install_stop_handler()
    with SpotInterruptionWatcher(stop):
        for step in ...:
            ...
            if stop.requested:
                ...  # save and exit

The watcher uses IMDSv2 (a session token from ``PUT /latest/api/token``) through ``urllib``. Off EC2
the endpoint is unreachable: the watcher logs that at debug level and keeps trying; it never raises
into the job.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from gpu_provider.runtime.signals import StopFlag

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_S = 21600
# Renew the token well before EC2 expires it.
_TOKEN_RENEW_S = TOKEN_TTL_S - 600


@dataclass(frozen=True)
class SpotNotice:
    """An interruption notice.

    :param action: what EC2 will do: ``"terminate"``, ``"stop"`` or ``"hibernate"``.
    :param time: when, as EC2 wrote it (UTC, ISO 8601).
    """

    action: str
    time: str


class SpotInterruptionWatcher:
    """A daemon thread that sets a :class:`~gpu_provider.runtime.StopFlag` when a spot notice appears.

    After the first notice it sets the flag (reason: ``"spot interruption notice: <action> at <time>"``),
    calls ``on_notice`` once and stops polling.

    :param stop_flag: the flag to set.
    :param endpoint: base URL of the instance metadata service (override only in tests).
    :param interval: seconds between two polls.
    :param timeout: seconds to wait for each HTTP request.
    :param on_notice: called once, from the watcher thread, with the :class:`SpotNotice`; its
        exceptions are logged, not raised.
    """

    def __init__(
        self,
        stop_flag: StopFlag,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        interval: float = 5.0,
        timeout: float = 1.0,
        on_notice: Callable[[SpotNotice], object] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.stop_flag = stop_flag
        self.endpoint = endpoint.rstrip("/")
        self.interval = interval
        self.timeout = timeout
        self.on_notice = on_notice
        #: the notice once one has been seen
        self.notice: SpotNotice | None = None
        #: number of polls made so far
        self.polls = 0
        self._token: str | None = None
        self._token_at = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- HTTP -----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """One request; returns the status and body (also for HTTP error statuses)."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers)
        # No proxy: the metadata service is link-local, and a proxy from the environment would
        # answer for it (or leak the request).
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=self.timeout) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            try:
                return int(exc.code), bytes(exc.read() or b"")
            finally:
                exc.close()

    def _get_token(self) -> str | None:
        now = time.monotonic()
        if self._token is None or now - self._token_at > _TOKEN_RENEW_S:
            status, body = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(TOKEN_TTL_S)})
            if status != 200:
                log.debug("instance metadata token request answered HTTP %d", status)
                return None
            self._token, self._token_at = body.decode("ascii", "replace").strip(), now
        return self._token

    def check_once(self) -> SpotNotice | None:
        """Poll the metadata service once.

        :return: the notice if one is posted, else ``None`` (also when the service is unreachable
            or answers something unexpected, which is logged).
        """
        from http.client import HTTPException

        self.polls += 1
        try:
            token = self._get_token()
            if token is None:
                return None
            status, body = self._request("GET", NOTICE_PATH, {TOKEN_HEADER: token})
        except (OSError, HTTPException) as exc:  # refused, timed out, garbled: not on EC2, or a blip
            log.debug("instance metadata service at %s unreachable: %s", self.endpoint, exc)
            return None
        if status == 404:
            return None
        if status == 401:  # token expired or revoked: get a new one next time
            self._token = None
            return None
        if status != 200:
            log.debug("spot notice request answered HTTP %d", status)
            return None
        try:
            document = json.loads(body)
            notice = SpotNotice(action=str(document["action"]), time=str(document.get("time", "")))
        except (ValueError, TypeError, KeyError):
            log.warning("ignoring an unreadable spot interruption notice from %s: %r", self.endpoint, body[:200])
            return None
        return notice

    # -- thread ---------------------------------------------------------------------------------

    def _handle(self, notice: SpotNotice) -> None:
        self.notice = notice
        reason = f"spot interruption notice: {notice.action} at {notice.time or 'an unknown time'}"
        log.warning("%s; asking the job to stop", reason)
        self.stop_flag.set(reason)
        if self.on_notice is not None:
            try:
                self.on_notice(notice)
            except Exception:
                log.exception("the on_notice callback failed")

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                notice = self.check_once()
            except Exception:  # never let a surprise end the watcher; the next poll may work
                log.debug("spot notice check failed", exc_info=True)
                notice = None
            if notice is not None:
                self._handle(notice)
                return
            self._stopping.wait(self.interval)

    def start(self) -> SpotInterruptionWatcher:
        """Start polling in a daemon thread.

        :return: the watcher itself.
        """
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the spot interruption watcher is already running")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-provider-spot-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling and wait for the thread to end.

        :param timeout: seconds to wait for the thread; by default a little more than one request.
        """
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else 2 * self.timeout + 1)

    @property
    def running(self) -> bool:
        """Whether the watcher thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> SpotInterruptionWatcher:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
