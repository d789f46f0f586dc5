"""AWS Batch and SageMaker events in the triggerer: EventBridge rules deliver the services' state changes
to an SQS queue, the shared poller long-polls it and polls the jobs named at once; a lost event is covered
by the backstop tick, a queue that cannot be read falls back to polling (issue 29).

The emulators put each job state change on moto's event bus; moto's rule (the pattern ``gpu-provider
events render`` prints) delivers it to the queue."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_provider.backends.base import Backend, JobHandle, JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.job import GpuResources
from gpu_provider.testing.events import wire_event_queue
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.batch_world import BatchWorld
from tests.sagemaker_world import SageMakerWorld

#: the regular tick in these tests: an end seen well before it came from an event
SLOW = 30.0


def wire(client: Callable[[str], Any], backend: str, name: str) -> tuple[str, str]:
    """A queue and the rule ``render`` describes, on the emulator's moto; returns (queue URL, rule name)."""
    return wire_event_queue(client, backend, name)


def submit(backend: Backend, task: str, seconds: float) -> JobHandle:
    identity = JobIdentity(TaskKey("aws_events", task, "manual__1"), try_number=1, attempt=1, capacity="on-demand")
    command = (sys.executable, "-c", f"import time; time.sleep({seconds})")
    return backend.submit(JobRequest(identity, command, {}, GpuResources(), "on-demand", image="x"))


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def poller_of(backend: Backend) -> SharedPoller | None:
    pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
    return pollers[0] if pollers else None


async def wait_end(backend: Backend, handle: JobHandle, interval: float) -> str:
    trigger = GpuJobTrigger(backend=backend.spec(), handle=handle.to_dict(), poll_interval=interval, stream_logs=False)
    async for event in trigger.run():
        return str(event.payload["status"])
    raise AssertionError("the trigger ended without an event")


def run_until_end(backend: Backend, handle: JobHandle, interval: float, limit: float) -> tuple[str, SharedPoller]:
    async def scenario() -> tuple[str, SharedPoller]:
        waiting = asyncio.ensure_future(wait_end(backend, handle, interval))
        await until(lambda: poller_of(backend) is not None, "the poller")
        poller = poller_of(backend)
        assert poller is not None
        return await asyncio.wait_for(waiting, limit), poller

    return asyncio.run(scenario())


def visible_and_in_flight(client: Callable[[str], Any], url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes[n]) for n in names)


@pytest.fixture
def quick_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS", "1")


def test_a_batch_end_comes_from_its_event_and_foreign_messages_are_left(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch, quick_reads: None
) -> None:
    url, _ = wire(batch.emulator.client, "batch", "gpu-events-batch")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL", url)
    sqs = batch.emulator.client("sqs")
    sqs.send_message(QueueUrl=url, MessageBody="not an event")
    foreign = {"source": "aws.batch", "detail-type": "Batch Job State Change", "detail": {"jobId": "someone-else"}}
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(foreign))
    backend = BatchBackend(**batch.queues)
    # long enough that the poller's first full tick (a client to build: seconds on a loaded machine) sees it running
    handle = submit(backend, "batch", 8.0)
    started = time.monotonic()
    status, poller = run_until_end(backend, handle, SLOW, SLOW - 5)
    assert status == "succeeded"
    assert time.monotonic() - started < SLOW - 5 and poller.event_ticks >= 1, "the end came from an event"
    assert poller.flowing
    # this triggerer's events were consumed (deleted); the unreadable and the foreign message were left
    deadline = time.monotonic() + 30
    while visible_and_in_flight(batch.emulator.client, url) > 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert visible_and_in_flight(batch.emulator.client, url) == 2


def test_a_lost_batch_event_is_covered_by_the_backstop_poll(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch, quick_reads: None
) -> None:
    url, rule = wire(batch.emulator.client, "batch", "gpu-events-lost")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL", url)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__EVENT_BACKSTOP_INTERVAL", "2")
    batch.emulator.client("events").remove_targets(Rule=rule, Ids=["gpu-provider-queue"])  # events go nowhere
    backend = BatchBackend(**batch.queues)
    handle = submit(backend, "lost", 1.0)
    status, poller = run_until_end(backend, handle, 0.5, 30)
    assert status == "succeeded"
    assert poller.flowing and poller.current_interval() == 2.0, "the queue was read: the regular tick slowed"
    assert poller.event_ticks == 0, "no event came: the backstop tick saw the end"


def test_an_unreadable_queue_falls_back_to_polling_at_the_interval(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch, quick_reads: None
) -> None:
    missing = batch.emulator.client("sqs").create_queue(QueueName="gpu-events-gone")["QueueUrl"]
    batch.emulator.client("sqs").delete_queue(QueueUrl=missing)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL", missing)
    backend = BatchBackend(**batch.queues)
    handle = submit(backend, "unreadable", 1.0)
    status, poller = run_until_end(backend, handle, 0.5, 30)
    assert status == "succeeded"
    assert not poller.flowing and poller.current_interval() == 0.5


def test_a_sagemaker_end_comes_from_its_event(
    sagemaker: SageMakerWorld, monkeypatch: pytest.MonkeyPatch, quick_reads: None
) -> None:
    url, _ = wire(sagemaker.emulator.client, "sagemaker", "gpu-events-sagemaker")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__SAGEMAKER_EVENTS_QUEUE_URL", url)
    backend = SageMakerBackend(**sagemaker.options)
    # long enough that the poller's first full tick (a client to build: seconds on a loaded machine) sees it running
    handle = submit(backend, "sagemaker", 8.0)
    started = time.monotonic()
    status, poller = run_until_end(backend, handle, SLOW, SLOW - 5)
    assert status == "succeeded"
    assert time.monotonic() - started < SLOW - 5 and poller.event_ticks >= 1, "the end came from an event"


def test_a_bad_queue_setting_is_refused_with_the_setting_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__SAGEMAKER_EVENTS_QUEUE_URL", "gpu-events")
    with pytest.raises(ValueError, match=r"sagemaker_events_queue_url='gpu-events': must be an SQS queue URL"):
        SageMakerBackend(role_arn="arn:aws:iam::123456789012:role/x", output_path="s3://models/out").event_source()
    monkeypatch.delenv("AIRFLOW__GPU_PROVIDER__SAGEMAKER_EVENTS_QUEUE_URL")
    assert (
        SageMakerBackend(role_arn="arn:aws:iam::123456789012:role/x", output_path="s3://models/out").event_source()
        is None
    )


@pytest.mark.parametrize("world", ["batch", "sagemaker"])
def test_the_emulators_record_each_queue_read_with_the_client_that_signed_it(
    world: str, request: pytest.FixtureRequest
) -> None:
    """The polling benchmark counts an events-on triggerer's long polls at the emulator, told apart by client."""
    emulator = request.getfixturevalue(world).emulator
    url = emulator.client("sqs").create_queue(QueueName=f"gpu-events-counted-{world}")["QueueUrl"]
    before = len(emulator.requests())
    for key in ("reader-a", "reader-b"):
        sqs = emulator.client("sqs", aws_access_key_id=key, aws_secret_access_key="x")
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=0)
    reads = [r for r in emulator.requests(since=before) if r["action"] == "sqs:ReceiveMessage"]
    assert [(r["client"], r["body"]["QueueUrl"]) for r in reads] == [("reader-a", url), ("reader-b", url)]
