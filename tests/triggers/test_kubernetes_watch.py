"""Kubernetes events in the triggerer: one watch per namespace tells the shared poller which attempts
ended, so their end is seen within about a second at a 30 s poll interval; a dropped watch resumes
from its resourceVersion, a 410 Gone lists again, and the backstop tick covers lost events
(issue 29)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import pytest

from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.kubernetes.events import PodWatch
from gpu_provider.job import GpuResources
from gpu_provider.triggers import events
from gpu_provider.triggers.gpu_job import EVENT_COALESCE_S, GpuJobTrigger, SharedPoller
from tests.kubernetes_world import KubernetesWorld

#: the regular tick in these tests: an end seen well before it came from an event
SLOW = 30.0
WATCH = "app.kubernetes.io/managed-by=airflow-provider-gpu"


def submit(backend: KubernetesBackend, task: str, seconds: float, *, marker: str | None = None) -> JobHandle:
    """A pod that runs ``seconds`` and, if ``marker`` is given, writes the time it ends there."""
    code = f"import time; time.sleep({seconds})"
    if marker:
        code += f"; open({marker!r}, 'w').write(repr(time.time()))"
    identity = JobIdentity(TaskKey("events", task, "manual__1"), try_number=1, attempt=1, capacity="on-demand")
    request = JobRequest(identity, (sys.executable, "-c", code), {}, GpuResources(), "on-demand", image="x")
    return backend.submit(request)


async def wait_end(backend: KubernetesBackend, handle: JobHandle, interval: float) -> tuple[str, float]:
    trigger = GpuJobTrigger(backend=backend.spec(), handle=handle.to_dict(), poll_interval=interval, stream_logs=False)
    async for event in trigger.run():
        return str(event.payload["status"]), time.time()
    raise AssertionError("the trigger ended without an event")


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def poller_of(backend: KubernetesBackend) -> SharedPoller:
    pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
    assert len(pollers) == 1
    return pollers[0]


def test_an_end_is_seen_within_about_a_second_at_a_30s_poll_interval(kubernetes: KubernetesWorld, tmp_path) -> None:
    backend = KubernetesBackend()
    marker = tmp_path / "ended"
    handle = submit(backend, "fast", 2.0, marker=str(marker))

    async def scenario() -> tuple[str, float, int]:
        waiting = asyncio.ensure_future(wait_end(backend, handle, SLOW))
        await until(lambda: bool(SharedPoller._pollers) and poller_of(backend).flowing, "the watch to open")
        poller = poller_of(backend)
        status, seen = await asyncio.wait_for(waiting, SLOW - 5)
        return status, seen, poller.event_ticks

    status, seen, event_ticks = asyncio.run(scenario())
    assert status == "succeeded"
    ended = float(marker.read_text())
    # the process ended at `ended`; the emulator reports it, the watch streams it, the poller polls it
    assert seen - ended < 3.0, f"end seen {seen - ended:.2f}s after the job ended (poll interval {SLOW}s)"
    assert event_ticks >= 1
    watches = [r for r in kubernetes.emulator.requests("watch pods")]
    assert watches and all(r["body"]["query"]["labelSelector"] == WATCH for r in watches)


def test_one_watch_per_namespace_shared_by_pollers_and_closed_when_they_stop(kubernetes: KubernetesWorld) -> None:
    here, there = KubernetesBackend(), KubernetesBackend(namespace="other")
    jobs = [
        (here, submit(here, "a", 3.0), SLOW),
        (here, submit(here, "b", 3.0), SLOW + 1),
        (there, submit(there, "c", 3.0), SLOW),
    ]

    async def scenario() -> list[str]:
        waiting = [asyncio.ensure_future(wait_end(b, h, i)) for b, h, i in jobs]
        await until(lambda: len(kubernetes.emulator.open_watches()) == 2 and len(SharedPoller._pollers) == 3, "watches")
        open_now = sorted(ns or "" for _, ns, _ in kubernetes.emulator.open_watches())
        assert open_now == ["default", "other"], "one watch per namespace, whatever the pollers"
        assert len(events.running_sources()) == 2
        done = await asyncio.wait_for(asyncio.gather(*waiting), SLOW - 5)
        return [status for status, _ in done]

    assert asyncio.run(scenario()) == ["succeeded"] * 3
    watch_requests = kubernetes.emulator.requests("watch pods")
    assert len(watch_requests) == 2, [r["body"]["query"] for r in watch_requests]
    deadline = time.monotonic() + 20
    while (events.running_sources() or kubernetes.emulator.open_watches()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert events.running_sources() == [], "the watch thread stops with its last poller"
    assert kubernetes.emulator.open_watches() == [], "and its connection is closed"


def test_a_dropped_watch_resumes_from_its_resource_version(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    handle = submit(backend, "resumed", 3.0)

    async def scenario() -> tuple[str, float]:
        waiting = asyncio.ensure_future(wait_end(backend, handle, SLOW))
        await until(lambda: bool(kubernetes.emulator.open_watches()), "the watch to open")
        first = kubernetes.emulator.requests("watch pods")[-1]["body"]["query"]["resourceVersion"]
        kubernetes.emulator.drop_watches()
        await until(lambda: len(kubernetes.emulator.requests("watch pods")) >= 2, "the watch to resume")
        resumed = kubernetes.emulator.requests("watch pods")[-1]["body"]["query"]["resourceVersion"]
        assert int(resumed) >= int(first), (first, resumed)
        status, seen = await asyncio.wait_for(waiting, SLOW - 5)
        return status, seen

    started = time.time()
    status, seen = asyncio.run(scenario())
    assert status == "succeeded" and seen - started < SLOW - 5
    relists = [r for r in kubernetes.emulator.requests("list pods") if r["body"]["query"].get("labelSelector") == WATCH]
    assert len(relists) == 1, "a resumed watch does not list again"


def test_an_end_missed_while_the_watch_was_down_is_seen_after_the_410_relist(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    handle = submit(backend, "gone", 2.0)

    async def scenario() -> tuple[str, float, float]:
        waiting = asyncio.ensure_future(wait_end(backend, handle, SLOW))
        await until(lambda: bool(kubernetes.emulator.open_watches()), "the watch to open")
        kubernetes.emulator.faults.throttle("watch pods", 1)  # the watch cannot come back...
        kubernetes.emulator.drop_watches()
        # ...while the pod ends, and its change is compacted away
        await until(lambda: kubernetes.emulator.get("pods", handle.name)["status"]["phase"] == "Succeeded", "the end")
        kubernetes.emulator.compact()
        assert not waiting.done(), "the end came through the watch although it was down"
        lifted = time.time()
        kubernetes.emulator.faults.throttle("watch pods", 0)
        status, seen = await asyncio.wait_for(waiting, SLOW - 5)
        return status, seen, lifted

    status, seen, lifted = asyncio.run(scenario())
    assert status == "succeeded"
    assert seen - lifted < SLOW / 2, "seen after the re-list, not at the next regular tick"
    relists = [r for r in kubernetes.emulator.requests("list pods") if r["body"]["query"].get("labelSelector") == WATCH]
    assert len(relists) >= 2, "the expired resourceVersion (410) made the watch list again"


def test_a_job_whose_events_never_come_still_ends_at_the_backstop_tick(
    kubernetes: KubernetesWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__EVENT_BACKSTOP_INTERVAL", "2")
    backend = KubernetesBackend()
    handle = submit(backend, "muted", 2.0)

    async def scenario() -> tuple[str, int, bool]:
        waiting = asyncio.ensure_future(wait_end(backend, handle, 0.5))
        await until(lambda: bool(SharedPoller._pollers) and poller_of(backend).flowing, "the watch to open")
        poller = poller_of(backend)
        assert poller.current_interval() == 2.0, "while events flow, the regular tick slows to the backstop"
        kubernetes.emulator.mute_watches = True  # the connection stays open; its events are lost
        ticks = poller.event_ticks
        status, _ = await asyncio.wait_for(waiting, 20)
        return status, poller.event_ticks - ticks, poller.flowing

    status, event_ticks, flowing = asyncio.run(scenario())
    assert status == "succeeded"
    assert flowing and event_ticks == 0, "the end came from the backstop poll, not from an event"


def test_the_watch_can_be_turned_off(kubernetes: KubernetesWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__KUBERNETES_WATCH", "false")
    backend = KubernetesBackend()
    assert backend.event_source() is None
    handle = submit(backend, "off", 0.5)
    status, _ = asyncio.run(wait_end(backend, handle, 0.5))
    assert status == "succeeded"
    assert kubernetes.emulator.requests("watch pods") == []
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__KUBERNETES_WATCH", "sometimes")
    with pytest.raises(ValueError, match=r"kubernetes_watch='sometimes': must be true or false"):
        backend.event_source()


def test_changes_that_do_not_matter_to_a_poll_cost_none(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    handle = submit(backend, "labelled", 6.0)

    async def scenario() -> tuple[int, int, str]:
        waiting = asyncio.ensure_future(wait_end(backend, handle, SLOW))
        await until(lambda: bool(SharedPoller._pollers) and poller_of(backend).flowing, "the watch to open")
        poller = poller_of(backend)
        await until(lambda: kubernetes.emulator.get("pods", handle.name)["status"]["phase"] == "Running", "running")
        await until(lambda: poller.event_ticks >= 1, "the poll of the pod that started running")
        before = poller.calls
        for owner_try in range(2, 7):  # five label patches of the running pod: five MODIFIED events
            await asyncio.to_thread(backend.mark, handle, owner_try=owner_try)
        patched = int(kubernetes.emulator.get("pods", handle.name)["metadata"]["resourceVersion"])
        watch = events.running_source(f"kubernetes:kubernetes_default:{backend.namespace}")
        assert isinstance(watch, PodWatch)
        await until(lambda: int(watch.version or 0) >= patched, "the watch to stream the patches")
        await asyncio.sleep(EVENT_COALESCE_S * 2)  # past the poller's gathering of events: a poll would be in flight
        during = poller.calls - before
        status, _ = await asyncio.wait_for(waiting, SLOW - 5)
        return during, poller.event_ticks, status

    during, event_ticks, status = asyncio.run(scenario())
    assert during == 0, f"{during} polls for label patches"
    assert status == "succeeded" and event_ticks >= 2


def test_a_spot_wait_ends_on_time_while_events_hold_the_full_tick_at_its_backstop(kubernetes: KubernetesWorld) -> None:
    """While the watch is up, the poller's full tick slows to the backstop (60 s by default) and a pod
    that waits for a node sends no event; its task's own time-based rules still run on its poll_interval
    (before: the 1.5 s spot wait was seen only at the next backstop tick, a minute late)."""
    kubernetes.emulator.set_shortage("spot")
    backend = KubernetesBackend()
    identity = JobIdentity(TaskKey("events", "spotwait", "manual__1"), try_number=1, attempt=1, capacity="spot")
    request = JobRequest(identity, (sys.executable, "-c", "pass"), {}, GpuResources(), "spot", image="x")
    handle = backend.submit(request)
    trigger = GpuJobTrigger(
        backend=backend.spec(), handle=handle.to_dict(), poll_interval=0.3, stream_logs=False, spot_wait_timeout=1.5
    )

    async def scenario() -> tuple[str, float, bool]:
        started = time.monotonic()
        async for event in trigger.run():
            flowing = bool(SharedPoller._pollers) and poller_of(backend).flowing
            return str(event.payload["status"]), time.monotonic() - started, flowing
        raise AssertionError("the trigger ended without an event")

    status, waited, flowing = asyncio.run(asyncio.wait_for(scenario(), 50))
    assert status == "capacity_timeout"
    assert flowing, "the watch was not up: this test is about the slowed tick"
    assert waited < 20, f"the spot wait of 1.5 s ended after {waited:.1f}s"
