"""Reading a local job's ``job.log`` in bounded chunks, from an opaque cursor.

Memory stays bounded whatever the job wrote: a line is held only up to the bytes that can make
:data:`~gpu_provider.backends.base.MAX_LOG_LINE_CHARS` characters; the rest of an overlong line is
skipped (read, counted, not kept) and the line is returned cut, saying how much was cut, in the
words of :func:`~gpu_provider.backends.base.clip_line`. A skip over a huge line may span several
calls: the cursor remembers where it is.

Cursor forms (opaque to callers): ``"<offset>"``, the byte offset of the next line; or
``"<line start>/<scan offset>/<characters counted>"`` in the middle of an overlong line.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpu_provider.backends.base import MAX_LOG_LINE_CHARS, LogChunk, clip_line

#: bytes read from the file at a time
_BLOCK = 64 * 1024
#: bytes skipped inside overlong lines per call, as a multiple of ``max_bytes`` (bounds one call's time)
_SKIP_FACTOR = 32
#: UTF-8 continuation bytes: every other byte starts a character
_CONTINUATION = bytes(range(0x80, 0xC0))


def _chars(data: bytes) -> int:
    """Characters in UTF-8 ``data`` (bytes that start a character), without decoding it."""
    return len(data.translate(None, _CONTINUATION))


def _parse_cursor(cursor: str | None) -> tuple[int, int | None, int]:
    """``(line start, scan offset or None, characters counted past the head)``."""
    if cursor is None or cursor == "":
        return 0, None, 0
    parts = cursor.split("/") if isinstance(cursor, str) else []
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1 and numbers[0] >= 0:
        return numbers[0], None, 0
    if len(numbers) == 3 and all(n >= 0 for n in numbers) and numbers[1] >= numbers[0]:
        return numbers[0], numbers[1], numbers[2]
    raise ValueError(
        f"cursor={cursor!r} is not a cursor of the local backend's logs: pass None, or the cursor a previous "
        "logs() call returned"
    )


def _cut(head: bytes, extra_chars: int, limit: int) -> str:
    """The line whose first bytes are ``head``, followed by ``extra_chars`` more characters, cut to ``limit``."""
    text = head.decode("utf-8", errors="replace")
    if not extra_chars:
        return clip_line(text, limit)
    total = _chars(head) + extra_chars
    if total <= limit:  # only when head ends inside a character whose last bytes came later
        return text
    return f"{text[:limit]} ... [line cut: {total - limit} more characters]"


def read_log(path: Path, cursor: str | None, max_bytes: int, limit: int = MAX_LOG_LINE_CHARS) -> LogChunk:
    """Complete lines of ``path`` after ``cursor``, about ``max_bytes`` of them at most.

    A line still being written (no newline yet) is not returned; the cursor stays before it.

    :param path: the log file (a missing file reads as empty)
    :param cursor: ``None`` for the start, else a cursor this function returned
    :param max_bytes: stop after about this many bytes of returned lines (``more=True``)
    :param limit: the most characters of one returned line
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes={max_bytes!r} must be a positive number of bytes")
    line_start, scan, counted = _parse_cursor(cursor)
    hold = 4 * limit + 4  # enough bytes for `limit` characters of any UTF-8 text, and one more
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return LogChunk(lines=[], cursor=cursor, more=False)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        head = b""
        if scan is None:
            pos = line_start
        else:
            fh.seek(line_start)
            head = fh.read(hold)
            pos = max(scan, line_start + len(head))
        lines: list[str] = []
        size = skipped = 0
        stopped = False
        fh.seek(pos)
        while not stopped:
            block = fh.read(_BLOCK)
            if not block:
                break
            i = 0
            while i < len(block):
                newline = block.find(b"\n", i)
                end = len(block) if newline < 0 else newline
                room = hold - len(head)
                if room > 0:
                    head += block[i : min(end, i + room)]
                if end - i > room:
                    rest = block[i + max(room, 0) : end]
                    counted += _chars(rest)
                    skipped += len(rest)
                if newline < 0:
                    pos += len(block) - i
                    break
                line = _cut(head, counted, limit)
                lines.append(line)
                size += len(line) + 1
                pos += newline + 1 - i
                i = newline + 1
                line_start, head, counted = pos, b"", 0
                if size >= max_bytes:
                    stopped = True
                    break
            if skipped >= max_bytes * _SKIP_FACTOR:
                stopped = True
        # at a line start, or in a short partial line (read again next time): the line's offset
        next_cursor = str(line_start) if pos == line_start or len(head) < hold else f"{line_start}/{pos}/{counted}"
        more = stopped and os.fstat(fh.fileno()).st_size > pos
    return LogChunk(lines=lines, cursor=next_cursor, more=more)


#: how much of the end of a job's log :func:`read_tail` reads
TAIL_BYTES = 64 * 1024


def read_tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` complete lines of a log file, from its last :data:`TAIL_BYTES` (each cut by
    :func:`~gpu_provider.backends.base.clip_line`); ``[]`` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    if len(data) == TAIL_BYTES and size > TAIL_BYTES:
        text = text[1:]  # the first line was cut by the seek
    return [clip_line(line) for line in text[-lines:]] if lines > 0 else []
