"""A training job's CloudWatch logs: one stream per host and run (``<job>/algo-<n>-<epoch>``), read in order.

The cursor and the paging are shared with the Batch backend (:mod:`gpu_provider.backends.aws.logs`);
this module knows where SageMaker writes: the log group, and how the streams of a job are named.
"""

from __future__ import annotations

from typing import Any

from gpu_provider.backends.aws import logs as aws_logs
from gpu_provider.backends.aws.calls import POLL_ATTEMPTS, Clients, call, error_code
from gpu_provider.backends.aws.logs import LogCursor, read_log
from gpu_provider.backends.base import LogChunk

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
#: host streams :func:`output_tail` reads from the end (one GetLogEvents each)
TAIL_STREAMS = 8


def read(clients: Clients, job_name: str, cursor: str | None, max_bytes: int) -> LogChunk:
    """Every host's stream after ``cursor``, each line prefixed with its host
    (:func:`gpu_provider.backends.aws.logs.read_log`)."""
    state = LogCursor.load(cursor)
    streams = host_streams(clients, job_name)
    if not streams:
        return LogChunk(lines=[], cursor=cursor, more=False)
    return read_log(clients, LOG_GROUP, streams, state, max_bytes)


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
                service=aws_logs.SERVICE,
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
    :data:`TAIL_STREAMS` host streams (those of its last run), merged by time
    (:func:`gpu_provider.backends.aws.logs.tail`)."""
    if lines <= 0:
        return []
    return aws_logs.tail(clients, LOG_GROUP, host_streams(clients, job_name)[-TAIL_STREAMS:], lines)
