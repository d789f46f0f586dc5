"""Reading an AWS job's CloudWatch Logs streams (a Batch job's one per node, a SageMaker job's one per host
and run) from an opaque cursor, in bounded chunks (:func:`read_log`), or their last lines (:func:`tail`).

The cursor is JSON text that holds everything a reader needs to go on, so any worker or triggerer
can continue where another stopped and the backend keeps no reading state: the job's streams once
all are known (``[label, stream]`` pairs; multi-node jobs label each line ``node <i>: ``) and, per
stream, CloudWatch's forward token after the last page read.

One read returns at most about ``max_bytes`` of lines: it stops paging once the budget is spent
(the page that crosses it is kept whole, since a token cannot point inside a page; pages are
sized from the lines seen so far to keep that overshoot small) and says ``more=True``. Each line is
cut to :data:`~gpu_provider.backends.base.MAX_LOG_LINE_CHARS` characters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_provider.backends.aws.calls import POLL_ATTEMPTS, Clients, call, error_code
from gpu_provider.backends.base import LogChunk, clip_line

#: how the throttling errors name the service
SERVICE = "CloudWatch Logs"
#: the cursor format this module writes (a cursor of another version is refused, not misread)
CURSOR_VERSION = 1
#: most events CloudWatch returns per GetLogEvents page
MAX_PAGE_EVENTS = 10_000
#: assumed bytes per line before any line was seen (sizes the first page)
_FIRST_GUESS_BYTES = 100

GetPage = Callable[[dict[str, Any]], dict[str, Any]]
"""Calls GetLogEvents with these arguments; returns the page, or raises :class:`StreamNotFoundError`."""


class StreamNotFoundError(Exception):
    """The log stream does not exist (yet): CloudWatch creates it with the container's first line."""


@dataclass
class LogCursor:
    """Where a reader of one job's log streams is (see the module doc)."""

    streams: list[tuple[str, str]] = field(default_factory=list)
    """``(label, stream)`` of every node, once every node's stream is known; empty until then."""
    tokens: dict[str, str] = field(default_factory=dict)
    """Forward token per stream after the last page read."""

    def dump(self) -> str:
        data = {"v": CURSOR_VERSION, "streams": [list(s) for s in self.streams], "tokens": self.tokens}
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def load(cls, text: str | None) -> LogCursor:
        """The cursor in ``text`` (``None``: the start of the log)."""
        if text is None:
            return cls()
        try:
            data = json.loads(text)
            if data["v"] != CURSOR_VERSION:
                raise ValueError(data["v"])
            streams = [(str(label), str(stream)) for label, stream in data["streams"]]
            tokens = {str(k): str(v) for k, v in dict(data["tokens"]).items()}
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"log cursor {text[:80]!r} was not written by this version of the batch backend "
                "(pass None to read the log from its start)"
            ) from err
        return cls(streams, tokens)


def read_streams(
    get_page: GetPage,
    group: str,
    streams: Sequence[tuple[str, str]],
    cursor: LogCursor,
    max_bytes: int,
) -> tuple[list[str], bool]:
    """Read on from ``cursor`` through ``streams`` in order, about ``max_bytes`` of lines at most.

    Updates ``cursor.tokens`` in place. Returns the lines and whether the read stopped at the limit.
    """
    lines: list[str] = []
    used = 0
    for label, stream in streams:
        token = cursor.tokens.get(stream)
        while True:
            remaining = max_bytes - used
            if remaining <= 0:
                return lines, True
            per_line = used // len(lines) if lines else _FIRST_GUESS_BYTES
            kwargs: dict[str, Any] = {
                "logGroupName": group,
                "logStreamName": stream,
                "limit": max(1, min(MAX_PAGE_EVENTS, remaining // max(16, per_line))),
            }
            kwargs.update({"nextToken": token} if token else {"startFromHead": True})
            try:
                page = get_page(kwargs)
            except StreamNotFoundError:
                break
            events = page.get("events") or []
            for event in events:
                line = label + clip_line(str(event.get("message", "")).rstrip("\n"))
                lines.append(line)
                used += len(line.encode("utf-8", "replace")) + 1
            new_token = page.get("nextForwardToken")
            if new_token:
                token = str(new_token)
                cursor.tokens[stream] = token
            if not events or not new_token:
                break  # at the end of this stream for now
    return lines, False


def log_chunk(lines: list[str], cursor: LogCursor, more: bool) -> LogChunk:
    """The chunk handed to the caller (the cursor as text)."""
    return LogChunk(lines=lines, cursor=cursor.dump(), more=more)


def read_log(
    clients: Clients, group: str, streams: Sequence[tuple[str, str]], cursor: LogCursor, max_bytes: int
) -> LogChunk:
    """Read on from ``cursor`` through ``streams`` of the log ``group`` (see the module doc); a stream not
    created yet is passed over. GetLogEvents goes through the throttling backoff with a status read's tries."""
    client = clients.get("logs")

    def get_page(kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return call(
                "GetLogEvents", lambda: client.get_log_events(**kwargs), attempts=POLL_ATTEMPTS, service=SERVICE
            )
        except Exception as err:
            if error_code(err) == "ResourceNotFoundException":
                raise StreamNotFoundError(str(kwargs["logStreamName"])) from err
            raise

    lines, more = read_streams(get_page, group, streams, cursor, max_bytes)
    return log_chunk(lines, cursor, more)


def tail(clients: Clients, group: str, streams: Sequence[tuple[str, str]], lines: int) -> list[str]:
    """The last ``lines`` lines of ``streams``: one GetLogEvents from the end of each (a stream not created
    yet is passed over), merged by time; lines of one time keep their stream's order and the streams' order."""
    if not streams or lines <= 0:
        return []
    client = clients.get("logs")
    events: list[tuple[int, str]] = []
    for label, stream in streams:
        try:
            page = call(
                "GetLogEvents",
                lambda stream=stream: client.get_log_events(  # type: ignore[misc]
                    logGroupName=group, logStreamName=stream, startFromHead=False, limit=lines
                ),
                attempts=POLL_ATTEMPTS,
                service=SERVICE,
            )
        except Exception as err:
            if error_code(err) == "ResourceNotFoundException":
                continue
            raise
        for event in page.get("events") or []:
            message = clip_line(str(event.get("message", "")).rstrip("\n"))
            events.append((int(event.get("timestamp") or 0), label + message))
    events.sort(key=lambda item: item[0])  # stable: each stream's own order is kept within a tick
    return [line for _, line in events[-lines:]]
