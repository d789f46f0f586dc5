"""A scripted backend: a test double of a *service* that implements the backend contract with an
in-memory table, so tests can drive the real trigger, watch, runner and engine through states and
faults (unknown states, failing cancels, logs that cannot be read) that real services produce rarely."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest

from gpu_provider.backends.base import (
    Backend,
    JobHandle,
    JobRequest,
    JobState,
    JobStatus,
    LogChunk,
    OwnedJob,
    OwnerRead,
    PollResult,
    TaskKey,
    lookup_key,
    register_backend,
)
from gpu_provider.exceptions import GpuJobStatusError


class ScriptedBackend(Backend):
    """Statuses come from a class-level table the test writes; polls, cancels and marks are recorded."""

    name = "scripted"
    table: ClassVar[dict[str, JobStatus | GpuJobStatusError]] = {}
    polls: ClassVar[list[int]] = []
    cancels: ClassVar[list[tuple[str, str]]] = []
    marks: ClassVar[list[tuple[str, int | None, bool]]] = []
    owner_reads: ClassVar[list[str]] = []
    log_lines: ClassVar[dict[str, list[str]]] = {}
    #: the jobs ``lookup`` finds (a test adds the handles it wants found)
    handles: ClassVar[dict[str, JobHandle]] = {}
    fail_cancel: ClassVar[int] = 0
    fail_logs: ClassVar[int] = 0
    #: while set, poll() waits for it to clear (a lock the interrupted code holds, a hung connection)
    poll_gate: ClassVar[threading.Event | None] = None

    def options(self) -> dict[str, Any]:
        return {}

    def submit(self, request: JobRequest) -> JobHandle:
        raise AssertionError("not used")

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        if ScriptedBackend.poll_gate is not None:
            ScriptedBackend.poll_gate.wait()
        ScriptedBackend.polls.append(len(handles))
        return {h.job_id: self.table[h.job_id] for h in handles}

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        if ScriptedBackend.poll_gate is not None:
            ScriptedBackend.poll_gate.wait()
        ScriptedBackend.owner_reads.append(handle.job_id)
        entry = self.table[handle.job_id]
        if isinstance(entry, GpuJobStatusError):
            raise entry
        return OwnerRead(owner_try=entry.owner_try)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        ScriptedBackend.cancels.append((handle.job_id, reason))
        if ScriptedBackend.fail_cancel:
            ScriptedBackend.fail_cancel -= 1
            raise ConnectionError("the service did not answer the cancel")
        self.table[handle.job_id] = JobStatus(state=JobState.CANCELLED, reason=reason)

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        ScriptedBackend.marks.append((handle.job_id, owner_try, collected))

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        return []

    def list_owned(self) -> list[OwnedJob]:
        return []

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        field_name, value = lookup_key(job_id, name)
        found = [h for h in self.handles.values() if value == (h.job_id if field_name == "job_id" else h.name)]
        return found[-1] if found else None

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        return None

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = 1 << 20) -> LogChunk:
        if ScriptedBackend.fail_logs:
            ScriptedBackend.fail_logs -= 1
            raise ConnectionError("log service unreachable")
        lines = self.log_lines.get(handle.job_id, [])
        start = int(cursor or 0)
        end, size = start, 0
        while end < len(lines) and size < max_bytes:
            size += len(lines[end]) + 1
            end += 1
        return LogChunk(lines[start:end], str(end), more=end < len(lines))


@pytest.fixture
def scripted() -> Iterator[type[ScriptedBackend]]:
    from gpu_provider.backends import base

    register_backend("scripted", f"{__name__}.ScriptedBackend")
    for table in (ScriptedBackend.table, ScriptedBackend.log_lines, ScriptedBackend.handles):
        table.clear()
    for log in (ScriptedBackend.polls, ScriptedBackend.cancels, ScriptedBackend.marks, ScriptedBackend.owner_reads):
        log.clear()
    ScriptedBackend.fail_cancel = ScriptedBackend.fail_logs = 0
    ScriptedBackend.poll_gate = None
    yield ScriptedBackend
    if ScriptedBackend.poll_gate is not None:
        ScriptedBackend.poll_gate.set()
    del base._REGISTRY["scripted"]
