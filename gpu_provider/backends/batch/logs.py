"""A Batch attempt's log: its CloudWatch stream per node (named in DescribeJobs), read from a cursor or from
the end, and the console link of its log group. Reading the streams is shared with SageMaker
(:mod:`gpu_provider.backends.aws.logs`)."""

from __future__ import annotations

from gpu_provider.backends.aws.calls import Clients
from gpu_provider.backends.aws.logs import LogCursor, read_log, tail
from gpu_provider.backends.base import JobHandle, LogChunk
from gpu_provider.backends.batch.service import BatchJobs

#: node streams :func:`output_tail` reads from the end (one GetLogEvents each)
TAIL_STREAMS = 8


def streams(jobs: BatchJobs, handle: JobHandle) -> tuple[list[tuple[str, str]], bool]:
    """(label, log stream) of each node of an attempt whose stream is known yet, and whether all are."""
    nodes = int(handle.extra.get("nodes") or 1)
    ids = [handle.job_id] if nodes == 1 else [f"{handle.job_id}#{i}" for i in range(nodes)]
    found: list[tuple[str, str]] = []
    for job in sorted(jobs.describe(ids), key=lambda j: int(str(j.get("jobId")).partition("#")[2] or 0)):
        stream = (job.get("container") or {}).get("logStreamName")
        if stream:
            label = "" if nodes == 1 else f"node {str(job['jobId']).rpartition('#')[2]}: "
            found.append((label, str(stream)))
    return found, len(found) == len(ids)


def read(
    jobs: BatchJobs, clients: Clients, handle: JobHandle, cursor: str | None, *, group: str, max_bytes: int
) -> LogChunk:
    """Lines of the attempt's CloudWatch stream(s) in ``group`` after ``cursor``."""
    state = LogCursor.load(cursor)
    known = state.streams
    if not known:  # not all known yet: ask Batch (one DescribeJobs), and keep them once complete
        known, complete = streams(jobs, handle)
        if not known:
            return LogChunk(lines=[], cursor=cursor, more=False)  # not started: no stream yet
        if complete:
            state.streams = known
    return read_log(clients, group, known, state, max_bytes)


def output_tail(jobs: BatchJobs, clients: Clients, handle: JobHandle, lines: int, *, group: str) -> list[str]:
    """The last ``lines`` log lines of the attempt: one GetLogEvents from the end of each node's
    stream (at most :data:`TAIL_STREAMS` nodes), merged by time."""
    known, _ = streams(jobs, handle)
    return tail(clients, group, known[:TAIL_STREAMS], lines)
