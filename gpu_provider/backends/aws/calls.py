"""AWS clients and the throttling backoff the Batch and SageMaker backends share, and the one-off
clients of the code outside the backends (:func:`aws_client`, :func:`s3_client_for`).

boto3 is imported only when a client is first needed, through the amazon provider's
``AwsBaseHook`` (credentials, region and endpoint from the Airflow connection).

Every API call goes through :func:`call`, which backs off with full jitter while the service
throttles it, within a bound: a status read gives up sooner (the watch reads again next tick) than
the calls made outside the wait loop (submit, lookups, cancel, marks). SubmitJob is the exception:
it is not idempotent (no client token), so it is sent by a client without botocore's automatic
retries, and the backend looks the job name up before sending it again (see
:func:`may_have_happened`).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from gpu_provider.backends.common import keep_bounded
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobError
from gpu_provider.extras import require_extra

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_AWS_CONN_ID = "aws_default"

#: Batch's and CloudWatch Logs' error codes for request throttling
THROTTLING_CODES = frozenset({"TooManyRequestsException", "ThrottlingException", "Throttling"})

#: backoff after the n-th throttled try: uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2**n)) seconds
BASE_DELAY_S = 0.25
MAX_DELAY_S = 8.0
#: tries of a status read before it is reported as throttled (the watch reads again next tick)
POLL_ATTEMPTS = 6
#: tries of a call outside the wait loop (submit, lookups, cancel, marks): about a minute of backoff
PATIENT_ATTEMPTS = 10

#: botocore's own retries (of throttling, 5xx and connection errors) unless the connection's
#: ``config_kwargs`` say otherwise: 3 retries
DEFAULT_RETRIES = {"mode": "standard", "max_attempts": 3}

#: most clients kept for the whole process (:data:`_SHARED_CLIENTS`)
SHARED_CLIENTS_KEPT = 64
#: clients every backend object of the process shares, per (service, retries, connection id, region, and a
#: hash of what the client is built from: the connection's fields and the AWS_* environment). Building a boto3
#: client costs 50-100 ms (its service model is read and parsed), and a worker builds a new backend object per
#: task: without this, every launch paid it twice (the retrying client and SubmitJob's sending-once one).
#: A changed connection (rotated keys, another endpoint) hashes differently, so it gets a new client; botocore
#: clients are thread-safe and refresh expiring credentials (an assumed role) themselves.
_SHARED_CLIENTS: dict[tuple[str, ...], BaseClient] = {}
#: the boto3 session each of those clients was built from, per (connection id, region, hash): one session
#: builds all of a connection's clients (boto3 sessions are not thread-safe: used under _SHARED_LOCK only)
_SHARED_SESSIONS: dict[tuple[str, ...], Any] = {}
_SHARED_LOCK = threading.Lock()


def _source_hash(hook: Any) -> str:
    """A hash of everything a client of ``hook`` is built from: the Airflow connection's fields (none when it
    does not exist: boto3's default credentials) and the process's ``AWS_*`` environment. Only the hash is kept."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = hook.get_connection(hook.aws_conn_id) if hook.aws_conn_id else None
    except AirflowNotFoundException:
        conn = None
    fields = (
        None
        if conn is None
        else (conn.conn_type, conn.host, conn.login, conn.password, conn.schema, conn.port, conn.extra)
    )
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    return hashlib.sha256(repr((fields, env)).encode()).hexdigest()


