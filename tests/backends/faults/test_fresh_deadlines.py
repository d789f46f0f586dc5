"""Deadlines act on fresh state (issue 36, item 1), on every backend world with its event source on.

With events flowing, the shared poller's full tick slows to the backstop (60 s), so a deferred task's last
status can be a minute old. A job whose RUNNING event is lost must not be cancelled as "still queued" when its
``queue_timeout`` comes: the trigger reads the job fresh before it fires, and the task, which would stop it,
reads it fresh again. The same for the budget and the restart limit: a stop acts only on a fresh read.

The local backend has no event source: its world polls at the poll interval (the same test, no event to lose).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import SpotFallback, names
from gpu_provider.backends.base import Backend, JobState, JobStatus
from gpu_provider.engine.attempts import AttemptEngine, Fail, Succeed, Wait
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.engine.watch import BUDGET, QUEUE_TIMEOUT, RESTART_LIMIT
from gpu_provider.exceptions import GpuJobBudgetError
from gpu_provider.operators._deferral import check_event, outcome_of
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import OnDemand
from gpu_provider.testing.events import wire_event_queue
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.backends.contract.worlds import LONG_JOB, poll_one, py, wait_state
from tests.harness import wait_for
from tests.operators.suite.worlds import (  # noqa: F401 (operator_world: fixture "world")
    BatchOperatorWorld,
    KubernetesOperatorWorld,
    OperatorWorld,
    SageMakerOperatorWorld,
    operator_world,
)

log = logging.getLogger("test-fresh-deadlines")
LABEL = "Airflow task d.t of run r"
#: the queue timeout of the stale-status test: the job must be running (its event lost) well before it
QUEUE_TIMEOUT_S = 12.0
POLL_S = 0.3


def events_on(world: OperatorWorld, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[Callable[[], None], ...]:
    """Turn the world's event source on; returns (lose its events from now on, deliver them again)."""
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__EVENT_BACKSTOP_INTERVAL", "120")
    if isinstance(world, (BatchOperatorWorld, SageMakerOperatorWorld)):
        kind = "batch" if isinstance(world, BatchOperatorWorld) else "sagemaker"
        client = world.emulator.client
        url, rule = wire_event_queue(client, kind, f"gpu-fresh-{kind}-{name}")
        monkeypatch.setenv(f"AIRFLOW__GPU_PROVIDER__{kind.upper()}_EVENTS_QUEUE_URL", url)
        monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS", "1")

        def lose() -> None:
            client("events").remove_targets(Rule=rule, Ids=["gpu-provider-queue"])

        return lose, lambda: wire_event_queue(client, kind, f"gpu-fresh-{kind}-{name}") and None
    if isinstance(world, KubernetesOperatorWorld):
        monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__KUBERNETES_WATCH", "True")
        emulator = world.emulator

        def mute(on: bool) -> None:
            emulator.mute_watches = on

        return lambda: mute(True), lambda: mute(False)
    return lambda: None, lambda: None  # local: no event source


def _runner(backend: Backend, record: AttemptRecord, **options: Any) -> AttemptRunner:
    policy = options.pop("policy", OnDemand())
    engine = AttemptEngine(policy, [record], try_number=1, backend_name=backend.name)
    return AttemptRunner(
        backend,
        engine,
        log=log,
        label=LABEL,
        stop=threading.Event(),
        persist=lambda r: None,
        cancel_retry_s=0.0,
        **options,
    )


def _poller(backend: Backend) -> SharedPoller | None:
    found = [p for p in SharedPoller._pollers.values() if p.backend == backend]
    return found[0] if found else None


