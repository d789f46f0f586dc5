"""One reader of an attempt's log, for the worker's wait, the trigger and the copy after a deferral.

It reads the backend's log from an opaque cursor in bounded chunks, copies lines into the task
log up to a per-attempt cap (``[gpu_provider] task_log_max_mib``), keeps reading past the cap only
to find the output the job declared, and says plainly how much it left out and where the full log
is. A read that fails is reported once as a warning, not once per tick.

After the job's end it stops reading as soon as every node's end-of-log marker is in
(:data:`gpu_provider.names.END_OF_LOG`, printed by the runtime helper, the multi-node entries and the
local backend); a job without markers gets the backend's ``log_settle_s`` wait for late lines. The
marker lines are not copied as job output: each node's end is said once, plainly.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpu_provider.backends.base import Backend, JobHandle, provider_config

#: default cap on what one attempt copies into the task log (MiB); the job's own log keeps everything
DEFAULT_TASK_LOG_MAX_MIB = 10.0
#: chunks read per call of :meth:`LogForwarder.pump` while the job runs (the rest comes next tick)
CHUNKS_PER_PUMP = 8
#: seconds between reads while waiting for late lines after the end (``[gpu_provider] log_settle_read_s``)
SETTLE_READ_S = 1.0
#: the bounds of ``[gpu_provider] log_settle_read_s``
SETTLE_READ_BOUNDS_S = (0.05, 60.0)


def settle_read_s() -> float:
    """``[gpu_provider] log_settle_read_s``: seconds between the reads for late lines (unset: the default).

    Read after the job ended: a bad value is said in a warning and the default used, rather than fail a task
    whose job succeeded."""
    raw = provider_config("log_settle_read_s")
    low, high = SETTLE_READ_BOUNDS_S
    try:
        seconds = float(raw) if raw else SETTLE_READ_S
    except ValueError:
        seconds = float("nan")
    if low <= seconds <= high:  # not nan
        return seconds
    logging.getLogger(__name__).warning(
        "[gpu_provider] log_settle_read_s=%r must be a number of seconds between %g and %g: using %g s.",
        raw,
        low,
        high,
        SETTLE_READ_S,
    )
    return SETTLE_READ_S


def task_log_cap_bytes() -> int:
    """``[gpu_provider] task_log_max_mib`` in bytes (0: copy nothing; unset: the default)."""
    raw = provider_config("task_log_max_mib")
    try:
        mib = float(raw) if raw else DEFAULT_TASK_LOG_MAX_MIB
    except ValueError:
        raise ValueError(
            f"[gpu_provider] task_log_max_mib={raw!r} must be a number of MiB >= 0 "
            f"(default {DEFAULT_TASK_LOG_MAX_MIB:g})"
        ) from None
    if not 0 <= mib <= 1024 * 1024:
        raise ValueError(f"[gpu_provider] task_log_max_mib={raw!r} must be between 0 and 1048576 MiB")
    return int(mib * 1024 * 1024)


def declared_output(lines: list[str]) -> str | None:
    """The last output URI declared among log lines (``declare_output`` prints a marked line)."""
    from gpu_provider.runtime.output import OUTPUT_LINE_PREFIX

    found = None
    for line in lines:
        if OUTPUT_LINE_PREFIX in line:
            found = line.rpartition(OUTPUT_LINE_PREFIX)[2].strip() or found
    return found


class LogForwarder:
    """Copies one attempt's log into ``log`` (the task's or the trigger's logger).

    :param cap_bytes: the most bytes of log lines copied for this attempt (``None``: the configured cap)
    :param copy: whether to copy lines at all (``False`` only scans for the declared output)
    """

    def __init__(
        self, backend: Backend, handle: JobHandle, log: Any, *, cap_bytes: int | None = None, copy: bool = True
    ) -> None:
        self.backend = backend
        self.handle = handle
        self.log = log
        self.copy = copy
        self.cap_bytes = task_log_cap_bytes() if cap_bytes is None else cap_bytes
        self.cursor: str | None = None
        self.copied_bytes = 0
        self.omitted_lines = 0
        self.omitted_bytes = 0
        self.lines_read = 0
        #: the output URI the job declared in the lines read so far
        self.output_uri: str | None = None
        #: exit status per node, from the end-of-log markers read so far
        self.node_ends: dict[int, int] = {}
        #: the job's node count, as the markers say it (``None`` before the first marker)
        self.nnodes: int | None = None
        #: the job said it was asked to stop (the runtime helper's SIGTERM notice, ``runtime.signals.STOP_NOTICE``)
        self.stopping = False
        self._warned = False
        self._noted = False

    @property
    def all_ended(self) -> bool:
        """Whether every node's end-of-log marker has been read: nothing more will come."""
        return self.nnodes is not None and len(self.node_ends) >= self.nnodes

    def pump(self, *, drain: bool = False) -> int:
        """Read what is there now (all of it when ``drain``, else a few chunks); returns lines read."""
        total, chunks = 0, 0
        while True:
            try:
                chunk = self.backend.logs(self.handle, self.cursor)
            except Exception as err:  # the log is a convenience: it never fails the wait, but a person must know
                if not self._warned:
                    self._warned = True
                    self.log.warning(
                        "Could not read the log of %s job %s (%s); the task log will miss its lines until a read "
                        "works. %s",
                        self.backend.name,
                        self.handle.job_id,
                        err,
                        self._where(),
                    )
                return total
            if self._warned:
                self._warned = False
                self.log.info("Reading the log of %s job %s works again.", self.backend.name, self.handle.job_id)
            self.cursor = chunk.cursor
            self._take(chunk.lines)
            total += len(chunk.lines)
            chunks += 1
            if not chunk.more or (not drain and chunks >= CHUNKS_PER_PUMP):
                return total

    @property
    def ending(self) -> bool:
        """Whether the lines read so far say the job is ending: it was asked to stop, or a node's command exited."""
        return self.stopping or bool(self.node_ends)

    def _take(self, lines: list[str]) -> None:
        from gpu_provider.runtime.output import parse_end_of_log
        from gpu_provider.runtime.signals import STOP_NOTICE

        self.lines_read += len(lines)
        self.output_uri = declared_output(lines) or self.output_uri
        for line in lines:
            if not self.stopping and STOP_NOTICE in line and "gpu_provider: SIG" in line:
                self.stopping = True
            end = parse_end_of_log(line)
            if end is not None:
                self._ended(end.node, end.nnodes, end.exit_code, end.fault)
                continue
            if not self.copy:
                continue
            size = len(line.encode("utf-8", "replace")) + 1
            if self.copied_bytes + size > self.cap_bytes:
                self.omitted_lines += 1
                self.omitted_bytes += size
                continue
            self.copied_bytes += size
            self.log.info("[job] %s", line)

    def _ended(self, node: int, nnodes: int, exit_code: int, fault: str | None = None) -> None:
        if node in self.node_ends:
            return  # a node's marker read twice (a wrapper inside a wrapper): said once
        self.node_ends[node] = exit_code
        self.nnodes = max(self.nnodes or 0, nnodes)
        if self.copy:
            self.log.info(
                "%s job %s: the command on node %d of %d exited with status %d%s.",
                self.backend.name,
                self.handle.job_id,
                node,
                nnodes,
                exit_code,
                f", after a GPU hardware fault ({fault})" if fault else "",
            )

    def settle(self, seconds: float | None = None) -> None:
        """After the end: read until every node's end-of-log marker is in, or else for up to ``seconds``
        (default the backend's ``log_settle_s``) until two reads in a row bring nothing new; then say
        what was left out."""
        deadline = time.monotonic() + (self.backend.log_settle_s if seconds is None else seconds)
        self.pump(drain=True)
        quiet = 0
        read_s = settle_read_s()
        while time.monotonic() < deadline and quiet < 2 and not self.all_ended:
            time.sleep(min(read_s, max(0.0, deadline - time.monotonic())))
            quiet = 0 if self.pump(drain=True) else quiet + 1
            if not self.lines_read:
                quiet = 0  # nothing at all yet: wait for the first lines until the deadline
        self.finish()

    def finish(self) -> None:
        """Say once how much of the log was not copied, and where the whole log is."""
        if self.omitted_lines and not self._noted:
            self._noted = True
            self.log.warning(
                "%d line(s) (%.1f MiB) of %s job %s's log were not copied into the task log: the cap is %.1f MiB per "
                "attempt ([gpu_provider] task_log_max_mib). %s",
                self.omitted_lines,
                self.omitted_bytes / 1048576,
                self.backend.name,
                self.handle.job_id,
                self.cap_bytes / 1048576,
                self._where(),
            )

    def _where(self) -> str:
        try:
            url = self.backend.logs_url(self.handle) or self.backend.console_url(self.handle)
        except Exception:  # a link is a courtesy
            url = None
        return f"The full log: {url}" if url else "The job's full log stays with the backend."