def _with_user_agent(config: Any) -> Any:
    """``config`` with this provider's user agent (``airflow-provider-gpu/<version> Airflow/<version>``, then the
    connection's own ``user_agent_extra``). Not the amazon hook's: it finds its calling operator with
    ``inspect.stack()``, which reads every frame's source file (50-300 ms the first time in a process, paid by
    every task's first client), and its ``AmPP`` part would say these requests come from the amazon provider."""
    from botocore.config import Config

    from gpu_provider import __version__

    try:
        from airflow import __version__ as airflow_version
    except ImportError:  # pragma: no cover - Airflow is a dependency
        airflow_version = "unknown"
    parts = [f"airflow-provider-gpu/{__version__}", f"Airflow/{airflow_version}", config.user_agent_extra or ""]
    return config.merge(Config(user_agent_extra=" ".join(p for p in parts if p)))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while the block runs (on again after, unless it was off).

    Building a botocore client parses its service model: SageMaker's is 2.6 MB of JSON, some 200,000 objects,
    all kept. In a task process that already holds ~700,000 objects (Airflow, the DAG, the task runner), those
    allocations set off full collections of the whole heap in the middle of the parse: measured, the parse took
    410-830 ms there against 20-25 ms with the collector paused (a cold launch on SageMaker 1.2 s against the
    anchor's 0.3 s). Nothing the parse builds is garbage, so pausing loses nothing; the next collection runs as
    usual once the client is built."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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
    :param main_service: the client built to learn the connection's region (``batch``, ``sagemaker``)
    """

    def __init__(self, aws_conn_id: str, region_name: str | None, *, main_service: str = "batch") -> None:
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.main_service = main_service
        self._build_lock = threading.Lock()
        self._clients: dict[str, BaseClient] = {}
        self._resolved_region: str | None = None
        self._scope: str | None = None

    def get(self, service: str, *, automatic_retries: bool = True) -> BaseClient:
        """The client of ``service`` (``batch``, ``logs``); never waits for another caller.

        :param automatic_retries: ``False`` for a client that sends each request once (botocore's
            retries off), for calls that must not be repeated blindly (SubmitJob)
        """
        key = service if automatic_retries else f"{service}:once"
        client = self._clients.get(key)  # a plain dict read: atomic, no lock
        if client is not None:
            return client
        if not self._build_lock.acquire(blocking=False):
            log.debug("a %s client is being built elsewhere; building one for this call", service)
            return self._remember_region(self.build(service, automatic_retries=automatic_retries))
        try:
            client = self._clients.get(key)
            if client is None:
                client = self._remember_region(self.build(service, automatic_retries=automatic_retries))
                self._clients[key] = client
            return client
        finally:
            self._build_lock.release()

    def _remember_region(self, client: BaseClient) -> BaseClient:
        self._resolved_region = client.meta.region_name
        return client

    def build(self, service: str, *, automatic_retries: bool = True) -> BaseClient:
        """The client from the Airflow connection (its ``config_kwargs`` apply, e.g. ``retries``): the one the
        process built already from the same connection, region and environment, else a new one."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        hook = AwsBaseHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name, client_type=service)
        source = (self.aws_conn_id, self.region_name or "", _source_hash(hook))
        self._scope = hashlib.sha256(repr(source).encode()).hexdigest()
        key = (service, str(automatic_retries), *source)
        client = _SHARED_CLIENTS.get(key)  # a plain dict read: no lock (a signal handler may be here)
        if client is not None:
            return client
        if not _SHARED_LOCK.acquire(blocking=False):  # never wait: build one of this call's own, keep none
            return self._new_client(hook, automatic_retries=automatic_retries)
        try:
            # one boto3 session per connection for the process: a session parses botocore's endpoint and
            # service model files once, so the second client (SubmitJob's) costs little
            session = _SHARED_SESSIONS.get(source)
            if session is None:
                session = hook.get_session(region_name=hook.region_name)
                keep_bounded(_SHARED_SESSIONS, source, session, limit=SHARED_CLIENTS_KEPT)
            client = self._new_client(hook, automatic_retries=automatic_retries, session=session)
            keep_bounded(_SHARED_CLIENTS, key, client, limit=SHARED_CLIENTS_KEPT)
        finally:
            _SHARED_LOCK.release()
        return client

    @staticmethod
    def _new_client(hook: Any, *, automatic_retries: bool, session: Any = None) -> BaseClient:
        """A client as the hook's ``get_client_type`` builds it (its endpoint, ``verify`` and the connection's
        ``config_kwargs``; this provider's user agent), from ``session`` when given (a boto3 session of the same
        connection), else from a new one."""
        from botocore.config import Config

        config = Config(retries=dict(DEFAULT_RETRIES)).merge(hook.config)  # the connection's settings win
        if not automatic_retries:
            config = config.merge(Config(retries={"mode": "standard", "total_max_attempts": 1}))
        if session is None:
            session = hook.get_session(region_name=hook.region_name)
        service = hook.client_type
        with _collector_paused():
            client: BaseClient = session.client(
                service_name=service,
                endpoint_url=hook.conn_config.get_service_endpoint_url(service_name=service),
                config=_with_user_agent(config),
                verify=hook.verify,
            )
        return client

    def scope(self) -> str:
        """Who and where these clients talk to, as a key (a hash of the connection id, the region option, the
        connection's fields and the ``AWS_*`` environment): facts learned from the service under one scope
        (a job definition's ARN, a queue's policy) hold for every backend object of the process with it."""
        if self._scope is None:
            self.get(self.main_service)
        return self._scope or ""

    @property
    def region(self) -> str:
        """The region the clients talk to (the option, else the connection's)."""
        if self.region_name:
            return self.region_name
        if self._resolved_region is None:
            self.get(self.main_service)
        return self._resolved_region or "us-east-1"


def error_code(err: BaseException) -> str:
    """The service's error code of a botocore ``ClientError`` (``""`` for anything else)."""
    response = getattr(err, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def is_throttling(err: BaseException) -> bool:
    """Whether a botocore error says the service throttled the request."""
    from botocore.exceptions import ClientError

    return isinstance(err, ClientError) and str(err.response.get("Error", {}).get("Code", "")) in THROTTLING_CODES


def may_have_happened(err: BaseException) -> bool:
    """Whether a request that failed with ``err`` may still have been carried out.

    A definite refusal (HTTP 4xx, other than throttling) did nothing. After throttling, a server
    error (5xx), a read timeout or a connection closed before the answer, the service may have
    carried the request out: a SubmitJob must then be looked up before it is sent again.
    """
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(err, ClientError):
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return is_throttling(err) or status >= 500
    return isinstance(err, (HTTPClientError, BotoConnectionError))


def refused(err: BaseException) -> bool:
    """Whether the service definitely refused a request (HTTP 4xx, not throttling): nothing was done."""
    from botocore.exceptions import ClientError

    if not isinstance(err, ClientError) or is_throttling(err):
        return False
    return 400 <= int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) < 500


def backoff(attempt: int) -> float:
    """Seconds to wait after the ``attempt``-th throttled try (full jitter)."""
    return random.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2**attempt))


