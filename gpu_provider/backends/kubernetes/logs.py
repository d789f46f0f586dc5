"""Reading a pod's log from a cursor, so that following a job costs about its log's size, not that
size times the number of reads.

The log API has no byte offset. Each read asks for ``timestamps=true`` and ``sinceTime`` = the whole
second of the last line taken (the API server passes ``sinceTime`` on to the kubelet without a
fraction), and ``limitBytes`` = what the chunk may still take plus the bytes of the lines already taken
in that second (which come again). The cursor of a pod is the timestamp of the last line taken, how
many lines carried exactly that timestamp, and the bytes taken within its second; lines at or before
it are dropped. What a read brings again is at most the lines written in one second, and nothing
once a complete read has begun :data:`SETTLED_S` after that second.

:func:`read` follows an attempt's pods this way; :func:`tail` reads the last lines of each.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpu_provider.backends.base import LOG_READ_BYTES, MAX_LOG_LINE_CHARS, JobHandle, LogChunk, clip_line
from gpu_provider.backends.kubernetes.calls import POLL_ATTEMPTS, call, read_log, status_of
from gpu_provider.backends.kubernetes.manifests import CONTAINER
from gpu_provider.backends.kubernetes.mapping import pod_times, rank_of

if TYPE_CHECKING:
    from gpu_provider.backends.kubernetes.objects import Objects

#: the most bytes a read that has taken nothing yet asks for: one line of the longest kept
#: (:data:`MAX_LOG_LINE_CHARS` characters of up to 4 bytes) and its timestamp
LONG_LINE_BYTES = 4 * MAX_LOG_LINE_CHARS + 64
_STAMP = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")

#: seconds after which a second of the log is taken as complete (the node's and this machine's clocks
#: may differ by this much): until then a read brings that second's lines again
SETTLED_S = 2.0
#: pods of a multi-node attempt whose last lines :func:`tail` reads
TAIL_PODS = 8

Key = tuple[int, int]


def stamp_key(stamp: bytes) -> Key | None:
    """A log timestamp (RFC 3339, nanoseconds, as the kubelet writes it) as (seconds, nanoseconds)."""
    found = _STAMP.fullmatch(stamp)
    if found is None:
        return None
    base, fraction, zone = (g.decode() if g else "" for g in found.groups())
    try:
        seconds = int(datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone)).timestamp())
    except ValueError:
        return None
    return seconds, int(fraction.ljust(9, "0") or 0)


def split_stamped(raw: bytes) -> tuple[Key | None, bytes]:
    """A line of a ``timestamps=true`` read as (its timestamp's key, the line); ``None`` without one."""
    stamp, space, text = raw.partition(b" ")
    key = stamp_key(stamp) if space else None
    return (key, text) if key is not None else (None, raw)


@dataclass
class PodMark:
    """Where the reading of one pod's log stands (a value of the cursor's JSON object)."""

    key: Key | None = None
    #: lines taken whose timestamp is exactly :attr:`key`
    count: int = 0
    #: bytes (timestamps and newlines included) of the lines taken within :attr:`key`'s whole second
    second_bytes: int = 0
    #: lines taken counted from the log's start, while no line carried a timestamp (an API server that
    #: ignores ``timestamps``: its whole log comes every read), or from a cursor of an earlier version
    plain: int = 0
    #: when (this machine's clock) the last read that brought everything there was began: every line
    #: written before it (give or take the clocks' difference) has been taken
    caught_up: float = 0.0

    @classmethod
    def load(cls, value: Any) -> PodMark:
        if isinstance(value, int):
            return cls(plain=max(0, value))
        if isinstance(value, dict) and isinstance(value.get("s"), int) and isinstance(value.get("ns"), int):
            return cls(
                key=(value["s"], value["ns"]),
                count=int(value.get("n") or 0),
                second_bytes=int(value.get("b") or 0),
                caught_up=float(value.get("r") or 0.0),
            )
        return cls()

    def dump(self) -> dict[str, float] | int:
        if self.key is None:
            return self.plain
        return {"s": self.key[0], "ns": self.key[1], "n": self.count, "b": self.second_bytes, "r": self.caught_up}

    def settle(self) -> None:
        """Once a read that brought everything there was began :data:`SETTLED_S` after the cursor's second
        ended, every line of that second has been taken: the next read starts at the next second and
        brings none of it again."""
        if self.key is not None and self.caught_up - SETTLED_S > self.key[0] + 1:
            self.key, self.count, self.second_bytes = (self.key[0] + 1, 0), 0, 0

    def since(self) -> str | None:
        """``sinceTime`` of the next read: the whole second of the last line taken."""
        if self.key is None:
            return None
        return datetime.fromtimestamp(self.key[0], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def advance(self, key: Key | None, size: int) -> None:
        if key is None:
            return
        if key == self.key:
            self.count += 1
            self.second_bytes += size
            return
        same_second = self.key is not None and self.key[0] == key[0]
        self.second_bytes = self.second_bytes + size if same_second else size
        self.key, self.count = key, 1


def take(
    data: bytes, mark: PodMark, *, limit: int, ended: bool, budget: int, prefix: str, out: list[str]
) -> tuple[int, bool]:
    """Append the lines of one read that come after ``mark`` to ``out``, about ``budget`` bytes of them
    (one line at least when ``out`` is empty), advancing ``mark``. Answers the bytes taken and
    whether more is there now (the budget or the read's ``limit`` stopped it).

    A last line without its newline is taken only once the container has ended (while it runs it may
    still grow) and the read was not cut by ``limit``.
    """
    cut = len(data) >= limit
    parts = data.split(b"\n")
    tail = parts.pop()
    if tail and ended and not cut:
        parts.append(tail)
        tail = b""
    used, took, at_mark = 0, False, 0
    for index, raw in enumerate(parts, 1):
        key, text = split_stamped(raw)
        if index <= mark.plain:  # taken before, counted from the start (a read from the start: no sinceTime)
            mark.advance(key, len(raw) + 1)
            at_mark = mark.count  # every line of that timestamp so far came in this read
            continue
        if mark.key is not None and key is not None:
            if key < mark.key:
                continue
            if key == mark.key:
                at_mark += 1
                if at_mark <= mark.count:
                    continue
        line = prefix + clip_line(text.decode("utf-8", "replace"))
        size = len(line.encode()) + 1
        if out and used + size > budget:
            return used, True
        out.append(line)
        used += size
        took = True
        if key is None and mark.key is None:
            mark.plain += 1
        mark.advance(key, len(raw) + 1)
        at_mark = mark.count  # the lines of the mark's timestamp met in this read: all taken or seen
    if cut and not took and not out:
        key, text = split_stamped(tail) if tail else (None, b"")
        if tail and (mark.key is None or key is None or key > mark.key):  # one line longer than a read: cut
            head = text.decode("utf-8", "replace")[:MAX_LOG_LINE_CHARS]
            out.append(f"{prefix}{head} ... [line cut: longer than {limit} bytes]")
            used += len(out[-1].encode()) + 1
            mark.advance(key, len(tail))
        elif mark.key is not None:  # still inside that line: go on from the next second, so reading ends
            out.append(
                f"{prefix}[the rest of a line longer than {limit} bytes, and what followed it within the same "
                "second, left out]"
            )
            used += len(out[-1].encode()) + 1
            mark.key, mark.count, mark.second_bytes = (mark.key[0] + 1, 0), 0, 0
    return used, cut


def read(
    objects: Objects, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES
) -> LogChunk:
    """Lines of every pod of the attempt after ``cursor``, ``rank N:`` prefixed for multi-node
    attempts; only complete lines of a running container are taken.

    One LIST of the attempt's pods by its label, then per pod one read from the cursor (``sinceTime``,
    ``limitBytes``), so the bytes read over a job's life are about its log's size, however often it is read."""
    try:
        loaded = json.loads(cursor) if cursor else {}
    except ValueError:
        loaded = {}
    marks: dict[str, Any] = loaded if isinstance(loaded, dict) else {}
    pods = objects.attempt_pods(handle.name)
    multi = int(handle.extra.get("nodes") or 1) > 1
    lines: list[str] = []
    size = 0
    more = False
    for pod in pods:
        name = str(pod["metadata"]["name"])
        state = (pod.get("status") or {}).get("phase")
        if state == "Pending" and not pod_times(pod)[0]:
            continue
        ended = state in ("Succeeded", "Failed")
        prefix = f"rank {rank_of(pod)}: " if multi else ""
        mark = PodMark.load(marks.get(name))
        used, stopped = read_pod(objects, name, mark, ended, max_bytes - size, prefix, lines)
        marks[name] = mark.dump()
        size += used
        if stopped:
            more = True
            break
    return LogChunk(lines=lines, cursor=json.dumps(marks, sort_keys=True) if marks else cursor, more=more)


def read_pod(
    objects: Objects, pod: str, mark: PodMark, ended: bool, budget: int, prefix: str, out: list[str]
) -> tuple[int, bool]:
    """One read of ``pod``'s log after ``mark`` into ``out``, about ``budget`` bytes; answers the bytes
    taken and whether more is there now."""
    allowance = budget if out else max(budget, LONG_LINE_BYTES)
    if allowance <= 0:
        return 0, True
    mark.settle()
    limit = allowance + mark.second_bytes  # the lines of the cursor's second come again
    query: list[tuple[str, Any]] = [("container", CONTAINER), ("timestamps", "true"), ("limitBytes", limit)]
    since = mark.since()
    if since:
        query.append(("sinceTime", since))
    sent = time.time()
    try:
        data = call(
            f"read log of {pod}",
            lambda: read_log(objects.api, pod, objects.namespace, query),
            attempts=POLL_ATTEMPTS,
        )
    except Exception as err:
        if status_of(err) in (400, 404):  # not started yet, or gone
            return 0, False
        raise
    used, more = take(data, mark, limit=limit, ended=ended, budget=budget, prefix=prefix, out=out)
    if not more:
        mark.caught_up = sent
    return used, more


def tail(objects: Objects, handle: JobHandle, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of the attempt's output: one read per pod (``tailLines``, at most
    :data:`TAIL_PODS` pods), merged by their timestamps, ``rank N:`` prefixed for multi-node attempts."""
    if lines <= 0:
        return []
    multi = int(handle.extra.get("nodes") or 1) > 1
    stamped: list[tuple[tuple[int, int], int, str]] = []
    for pod in objects.attempt_pods(handle.name)[:TAIL_PODS]:
        name = str(pod["metadata"]["name"])
        query: list[tuple[str, Any]] = [
            ("container", CONTAINER),
            ("timestamps", "true"),
            ("tailLines", lines),
            ("limitBytes", lines * LONG_LINE_BYTES),
        ]
        try:
            data = call(
                f"read the end of {name}'s log",
                lambda name=name, query=query: read_log(objects.api, name, objects.namespace, query),  # type: ignore[misc]
                attempts=POLL_ATTEMPTS,
            )
        except Exception as err:
            if status_of(err) in (400, 404):
                continue
            raise
        prefix = f"rank {rank_of(pod)}: " if multi else ""
        for raw_line in data.rstrip(b"\n").split(b"\n") if data else []:
            key, text = split_stamped(raw_line)
            line = prefix + clip_line(text.decode("utf-8", "replace"), MAX_LOG_LINE_CHARS)
            stamped.append((key or (0, 0), len(stamped), line))
    stamped.sort()
    return [line for _, _, line in stamped[-lines:]]
