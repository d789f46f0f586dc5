"""Issue 29 item 4: what lies between an interruption's end and the next submission, against the scripted
backend: no backoff by default, no wait for the interrupted attempt's late log lines (they are read after
the next submission), and a status read brought forward when the job's own log says it is ending."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.engine.attempts import AttemptEngine, Submit
from gpu_provider.engine.runner import ENDING_POLL_S, AttemptRunner
from gpu_provider.engine.wake import WaitWake
from gpu_provider.engine.watch import ENDED
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import OnDemand, Spot, SpotFallback
from gpu_provider.runtime.output import end_of_log_line
from gpu_provider.runtime.signals import STOP_NOTICE
from gpu_provider.triggers import events
from tests.batch_world import BatchWorld
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("scripted")
log = logging.getLogger("test-recovery-steps")

#: the poll interval of these waits: a wait that ended well before it did not sleep it out
SLOW = 30.0
PREEMPTED = JobStatus(
    state=JobState.PREEMPTED, reason="Host EC2 (instance i-0abc) terminated.", interruption=names.PREEMPTED
)


def _record(job_id: str, attempt: int = 1, capacity: str = names.SPOT) -> AttemptRecord:
    handle = JobHandle("scripted", job_id, f"gp-{job_id}", attempt, capacity, time.time() - 10)
    return AttemptRecord.new(handle, try_number=1)


def _runner(records: list[AttemptRecord], policy: object = None, **kwargs: object) -> AttemptRunner:
    engine = AttemptEngine(policy or SpotFallback(), records, try_number=1, backend_name="scripted")  # type: ignore[arg-type]
    return AttemptRunner(
        ScriptedBackend(),
        engine,
        log=log,
        label="Airflow task d.t of run r",
        stop=threading.Event(),
        persist=lambda records: None,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("policy", [SpotFallback(), Spot(), OnDemand()], ids=lambda p: type(p).__name__)
def test_an_interruption_is_followed_by_its_next_attempt_at_once_by_default(policy: object) -> None:
    record = _record("j1")
    ScriptedBackend.table["j1"] = PREEMPTED
    step = _runner([record], policy).after_wait(record, PREEMPTED, ENDED)
    assert isinstance(step, Submit) and step.attempt == 2, step
    assert step.delay == 0.0, "no backoff unless the policy sets one"
    assert SpotFallback(backoff=2).backoff_delay(1) <= 2.0 and SpotFallback().backoff_delay(5) == 0.0


def test_an_interrupted_attempts_late_log_lines_are_read_after_the_next_submission(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = _record("j1"), _record("j2", 2, names.ON_DEMAND)
    ScriptedBackend.table["j1"] = PREEMPTED
    ScriptedBackend.log_lines["j1"] = ["stop requested at step 40"]
    runner = _runner([first, second])
    with caplog.at_level(logging.INFO, logger=log.name):
        status, outcome = runner.wait(first, poll_interval=SLOW)
        assert (status.state, outcome) == (JobState.PREEMPTED, ENDED)
        assert runner.unsettled is not None, "the late lines are left for after the next submission"
        # a line the service delivers late, while the next attempt is being submitted
        ScriptedBackend.log_lines["j1"].append("checkpoint saved, exiting")
        ScriptedBackend.table["j2"] = JobStatus(state=JobState.SUCCEEDED)
        runner.wait(second, poll_interval=SLOW)  # the next attempt's wait reads the earlier one's rest first
    copied = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[job]")]
    assert copied == ["[job] stop requested at step 40", "[job] checkpoint saved, exiting"], copied
    assert runner.unsettled is None


def test_what_is_left_of_an_interrupted_attempts_log_is_read_when_the_try_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = _record("j1")
    ScriptedBackend.table["j1"] = PREEMPTED
    runner = _runner([record])
    runner.wait(record, poll_interval=SLOW)
    ScriptedBackend.log_lines["j1"] = ["the last words"]
    with caplog.at_level(logging.INFO, logger=log.name):
        runner.close()  # no next attempt (budget spent, a zombie standing down, a deferral): the try ends
    assert "[job] the last words" in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    "line",
    [f"gpu_provider: SIGTERM{STOP_NOTICE}", f"[node 0] {end_of_log_line(0, 1, 143)}"],
    ids=["stop-notice", "end-of-log-marker"],
)
def test_a_log_saying_the_job_is_ending_brings_the_next_status_read_forward(line: str) -> None:
    record = _record("j1")
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING)
    ScriptedBackend.log_lines["j1"] = ["step 10", line]

    def service_reports_the_end(status: JobStatus) -> None:
        # the service says so only after the job's log did: from the first sample on
        ScriptedBackend.table["j1"] = PREEMPTED

    runner = _runner([record], on_status=service_reports_the_end)
    started = time.monotonic()
    status, _ = runner.wait(record, poll_interval=SLOW)
    took = time.monotonic() - started
    assert status.state is JobState.PREEMPTED
    assert len(ScriptedBackend.polls) == 2, ScriptedBackend.polls
    assert took < SLOW / 2, f"the second read came {took:.1f}s later, not about {ENDING_POLL_S}s"


def test_a_log_without_an_ending_keeps_the_poll_interval() -> None:
    record = _record("j1")
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING)
    ScriptedBackend.log_lines["j1"] = ["step 10", "gpu_provider: output_uri=file:///x", "SIGTERM handling is on"]
    runner = _runner([record])
    killer = threading.Timer(3 * ENDING_POLL_S, runner.stop.set)  # the task is killed a few ending-reads later
    killer.start()
    try:
        with pytest.raises(Exception, match="cancelled because this task was killed"):
            runner.wait(record, poll_interval=SLOW)
    finally:
        killer.cancel()
    assert len(ScriptedBackend.polls) <= 1, "nothing in the log said the job was ending: one read per poll interval"


@pytest.mark.parametrize("setting", [None, "False", "True"])
def test_a_sync_wait_listens_to_its_backends_events_only_when_turned_on(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch, setting: str | None
) -> None:
    """``[gpu_provider] worker_wait_events`` (default off): each listening task process opens its own reader."""
    url = batch.emulator.client("sqs").create_queue(QueueName=f"gpu-events-worker-{setting}")["QueueUrl"]
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL", url)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS", "1")
    if setting is not None:
        monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__WORKER_WAIT_EVENTS", setting)
    wake = WaitWake(BatchBackend(**batch.queues), log)
    try:
        wake.follow(JobHandle("batch", "job-1", "gp-job-1", 1, names.SPOT, time.time()))
        listening = f"sqs:{url}" in events.running_sources()
    finally:
        wake.close()
    assert listening is (setting == "True")
    assert f"sqs:{url}" not in events.running_sources(), "the reader is given back when the try's steps end"