def call(what: str, fn: Callable[[], T], *, attempts: int = PATIENT_ATTEMPTS, service: str = "AWS Batch") -> T:
    """Run one API call, backing off while the service throttles it, at most ``attempts`` tries.

    :param service: the service's name in the error (the SageMaker backend shares this module)

    :raises GpuBackendThrottledError: still throttled after the last try
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            if not is_throttling(err):
                raise
            if attempt == attempts:
                raise GpuBackendThrottledError(
                    f"{service} throttled {what} {attempts} times in a row; will try again"
                ) from err
            delay = backoff(attempt)
            log.debug("%s throttled; retrying in %.2fs", what, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def send_unsure(
    what: str,
    send: Callable[[], T],
    *,
    service: str,
    where: str = "",
    note: str = "",
    look_again: Callable[[BaseException], T | None] | None = None,
    attempts: int = PATIENT_ATTEMPTS,
) -> T:
    """Send a request that is not idempotent (SubmitJob, CreateTrainingJob) once per try, through a client
    without botocore's automatic retries (``Clients.get(..., automatic_retries=False)``).

    A definite refusal is raised as it is: nothing was created. After an error that may have carried the
    request out (:func:`may_have_happened`), back off, then ``look_again`` (e.g. look the job's name up):
    what it finds is the answer; else send again, at most ``attempts`` tries.

    :param what: the request and its object, in the log and the errors (``"SubmitJob for gp-train-..."``)
    :param service: the service's name in the errors
    :param where: said after ``what`` when the last try failed (``" on job queue 'gpu-spot'"``)
    :param note: said at the end of either error

    :raises GpuBackendThrottledError: still throttled after the last try
    :raises GpuJobError: still failing after the last try
    """
    for attempt in range(1, attempts + 1):
        try:
            return send()
        except Exception as err:
            if not may_have_happened(err):
                raise  # a definite refusal (bad request, unknown queue...): nothing was created
            if attempt == attempts:
                if is_throttling(err):
                    raise GpuBackendThrottledError(
                        f"{service} throttled {what} {attempt} times in a row{note}"
                    ) from err
                raise GpuJobError(
                    f"{service} {what}{where} failed {attempt} times ({type(err).__name__}: {err}){note}"
                ) from err
            time.sleep(backoff(attempt))
            if look_again is not None:
                found = look_again(err)
                if found is not None:
                    return found
    raise AssertionError("unreachable")


def aws_client(service: str, *, aws_conn_id: str | None = DEFAULT_AWS_CONN_ID, region_name: str | None = None) -> Any:
    """A boto3 client of ``service`` from the Airflow AWS connection (the amazon provider's ``AwsBaseHook``:
    credentials, endpoint and ``config_kwargs`` from the connection), in ``region_name`` (``None``: the
    connection's). boto3 is imported here, when the client is needed, never when a DAG file is parsed."""
    require_extra("aws", f"the AWS {service} client")
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=aws_conn_id or DEFAULT_AWS_CONN_ID, client_type=service, region_name=region_name)
    return hook.get_conn()


def s3_client_for(uri: str, aws_conn_id: str | None = DEFAULT_AWS_CONN_ID) -> Any:
    """An S3 client from the Airflow connection for an ``s3://`` URI (the worker's side of S3 checkpoints),
    ``None`` for other schemes.

    A connection id that does not exist falls back to boto3's default credentials (the amazon
    provider's behaviour), so a worker with an instance role needs no connection.
    """
    if not uri.startswith("s3://"):
        return None
    require_extra("aws", "an s3:// checkpoint or output location")
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    return AwsBaseHook(aws_conn_id=aws_conn_id or DEFAULT_AWS_CONN_ID, client_type="s3").get_conn()
