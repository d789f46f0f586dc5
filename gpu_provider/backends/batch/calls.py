"""The Batch backend's clients and its throttling backoff.

boto3 is imported only when a client is first needed, through the amazon provider's
``AwsBaseHook`` (credentials, region and endpoint from the Airflow connection).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from gpu_provider.exceptions import GpuBackendThrottledError

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long :func:`run_bounded` callers (``cancel()``) wait before returning; the call goes on
#: in the background (below Airflow's 5 s between SIGTERM and SIGKILL of a task process)
CANCEL_WAIT_S = 4.0

#: Batch's and CloudWatch Logs' error codes for request throttling
THROTTLING_CODES = frozenset({"TooManyRequestsException", "ThrottlingException", "Throttling"})


class Clients:
    """boto3 clients of one backend (one per service), built on first use.

    Any thread may ask for a client, and so may a signal handler: ``cancel()`` runs in Airflow's
    SIGTERM handler on the task's main thread, which may be in the middle of building a client when
    the signal arrives. So a cached client is read without a lock, and a build takes the lock
    without waiting: when another build holds it (another thread's, or the one this handler
    interrupted on its own thread), this call builds a client of its own instead of waiting, and
    does not cache it. No I/O ever runs while waiting for the lock, because nothing waits for it.

    :param aws_conn_id: the Airflow AWS connection
    :param region_name: the region, ``None`` for the connection's
    """

    def __init__(self, aws_conn_id: str, region_name: str | None) -> None:
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self._build_lock = threading.Lock()
        self._clients: dict[str, BaseClient] = {}
        self._resolved_region: str | None = None

    def get(self, service: str) -> BaseClient:
        """The client of ``service`` (``batch``, ``logs``); never waits for another caller."""
        client = self._clients.get(service)  # a plain dict read: atomic, no lock
        if client is not None:
            return client
        if not self._build_lock.acquire(blocking=False):
            log.debug("a %s client is being built elsewhere; building one for this call", service)
            return self._remember_region(self.build(service))
        try:
            client = self._clients.get(service)
            if client is None:
                client = self._remember_region(self.build(service))
                self._clients[service] = client
            return client
        finally:
            self._build_lock.release()

    def _remember_region(self, client: BaseClient) -> BaseClient:
        self._resolved_region = client.meta.region_name
        return client

    def build(self, service: str) -> BaseClient:
        """A new client from the Airflow connection."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
        from botocore.config import Config

        hook = AwsBaseHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name, client_type=service)
        # botocore retries throttled and transient calls itself; call() adds its own backoff on top
        config = hook.config.merge(Config(retries={"mode": "standard", "max_attempts": 3}))
        return hook.get_client_type(region_name=hook.region_name, config=config)

    @property
    def region(self) -> str:
        """The region the clients talk to (the option, else the connection's)."""
        if self.region_name:
            return self.region_name
        if self._resolved_region is None:
            self.get("batch")
        return self._resolved_region or "us-east-1"


def call(what: str, fn: Callable[[], T], *, attempts: int = 6) -> T:
    """Run one API call, backing off with full jitter while the service throttles it."""
    from botocore.exceptions import ClientError

    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code not in THROTTLING_CODES:
                raise
            if attempt == attempts:
                raise GpuBackendThrottledError(
                    f"AWS Batch throttled {what} {attempts} times in a row ({code}); will try again"
                ) from err
            delay = random.uniform(0, min(8.0, 0.25 * 2**attempt))
            log.debug("%s throttled (%s); retrying in %.2fs", what, code, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def run_bounded(what: str, fn: Callable[[], None], *, timeout: float = CANCEL_WAIT_S) -> None:
    """Run ``fn`` in a new thread and wait for it at most ``timeout`` seconds; re-raise its error.

    For calls made from a signal handler (``cancel()`` from ``on_kill``): the code the handler
    interrupted may hold a lock ``fn`` needs, ours or a library's (Airflow's connection lookup,
    urllib3's connection pool). Waiting for it on the interrupted thread would never end; a
    separate thread simply goes on once the handler has returned and the interrupted code has let
    go. The thread is not a daemon: the interpreter waits for it at exit, so a task process that
    ends normally still sends the call.

    :param what: the call, for the log
    """
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # handed to the caller below
            outcome.append(err)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name=f"gpu-provider-{what}", daemon=False)
    thread.start()
    thread.join(timeout)
    if not outcome:
        log.warning(
            "%s did not finish within %.0fs (the service is slow or throttling, or the interrupted code holds "
            "something it needs); it goes on in the background.",
            what,
            timeout,
        )
        return
    error = outcome[0]
    if error is not None:
        raise error
