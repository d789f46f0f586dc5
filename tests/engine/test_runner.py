"""The runner's handling of wait outcomes and the log reader, against the scripted backend."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.engine.attempts import AttemptEngine, Fail, Submit, Succeed, Wait
from gpu_provider.engine.logs import LogForwarder
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.engine.watch import CAPACITY_TIMEOUT, DEADLINE
from gpu_provider.exceptions import GpuJobDeadlineError
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import SpotFallback
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("scripted")
log = logging.getLogger("test-runner")


def _runner(record: AttemptRecord, saved: list[int] | None = None) -> AttemptRunner:
    engine = AttemptEngine(SpotFallback(backoff=0), [record], try_number=1, backend_name="scripted")
    return AttemptRunner(
        ScriptedBackend(),
        engine,
        log=log,
        label="Airflow task d.t of run r",
        stop=threading.Event(),
        persist=lambda records: (saved if saved is not None else []).append(len(records)),
        capacity_wait=60.0,
        queue_timeout=120.0,
        cancel_retry_s=0.0,
    )


def _spot_record(job_id: str = "j1") -> AttemptRecord:
    handle = JobHandle("scripted", job_id, f"gp-{job_id}", 1, names.SPOT, time.time() - 100)
    return AttemptRecord.new(handle, try_number=1)


def test_a_stale_capacity_timeout_is_checked_again_before_acting() -> None:
    """Issue 18.2: the job started (even finished) between the trigger's sample and the task acting on it."""
    record = _spot_record()
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.SUCCEEDED, gpu_seconds=12.0, started_at=time.time() - 20)
    step = _runner(record).after_wait(record, JobStatus(state=JobState.QUEUED), CAPACITY_TIMEOUT)
    assert step == Succeed(record)
    assert ScriptedBackend.cancels == [], "a job that already ran must not be cancelled as a capacity timeout"
    assert record.gpu_seconds == 12.0 and record.interruption is None

    running = _spot_record("j2")
    ScriptedBackend.table["j2"] = JobStatus(state=JobState.RUNNING)
    assert _runner(running).after_wait(running, JobStatus(state=JobState.QUEUED), CAPACITY_TIMEOUT) == Wait(running)


def test_a_capacity_timeout_whose_cancel_fails_keeps_watching_the_job() -> None:
    """Issue 18.2: a failed cancel must not fail the task and leave a queued spot job nobody watches."""
    record = _spot_record()
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.QUEUED)
    ScriptedBackend.fail_cancel = 1
    runner = _runner(record)
    assert runner.after_wait(record, JobStatus(state=JobState.QUEUED), CAPACITY_TIMEOUT) == Wait(record)
    assert record.state is JobState.QUEUED
    # next time the cancel works: the attempt is a capacity timeout, marked on the job, and spot falls back
    step = runner.after_wait(record, JobStatus(state=JobState.QUEUED), CAPACITY_TIMEOUT)
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND)
    assert record.interruption == names.CAPACITY_TIMEOUT
    (_, reason), _ = ScriptedBackend.cancels
    assert reason.startswith(names.CAPACITY_TIMEOUT_MARK), "a lookup after a crash must classify this cancel"


def test_a_deadline_cancels_the_job_and_fails_the_try_with_a_retryable_error() -> None:
    record = _spot_record()
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING)
    saved: list[int] = []
    step = _runner(record, saved).after_wait(record, JobStatus(state=JobState.RUNNING), DEADLINE)
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobDeadlineError)
    assert ScriptedBackend.table["j1"].state is JobState.CANCELLED  # type: ignore[union-attr]
    assert record.state is JobState.CANCELLED and saved, "the cancelled attempt is saved"


def test_collecting_marks_the_job_and_the_record() -> None:
    record = _spot_record()
    record.update(JobStatus(state=JobState.SUCCEEDED))
    _runner(record).collect(record)
    assert record.collected and ScriptedBackend.marks == [("j1", None, True)]


def test_a_killed_sync_wait_stops_polling_at_once() -> None:
    """Defect 4: once on_kill set the stop event, the wait must not poll in a tight loop."""
    record = _spot_record()
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING)
    runner = _runner(record)
    killer = threading.Timer(0.3, runner.stop.set)
    killer.start()
    with pytest.raises(Exception, match="cancelled because this task was killed"):
        runner.wait(record, poll_interval=0.1)
    polls = len(ScriptedBackend.polls)
    assert polls <= 5, f"{polls} polls in 0.3 s at a 0.1 s interval"


def test_the_log_reader_warns_once_when_the_log_cannot_be_read(caplog: pytest.LogCaptureFixture) -> None:
    """Defect 9: a user must see that the log could not be read, once, not every tick (nor only at DEBUG)."""
    handle = _spot_record().handle
    ScriptedBackend.log_lines["j1"] = ["a", "b"]
    ScriptedBackend.fail_logs = 3
    reader = LogForwarder(ScriptedBackend(), handle, log, cap_bytes=1 << 20)
    with caplog.at_level(logging.INFO, logger="test-runner"):
        for _ in range(4):
            reader.pump()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Could not read the log" in warnings[0].getMessage()
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("[job]")] == ["[job] a", "[job] b"]


def test_the_log_reader_drains_every_line_or_says_how_many_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 7: the task log carries every line, or says plainly how many were left out and where the log is."""
    handle = _spot_record().handle
    lines = [f"line {i:06d} " + "x" * 50 for i in range(100_000)]
    ScriptedBackend.log_lines["j1"] = lines
    everything = LogForwarder(ScriptedBackend(), handle, log, cap_bytes=1 << 30)
    with caplog.at_level(logging.INFO, logger="test-runner"):
        everything.pump(drain=True)
    copied = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[job] ")]
    assert len(copied) == 100_000 and copied[-1] == f"[job] {lines[-1]}"
    caplog.clear()

    capped = LogForwarder(ScriptedBackend(), handle, log, cap_bytes=64 * 1024)
    ScriptedBackend.log_lines["j1"] = [*lines, "gpu_provider: output_uri=s3://bucket/out"]
    with caplog.at_level(logging.INFO, logger="test-runner"):
        capped.settle(0)
    copied = [r for r in caplog.records if r.getMessage().startswith("[job] ")]
    assert 0 < len(copied) < 2000
    note = [r.getMessage() for r in caplog.records if "were not copied into the task log" in r.getMessage()]
    assert len(note) == 1 and f"{100_001 - len(copied)} line(s)" in note[0]
    assert capped.output_uri == "s3://bucket/out", "the declared output is found past the cap"