def test_a_lost_running_event_past_queue_timeout_stops_nothing_and_the_task_succeeds(
    world: OperatorWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lose, deliver = events_on(world, monkeypatch, "lost")
    backend = world.backend()
    release = tmp_path / "release"
    job = py(f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)\nprint('done')")
    world.hold_capacity()
    handle = backend.submit(world.request("fresh_lost", job))
    record = AttemptRecord.new(handle, try_number=1)
    trigger = GpuJobTrigger(
        backend=backend.spec(),
        handle=handle.to_dict(),
        poll_interval=POLL_S,
        queue_timeout=QUEUE_TIMEOUT_S,
        stream_logs=False,
        task_label=LABEL,
        try_number=1,
    )
    lose()

    async def scenario() -> dict[str, Any]:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        poller = await asyncio.to_thread(wait_for, lambda: _poller(backend), 30, "the shared poller")
        await asyncio.to_thread(wait_for, lambda: poller.ticks >= 1, 60, "the poller's first tick (job queued)")
        if world.name != "local":  # the event source is read: the full tick slows to the backstop
            await asyncio.to_thread(wait_for, lambda: poller.flowing, 60, "the event source to flow")
            await asyncio.sleep(1.0)  # a source that starts flowing has the poller look at every job once more
        ticks = poller.ticks
        world.release_capacity()
        await asyncio.to_thread(wait_state, backend, handle, JobState.RUNNING)
        running_at = time.time()
        assert running_at < handle.submitted_at + QUEUE_TIMEOUT_S - 2, (
            f"the job ran {running_at - handle.submitted_at:.1f}s after its submission: too late for this test"
        )
        # past queue_timeout, with several looks of the trigger at its last (stale, QUEUED) status
        while time.time() < handle.submitted_at + QUEUE_TIMEOUT_S + 6 * POLL_S:
            assert not waiting.done(), f"the trigger fired on a running job: {waiting.result().payload}"
            await asyncio.sleep(0.1)
        assert not waiting.done(), f"the trigger fired on a running job: {waiting.result().payload}"
        assert world.stopped() == [], "nothing may be stopped"
        if world.name != "local":  # the trigger's last status is the stale QUEUED one
            assert poller.ticks == ticks, "no status read reached the trigger after the job started"
        deliver()
        release.touch()
        event = await asyncio.wait_for(waiting, 150)
        return dict(event.payload)

    try:
        payload = asyncio.run(scenario())
    finally:
        world.release_capacity()
        release.touch()
    check_event(payload)
    assert payload["status"] == names.EVENT_SUCCEEDED, payload
    # the task resumes with the event, as execute_complete does
    step = _runner(backend, record, queue_timeout=QUEUE_TIMEOUT_S).after_wait(
        record, JobStatus.from_dict(payload["job_status"]), outcome_of(payload)
    )
    assert isinstance(step, Succeed), step
    assert world.stopped() == [], "the running job was never stopped"


def test_a_stale_queued_status_at_queue_timeout_is_read_again_before_the_task_stops_anything(
    world: OperatorWorld,
) -> None:
    """The runner's own check (a trigger of an older provider version fires on its stale sample): the task reads
    the job now, finds it running, records that and keeps waiting."""
    backend = world.backend()
    handle = backend.submit(world.request("fresh_queue", LONG_JOB))
    wait_state(backend, handle, JobState.RUNNING)
    record = AttemptRecord.new(handle, try_number=1)
    runner = _runner(backend, record, queue_timeout=1.0)
    step = runner.after_wait(record, JobStatus(state=JobState.QUEUED), QUEUE_TIMEOUT)
    assert step == Wait(record), step
    assert record.state is JobState.RUNNING, "what was read is recorded"
    assert world.stopped() == []
    assert poll_one(backend, handle).state is JobState.RUNNING


def test_the_budget_stops_a_job_only_when_a_fresh_read_is_over_it(world: OperatorWorld) -> None:
    backend = world.backend()
    handle = backend.submit(world.request("fresh_budget", LONG_JOB))
    wait_state(backend, handle, JobState.RUNNING)
    record = AttemptRecord.new(handle, try_number=1)
    limit = {"usd_per_gpu_second": 1.0, "remaining_usd": 3600.0, "max_cost_usd": 3600.0, "spent_usd": 0.0}
    runner = _runner(backend, record, cost_limit=lambda r: dict(limit))
    stale = JobStatus(state=JobState.RUNNING, gpu_seconds=7200.0)  # a sample that is not the job's
    assert runner.after_wait(record, stale, BUDGET) == Wait(record)
    assert world.stopped() == [], "the job's fresh cost is under the budget: nothing stopped"
    limit["remaining_usd"] = 0.0  # now the fresh read is over the budget: the stop goes
    step = runner.after_wait(record, stale, BUDGET)
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobBudgetError), step
    assert [job_id for job_id, _ in world.stopped()] in ([handle.job_id], [handle.name]), world.stopped()


def test_the_restart_limit_stops_a_job_only_when_a_fresh_read_shows_the_restarts(world: OperatorWorld) -> None:
    """A stale sample says the service restarted the spot job; the job's fresh status says it did not."""
    backend = world.backend()
    handle = backend.submit(world.request("fresh_restart", LONG_JOB, capacity=names.SPOT))
    wait_state(backend, handle, JobState.RUNNING)
    record = AttemptRecord.new(handle, try_number=1)
    runner = _runner(backend, record, policy=SpotFallback(after_preemptions=1, backoff=0))
    stale = JobStatus(state=JobState.RUNNING, restarts=5, reason="a sample that is not the job's")
    assert runner.after_wait(record, stale, RESTART_LIMIT) == Wait(record)
    assert world.stopped() == [], "the service did not restart the job: nothing stopped"
    assert record.interruption is None and record.restarts == 0, record
