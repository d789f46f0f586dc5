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

#: Batch's and CloudWatch Logs' error codes for request throttling
THROTTLING_CODES = frozenset({"TooManyRequestsException", "ThrottlingException", "Throttling"})


class Clients:
    """boto3 clients of one backend (one per service), built on first use.

    :param aws_conn_id: the Airflow AWS connection
    :param region_name: the region, ``None`` for the connection's
    """

    def __init__(self, aws_conn_id: str, region_name: str | None) -> None:
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self._lock = threading.Lock()
        self._clients: dict[str, BaseClient] = {}
        self._resolved_region: str | None = None

    def get(self, service: str) -> BaseClient:
        """The client of ``service`` (``batch``, ``logs``)."""
        with self._lock:
            client = self._clients.get(service)
            if client is None:
                client = self.build(service)
                self._clients[service] = client
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
