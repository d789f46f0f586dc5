"""Log reads of the contract: one chunk from a cursor, the size limits, and cutting overlong lines."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogChunk:
    """Log lines of an attempt read from a cursor, and the cursor to read on from."""

    lines: list[str]
    cursor: str | None
    """Opaque to everyone but the backend (several streams: Batch nodes, SageMaker hosts, indexed
    pods); pass it back unchanged. ``None`` reads from the start."""
    more: bool = False
    """The read stopped at its size limit and more lines are there now: read again to drain."""


#: the most bytes of log lines one :meth:`Backend.logs` call returns (about; one long line may pass it)
LOG_READ_BYTES = 1 << 20
#: lines longer than this are cut, with a note of how much was cut (bounded memory in every reader)
MAX_LOG_LINE_CHARS = 16 * 1024


def clip_line(line: str, limit: int = MAX_LOG_LINE_CHARS) -> str:
    """A log line cut to ``limit`` characters, saying how much was cut."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... [line cut: {len(line) - limit} more characters]"
