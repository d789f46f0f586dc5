"""``GpuJobTrigger`` and the shared, batched poller behind it.

Every deferred GPU task in a triggerer has one trigger. Triggers do not call the service
themselves: they subscribe their job to one :class:`SharedPoller` per event loop, backend and poll
interval, which asks the backend about *all* subscribed jobs in one ``Backend.poll`` call per tick
(the backend batches as its service allows, e.g. 100 ids per Batch DescribeJobs), through the
synchronous client in a thread. So N waiting jobs cost about N/100 calls per tick, not N, and no
async AWS client (aiobotocore) is needed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from gpu_provider._watch import CAPACITY_TIMEOUT, ENDED, AttemptWatch
from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus, resolve_backend

#: event statuses, one per way an attempt's wait can end
EVENT_STATUS_BY_STATE = {
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.PREEMPTED: "preempted",
    JobState.CANCELLED: "cancelled",
}


class SharedPoller:
    """Polls every subscribed job of one backend in one call per tick, on one event loop."""

    _pollers: dict[tuple[int, str, float], SharedPoller] = {}

    def __init__(self, backend: Backend, interval: float, key: tuple[int, str, float]) -> None:
        self.backend = backend
        self.interval = interval
        self._key = key
        self._subscribers: dict[str, tuple[JobHandle, list[asyncio.Queue[JobStatus | BaseException]]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0
        self.calls = 0

    @classmethod
    def for_backend(cls, backend: Backend, interval: float) -> SharedPoller:
        loop = asyncio.get_running_loop()
        key = (id(loop), json.dumps(backend.spec(), sort_keys=True, default=str), float(interval))
        poller = cls._pollers.get(key)
        if poller is None:
            poller = cls._pollers[key] = cls(backend, interval, key)
        return poller

    def subscribe(self, handle: JobHandle) -> asyncio.Queue[JobStatus | BaseException]:
        queue: asyncio.Queue[JobStatus | BaseException] = asyncio.Queue()
        entry = self._subscribers.setdefault(handle.job_id, (handle, []))
        entry[1].append(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"gpu-poller-{self.backend.name}")
        return queue

    def unsubscribe(self, handle: JobHandle, queue: asyncio.Queue[JobStatus | BaseException]) -> None:
        entry = self._subscribers.get(handle.job_id)
        if entry is None:
            return
        if queue in entry[1]:
            entry[1].remove(queue)
        if not entry[1]:
            del self._subscribers[handle.job_id]

    async def _run(self) -> None:
        try:
            while self._subscribers:
                await self._tick()
                await asyncio.sleep(self.interval)
        finally:
            if self._pollers.get(self._key) is self and not self._subscribers:
                del self._pollers[self._key]

    async def _tick(self) -> None:
        handles = [entry[0] for entry in self._subscribers.values()]
        self.ticks += 1
        self.calls += 1
        result: dict[str, JobStatus] | BaseException
        try:
            result = await asyncio.to_thread(self.backend.poll, handles)
        except Exception as err:  # delivered to every subscriber; they decide when to give up
            result = err
        for job_id, (_, queues) in list(self._subscribers.items()):
            item: JobStatus | BaseException
            if isinstance(result, BaseException):
                item = result
            elif job_id in result:
                item = result[job_id]
            else:
                item = LookupError(f"{self.backend.name} backend returned no status for job {job_id}")
            for queue in queues:
                queue.put_nowait(item)


class GpuJobTrigger(BaseTrigger):
    """Waits for one attempt of a GPU job to end, or for its spot wait deadline.

    :param backend: the backend in mapping form (``Backend.spec()``), JSON-serialisable.
    :param handle: the attempt's ``JobHandle.to_dict()``.
    :param poll_interval: seconds between status checks (shared with other triggers of the backend).
    :param spot_wait_timeout: seconds from submission after which a still-queued attempt fires
        ``capacity_timeout`` (None: wait forever).
    :param stream_logs: copy the job's new log lines into the task log on every tick.
    :param task_label: names the task and run in the reason given to the service when a kill cancels the job.
    """

    def __init__(
        self,
        *,
        backend: dict[str, Any],
        handle: dict[str, Any],
        poll_interval: float = 30.0,
        spot_wait_timeout: float | None = None,
        stream_logs: bool = True,
        task_label: str | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.backend = dict(backend)
        self.handle = dict(handle)
        self.poll_interval = float(poll_interval)
        self.spot_wait_timeout = None if spot_wait_timeout is None else float(spot_wait_timeout)
        self.stream_logs = stream_logs
        self.task_label = task_label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "backend": self.backend,
                "handle": self.handle,
                "poll_interval": self.poll_interval,
                "spot_wait_timeout": self.spot_wait_timeout,
                "stream_logs": self.stream_logs,
                "task_label": self.task_label,
            },
        )

    def _event(self, status: str, job_status: JobStatus | None, message: str) -> TriggerEvent:
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {
                "status": status,
                "handle": self.handle,
                "job_status": job_status.to_dict() if job_status else None,
                "message": message,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        backend = resolve_backend(self.backend)
        handle = JobHandle.from_dict(self.handle)
        poller = SharedPoller.for_backend(backend, self.poll_interval)
        queue = poller.subscribe(handle)
        self.log.info(
            "Waiting for %s job %s (attempt %d, %s); status every %.0fs, shared with the other jobs of this backend.",
            backend.name,
            handle.job_id,
            handle.attempt,
            handle.capacity,
            self.poll_interval,
        )
        watch = AttemptWatch(
            backend, handle, spot_wait_timeout=self.spot_wait_timeout, log=self.log, stream_logs=self.stream_logs
        )
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    give_up = watch.failed_read(item)
                    if give_up:
                        yield self._event("poll_error", None, give_up)
                        return
                    continue
                outcome = await asyncio.to_thread(watch.read, item)  # reads logs: not on the event loop
                if outcome == ENDED:
                    yield self._event(
                        EVENT_STATUS_BY_STATE[item.state],
                        item,
                        f"{backend.name} job {handle.job_id} ended {item.state.value}: {item.reason or '-'}",
                    )
                    return
                if outcome == CAPACITY_TIMEOUT:
                    yield self._event(
                        "capacity_timeout",
                        item,
                        f"{backend.name} job {handle.job_id} still queued for spot capacity after "
                        f"{watch.waited():.0f}s (spot_wait_timeout={self.spot_wait_timeout:.0f}s)",
                    )
                    return
        finally:
            poller.unsubscribe(handle, queue)

    async def on_kill(self) -> None:
        """The deferred task was killed by a user: cancel the job so it stops billing."""
        backend = resolve_backend(self.backend)
        handle = JobHandle.from_dict(self.handle)
        who = self.task_label or f"Airflow task of job {handle.name}"
        await asyncio.to_thread(backend.cancel, handle, f"{who} was killed while deferred")
