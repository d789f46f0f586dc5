"""The end-of-log marker: every node says where its log ends, and the task stops reading at once.

Without markers (a job that does not run through the runtime helper or a multi-node entry) the
reader falls back to the backend's ``log_settle_s`` wait and still gets the late lines.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import ClassVar

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, LogChunk
from gpu_provider.backends.batch import MULTI_NODE_ENTRY as BATCH_ENTRY
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.common import END_OF_LOG_COMMAND
from gpu_provider.backends.sagemaker.backend import MULTI_NODE_ENTRY as SAGEMAKER_ENTRY
from gpu_provider.engine import logs
from gpu_provider.engine.logs import LogForwarder
from gpu_provider.runtime.output import EndOfLog, end_of_log_line, parse_end_of_log
from tests.backends import test_batch_backend as batch_tests
from tests.backends import test_local
from tests.backends.test_local import Local, job
from tests.batch_world import BatchWorld
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

local = test_local.local  # the fixture: a LocalBackend in a temporary state dir, cleaned up after the test
log = logging.getLogger("test-end-of-log")

#: far longer than any read here: a reader that returned before it did not wait for it
LONG_SETTLE_S = 30.0


def _copied(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("[job] ")]


def test_the_marker_has_one_format_and_nothing_else_parses_as_one() -> None:
    line = end_of_log_line(1, 2, 143)
    assert line == f"{names.END_OF_LOG} node=1 nnodes=2 exit=143"
    assert parse_end_of_log(line) == EndOfLog(1, 2, 143)
    assert parse_end_of_log(f"[local] {line}") == EndOfLog(1, 2, 143)  # the local backend's prefix
    for other in (
        "gpu_provider: output_uri=s3://b/k",
        f"{names.END_OF_LOG} node=2 nnodes=2 exit=0",  # no node 2 in a job of two
        f"{names.END_OF_LOG} node=0 nnodes=1 exit=0 and more",
        f"{names.END_OF_LOG} node=x nnodes=1 exit=0",
        "the job printed gpu_provider: end-of-log somewhere",
    ):
        assert parse_end_of_log(other) is None, other


class _Logs(ScriptedBackend):
    """The scripted backend with a long settle wait, counting reads; a late line arrives at the second."""

    log_settle_s: ClassVar[float] = LONG_SETTLE_S
    reads: ClassVar[int] = 0
    late: ClassVar[list[str]] = []

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = 1 << 20) -> LogChunk:
        _Logs.reads += 1
        if _Logs.reads == 2:
            ScriptedBackend.log_lines[handle.job_id].extend(_Logs.late)
        return super().logs(handle, cursor, max_bytes=max_bytes)


def _handle() -> JobHandle:
    return JobHandle(
        backend="scripted", job_id="j1", name="j1", attempt=1, capacity=names.ON_DEMAND, submitted_at=time.time()
    )


def test_the_reader_stops_at_the_markers_of_every_node_without_the_settle_wait(
    scripted: type[ScriptedBackend],  # noqa: F811 (the fixture)
    caplog: pytest.LogCaptureFixture,
) -> None:
    _Logs.reads, _Logs.late = 0, ["never read: the markers said the log had ended"]
    ScriptedBackend.log_lines["j1"] = [
        "node 0 working",
        end_of_log_line(1, 2, 0),
        "node 0 done",
        end_of_log_line(0, 2, 0),
    ]
    reader = LogForwarder(_Logs(), _handle(), log)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger=log.name):
        reader.settle()
    assert time.monotonic() - began < LONG_SETTLE_S
    assert _Logs.reads == 1, "one read: every node's marker was in it, so nothing more can come"
    assert reader.all_ended and reader.node_ends == {0: 0, 1: 0}
    assert _copied(caplog) == ["[job] node 0 working", "[job] node 0 done"], "markers are not job output"
    said = [r.getMessage() for r in caplog.records if "exited with status" in r.getMessage()]
    assert len(said) == 2 and "node 1 of 2 exited with status 0" in said[0]


def test_without_markers_of_every_node_the_reader_waits_for_late_lines(
    scripted: type[ScriptedBackend],  # noqa: F811 (the fixture)
    caplog: pytest.LogCaptureFixture,
) -> None:
    # node 1's marker is missing (killed before it could print it): the reader must not trust node 0's alone
    _Logs.reads, _Logs.late = 0, ["a late line"]
    ScriptedBackend.log_lines["j1"] = ["early", end_of_log_line(0, 2, 0)]
    reader = LogForwarder(_Logs(), _handle(), log)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger=log.name):
        reader.settle()
    assert time.monotonic() - began < LONG_SETTLE_S, "two quiet reads end the wait, as before"
    assert _copied(caplog) == ["[job] early", "[job] a late line"]
    assert not reader.all_ended and _Logs.reads >= 3


def test_a_job_without_the_helper_still_gets_its_late_lines(
    scripted: type[ScriptedBackend],  # noqa: F811 (the fixture)
    caplog: pytest.LogCaptureFixture,
) -> None:
    _Logs.reads, _Logs.late = 0, ["a late line"]
    ScriptedBackend.log_lines["j1"] = ["early"]
    reader = LogForwarder(_Logs(), _handle(), log)
    with caplog.at_level(logging.INFO, logger=log.name):
        reader.settle()
    assert _copied(caplog) == ["[job] early", "[job] a late line"]
    assert reader.node_ends == {} and not reader.all_ended


@pytest.mark.parametrize(
    ("setting", "between_reads"),
    [(None, logs.SETTLE_READ_S), ("0.05", 0.05), ("2.5", 2.5), ("0", logs.SETTLE_READ_S), ("soon", logs.SETTLE_READ_S)],
    ids=["default", "short", "long", "below-the-bounds", "not-a-number"],
)
def test_the_reads_for_late_lines_come_as_often_as_configured(
    scripted: type[ScriptedBackend],  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    setting: str | None,
    between_reads: float,
) -> None:
    """``[gpu_provider] log_settle_read_s`` paces the reads after the end (the suite sets it short); a bad value
    is said in a warning and the default used: the job has ended, its task is not failed for it."""
    if setting is None:
        monkeypatch.delenv("AIRFLOW__GPU_PROVIDER__LOG_SETTLE_READ_S", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__LOG_SETTLE_READ_S", setting)
    slept: list[float] = []
    monkeypatch.setattr(logs.time, "sleep", slept.append)  # the reader's pauses, not taken
    _Logs.reads, _Logs.late = 0, []
    ScriptedBackend.log_lines["j1"] = ["early"]
    with caplog.at_level(logging.WARNING, logger=logs.__name__):
        LogForwarder(_Logs(), _handle(), log).settle()
    assert slept == [between_reads, between_reads], "two quiet reads after the first, paced as configured"
    warnings = [r.getMessage() for r in caplog.records if r.name == logs.__name__]
    if setting in ("0", "soon"):
        assert warnings == [
            f"[gpu_provider] log_settle_read_s={setting!r} must be a number of seconds between 0.05 and 60: using 1 s."
        ]
    else:
        assert warnings == []


def test_a_two_node_local_job_marks_the_end_of_every_node(local: Local, caplog: pytest.LogCaptureFixture) -> None:
    handle = local.submit(job("import os, sys; print('rank', os.environ['NODE_RANK']); sys.exit(0)"), nodes=2)
    assert local.wait(handle, timeout=60).state is JobState.SUCCEEDED
    backend = local.backend
    backend.log_settle_s = LONG_SETTLE_S  # type: ignore[misc]  # this instance only
    reader = LogForwarder(backend, handle, log)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger=log.name):
        reader.settle()
    assert time.monotonic() - began < LONG_SETTLE_S
    assert reader.node_ends == {0: 0, 1: 0} and reader.all_ended
    copied = _copied(caplog)
    assert "[job] [node 0] rank 0" in copied and "[job] [node 1] rank 1" in copied
    assert not any(names.END_OF_LOG in line for line in copied)


def test_a_failed_node_s_marker_carries_its_exit_status(local: Local) -> None:
    code = "import os, sys; sys.exit(3 if os.environ['NODE_RANK'] == '1' else 0)"
    handle = local.submit(job(code), nodes=2)
    assert local.wait(handle, timeout=60).state is JobState.FAILED
    reader = LogForwarder(local.backend, handle, log, copy=False)
    reader.pump(drain=True)
    assert reader.node_ends[1] == 3


def test_a_two_node_batch_job_marks_the_end_of_every_node(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    backend.log_settle_s = LONG_SETTLE_S  # type: ignore[misc]  # this instance only
    # the main node waits for node 1 to end first: its end stops the others (as on Batch)
    code = (
        "import os, pathlib, sys, time, tempfile\n"
        "print('rank', os.environ['NODE_RANK'], flush=True)\n"
        "if os.environ['NODE_RANK'] == '0':\n"
        "    time.sleep(0.5)\n"
    )
    handle = backend.submit(batch_tests._request(batch_tests._py(code), task="marks", nodes=2))
    status = batch_tests._wait_state(backend, handle, JobState.SUCCEEDED, JobState.FAILED, timeout=60)
    assert status.state is JobState.SUCCEEDED, status
    reader = LogForwarder(backend, handle, log)
    began = time.monotonic()
    reader.settle()
    assert time.monotonic() - began < LONG_SETTLE_S
    assert reader.node_ends == {0: 0, 1: 0} and reader.all_ended


@pytest.mark.parametrize("entry", [BATCH_ENTRY, SAGEMAKER_ENTRY], ids=["batch", "sagemaker"])
def test_the_multi_node_entry_passes_sigterm_on_and_still_marks_the_end(entry: str, tmp_path: object) -> None:
    # the entry runs the command as a child: a stop must still reach it, and the marker still comes
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: os._exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "NNODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1"}
    proc = subprocess.Popen(
        ["/bin/sh", "-c", entry, "gpu-provider-entry", *END_OF_LOG_COMMAND, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.terminate()  # SIGTERM to the entry alone: it passes it on
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 7
    last = out.strip().splitlines()[-1]
    marker = parse_end_of_log(last)
    assert marker is not None and marker.exit_code == 7 and marker.nnodes == 2, out
