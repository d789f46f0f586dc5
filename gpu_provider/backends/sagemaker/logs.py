"""A training job's CloudWatch logs: one stream per host and run (``<job>/algo-<n>-<epoch>``), read in order.

The cursor and the paging are shared with the Batch backend (:mod:`gpu_provider.backends.aws.logs`);
this module knows where SageMaker writes: the log group, and how the streams of a job are named.
"""

from __future__ import annotations

from typing import Any

from gpu_provider.backends.aws.calls import POLL_ATTEMPTS, Clients, call, error_code
from gpu_provider.backends.aws.logs import LogCursor, StreamNotFoundError, log_chunk, read_streams
from gpu_provider.backends.base import LogChunk, clip_line

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
#: host streams :func:`output_tail` reads from the end (one GetLogEvents each)
TAIL_STREAMS = 8


def read(clients: Clients, job_name: str, cursor: str | None, max_bytes: int) -> LogChunk:
    """Every host's stream after ``cursor``, each line prefixed with its host."""
    state = LogCursor.load(cursor)
    client = clients.get("logs")
    streams = host_streams(clients, job_name)
    if not streams:
        return LogChunk(lines=[], cursor=cursor, more=False)

    def get_page(kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return call(
                "GetLogEvents",
                lambda: client.get_log_events(**kwargs),
                attempts=POLL_ATTEMPTS,
                service="CloudWatch Logs",
            )
        except Exception as err:
            if error_code(err) == "ResourceNotFoundException":
                raise StreamNotFoundError(str(kwargs["logStreamName"])) from err
            raise

    lines, more = read_streams(get_page, LOG_GROUP, streams, state, max_bytes)
    return log_chunk(lines, state, more)


def host_streams(clients: Clients, job_name: str) -> list[tuple[str, str]]:
    """The job's CloudWatch streams as ``(prefix, stream)``, in the order they began (a restart inside
    the job adds new streams), host order within one run; ``[]`` before the log group exists."""
    client = clients.get("logs")
    found: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{job_name}/"}
        if token:
            kwargs["nextToken"] = token
        try:
            page = call(
                "DescribeLogStreams",
                lambda kwargs=kwargs: client.describe_log_streams(**kwargs),  # type: ignore[misc]
                attempts=POLL_ATTEMPTS,
                service="CloudWatch Logs",
            )
        except Exception as err:
            if error_code(err) == "ResourceNotFoundException":
                return []  # no log group yet
            raise
        found.extend(page.get("logStreams") or [])
        token = page.get("nextToken")
        if not token:
            break
    found.sort(key=lambda s: (int(s.get("creationTime") or 0), str(s.get("logStreamName"))))
    streams = []
    for stream in found:
        stream_name = str(stream["logStreamName"])
        host = stream_name[len(job_name) + 1 :].rpartition("-")[0] or stream_name
        streams.append((f"[{host}] ", stream_name))
    return streams


def tail(clients: Clients, job_name: str, lines: int) -> list[str]:
    """The last ``lines`` log lines of the job: one GetLogEvents from the end of each of the last
    :data:`TAIL_STREAMS` host streams (those of its last run), merged by time."""
    if lines <= 0:
        return []
    client = clients.get("logs")
    events: list[tuple[int, int, str]] = []
    for label, stream in host_streams(clients, job_name)[-TAIL_STREAMS:]:
        try:
            page = call(
                "GetLogEvents",
                lambda stream=stream: client.get_log_events(  # type: ignore[misc]
                    logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=False, limit=lines
                ),
                attempts=POLL_ATTEMPTS,
                service="CloudWatch Logs",
            )
        except Exception as err:
            if error_code(err) == "ResourceNotFoundException":
                continue
            raise
        for event in page.get("events") or []:
            message = clip_line(str(event.get("message", "")).rstrip("\n"))
            events.append((int(event.get("timestamp") or 0), len(events), label + message))
    events.sort()
    return [line for _, _, line in events[-lines:]]
