"""``GpuJobTrigger`` and the shared, batched poller behind it.

Every deferred GPU task in a triggerer has one trigger. Triggers do not call the service
themselves: they subscribe their job to one :class:`SharedPoller` per event loop, backend and poll
interval, which asks the backend about *all* subscribed jobs in one ``Backend.poll`` call per tick
(the backend batches as its service allows, e.g. 100 ids per Batch DescribeJobs), through the
synchronous client in a thread. So N waiting jobs cost about N/100 calls per tick, not N, and no
async AWS client (aiobotocore) is needed. A job's end is final: once a tick has seen it, the
service is not asked about that job again while its triggers finish.

Where the backend has an event source (:meth:`Backend.event_source`: a Kubernetes watch, EventBridge
events from an SQS queue), the jobs an event names are polled at once, in one batched call, and the
regular tick slows to ``[gpu_provider] event_backstop_interval`` (default 60 s, never faster than the
poll interval) while events flow: a lost event costs at most that. When the source fails, the tick
returns to the poll interval. Events are hints only: a job's status always comes from ``poll``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Collection, Mapping
from typing import Any, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from gpu_provider import names
from gpu_provider.backends.base import (
    Backend,
    EventSink,
    JobHandle,
    JobState,
    JobStatus,
    provider_config,
    resolve_backend,
)
from gpu_provider.engine.calls import poll_one, read_now, read_owner
from gpu_provider.engine.fresh import RECHECKED
from gpu_provider.engine.watch import (
    BUDGET,
    CAPACITY_TIMEOUT,
    DEADLINE,
    ENDED,
    NEVER_STARTS,
    QUEUE_TIMEOUT,
    RESTART_LIMIT,
    AttemptWatch,
)
from gpu_provider.triggers import events

log = logging.getLogger(__name__)

#: seconds between regular ticks while events flow, unless ``[gpu_provider] event_backstop_interval`` says
DEFAULT_EVENT_BACKSTOP_S = 60.0
#: seconds the poller gathers events before polling the jobs they name
EVENT_COALESCE_S = 0.2
#: the shortest a trigger waits before it reads its last status again for the time-based rules
MIN_RELOOK_S = 0.2

#: event statuses, one per way an attempt's wait can end
EVENT_STATUS_BY_STATE = {
    JobState.SUCCEEDED: names.EVENT_SUCCEEDED,
    JobState.FAILED: names.EVENT_FAILED,
    JobState.PREEMPTED: names.EVENT_PREEMPTED,
    JobState.CANCELLED: names.EVENT_CANCELLED,
}
DEADLINE_EVENT = names.EVENT_DEADLINE
#: the longest a killed trigger reads the stopped job's status for its figures (within on_kill's timeout)
KILL_STATUS_READ_S = 10.0
#: wait outcomes other than the job's end, as event statuses
EVENT_STATUS_BY_OUTCOME = {
    CAPACITY_TIMEOUT: names.EVENT_CAPACITY_TIMEOUT,
    QUEUE_TIMEOUT: names.EVENT_QUEUE_TIMEOUT,
    DEADLINE: names.EVENT_DEADLINE,
    RESTART_LIMIT: names.EVENT_RESTART_LIMIT,
    BUDGET: names.EVENT_BUDGET,
    NEVER_STARTS: names.EVENT_NEVER_STARTS,
}


_T = TypeVar("_T")
#: what :func:`within` returns when the time ran out first
TIMED_OUT: Any = object()


async def within(awaitable: Awaitable[_T], timeout: float | None) -> _T:
    """``awaitable``'s result, or :data:`TIMED_OUT` after ``timeout`` seconds (None: no limit).

    Not ``asyncio.wait_for``: on Python 3.10 and 3.11 it swallows a cancellation that arrives as the
    awaited thing completes, and a trigger the triggerer cancelled (its task cleared, killed or
    moved) then went on waiting for ever. Here the caller's cancellation always propagates; a queue
    item not yet taken when the time runs out stays in the queue.
    """
    inner = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    finally:
        if not inner.done():
            inner.cancel()
    return inner.result() if done else TIMED_OUT


def event_backstop_interval() -> float:
    """``[gpu_provider] event_backstop_interval`` in seconds (default 60)."""
    raw = provider_config("event_backstop_interval")
    if not raw:
        return DEFAULT_EVENT_BACKSTOP_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ValueError(
            f"[gpu_provider] event_backstop_interval={raw!r}: must be a number of seconds from more than 0 to 3600"
        )
    return value


class _PollerSink(EventSink):
    """Hands an event source's news (from its thread) to a poller on its event loop."""

    def __init__(self, poller: SharedPoller, loop: asyncio.AbstractEventLoop) -> None:
        self.poller, self.loop = poller, loop

    def changed(self, keys: Collection[str] | None) -> None:
        frozen = None if keys is None else frozenset(keys)
        try:
            self.loop.call_soon_threadsafe(self.poller._note_changed, frozen)
        except RuntimeError:  # the loop closed: nobody listens any more
            pass

    def watches(self, key: str) -> bool:
        return key in self.poller._watched  # a set read from the source's thread: atomic

    def up(self, flowing: bool) -> None:
        try:
            self.loop.call_soon_threadsafe(self.poller._note_flowing, flowing)
        except RuntimeError:
            pass


class SharedPoller:
    """Polls every subscribed job of one backend in one call per tick, on one event loop."""

    _pollers: dict[tuple[int, str, float], SharedPoller] = {}

    def __init__(self, backend: Backend, interval: float, key: tuple[int, str, float]) -> None:
        self.backend = backend
        #: the event loop it polls on (a later loop may reuse a closed one's id: the key alone cannot tell)
        self._loop = weakref.ref(asyncio.get_running_loop())
        self.interval = interval
        self._key = key
        self._subscribers: dict[str, tuple[JobHandle, list[asyncio.Queue[JobStatus | BaseException]]]] = {}
        # a job's end is final: its subscribers that have not yet left get it again, the service is not asked
        self._ended: dict[str, JobStatus] = {}
        self._task: asyncio.Task[None] | None = None
        #: batched polls made so far, one ``Backend.poll`` call each (tests and diagnostics count them)
        self.ticks = 0
        #: ticks of the jobs named by events (counted in ``ticks`` and ``calls`` too)
        self.event_ticks = 0
        #: seconds between regular ticks while the event source says events flow
        self.backstop = max(interval, event_backstop_interval())
        self.flowing = False
        self._changed: set[str] = set()
        self._all_changed = False
        self._wake: asyncio.Event | None = None
        #: the job ids and names of the subscribed jobs, for event sources (replaced, never changed in place)
        self._watched: frozenset[str] = frozenset()

    @classmethod
    def for_backend(cls, backend: Backend, interval: float) -> SharedPoller:
        loop = asyncio.get_running_loop()
        key = (id(loop), json.dumps(backend.spec(), sort_keys=True, default=str), float(interval))
        poller = cls._pollers.get(key)
        if poller is None or poller._loop() is not loop:
            poller = cls._pollers[key] = cls(backend, interval, key)
        return poller

    def subscribe(self, handle: JobHandle) -> asyncio.Queue[JobStatus | BaseException]:
        queue: asyncio.Queue[JobStatus | BaseException] = asyncio.Queue()
        entry = self._subscribers.setdefault(handle.job_id, (handle, []))
        entry[1].append(queue)
        self._watched = self._watched | {handle.job_id, handle.name}
        if handle.job_id in self._ended:
            queue.put_nowait(self._ended[handle.job_id])
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
            self._ended.pop(handle.job_id, None)
            self._watched = frozenset(k for h, _ in self._subscribers.values() for k in (h.job_id, h.name))
        if not self._subscribers and self._wake is not None:
            self._wake.set()  # the poller ends now, and with it its hold on the event source

    @property
    def calls(self) -> int:
        """Service calls made so far: one batched poll per tick, so always :attr:`ticks`."""
        return self.ticks

    def current_interval(self) -> float:
        """Seconds between regular ticks now: the backstop while events flow, else the poll interval."""
        return self.backstop if self.flowing else self.interval

    def _note_changed(self, keys: frozenset[str] | None) -> None:
        if keys is None:
            self._all_changed = True
        else:
            self._changed.update(keys)
        if self._wake is not None:
            self._wake.set()

    def _note_flowing(self, flowing: bool) -> None:
        if flowing != self.flowing:
            log.info(
                "%s events %s: regular status checks every %.0fs.",
                self.backend.name,
                "flow" if flowing else "stopped",
                self.backstop if flowing else self.interval,
            )
        self.flowing = flowing
        if self._wake is not None:
            self._wake.set()

    def _attach_events(self) -> Any:
        try:
            source = self.backend.event_source()
        except Exception as err:  # a bad setting must not stop the polling
            log.warning("%s event source unavailable (%s); polling only.", self.backend.name, err)
            return None
        if source is None:
            return None
        return events.attach(source, _PollerSink(self, asyncio.get_running_loop()))

    async def _run(self) -> None:
        self._wake = asyncio.Event()
        detach = self._attach_events()
        try:
            last_regular = -float("inf")
            while self._subscribers:
                if self._all_changed or time.monotonic() >= last_regular + self.current_interval():
                    self._all_changed = False
                    self._changed.clear()
                    await self._tick()
                    last_regular = time.monotonic()
                elif self._changed:
                    # events that come together (many jobs ending at once, a pod's last changes) share one poll
                    await asyncio.sleep(EVENT_COALESCE_S)
                    keys, self._changed = self._changed, set()
                    handles = [
                        h
                        for job_id, (h, _) in self._subscribers.items()
                        if job_id not in self._ended and (job_id in keys or h.name in keys)
                    ]
                    if handles:
                        self.event_ticks += 1
                        await self._tick(handles)
                if self._changed or self._all_changed:
                    await asyncio.sleep(0)
                    continue
                self._wake.clear()
                # the wait ends at the next regular tick, at the interval of the moment (events flowing or not),
                # or at an event, a change of flow or the last subscriber leaving
                wait = last_regular + self.current_interval() - time.monotonic()
                if wait <= 0:
                    await asyncio.sleep(0)
                    continue
                await within(self._wake.wait(), wait)
        finally:
            if detach is not None:
                detach()
            if self._pollers.get(self._key) is self and not self._subscribers:
                del self._pollers[self._key]

    async def _tick(self, only: list[JobHandle] | None = None) -> None:
        """One batched ``poll``: of every job not yet ended, or of ``only`` (the jobs events named)."""
        if only is None:
            handles = [entry[0] for job_id, entry in self._subscribers.items() if job_id not in self._ended]
        else:
            handles = only
        if not handles:  # every job left has ended; its triggers are still reading the end
            return
        self.ticks += 1
        result: Mapping[str, JobStatus | Exception] | BaseException
        try:
            result = await asyncio.to_thread(self.backend.poll, handles)
        except Exception as err:  # a failure of the whole call: every subscriber counts it
            result = err
        polled = {h.job_id for h in handles}
        for job_id, (_, queues) in list(self._subscribers.items()):
            item: JobStatus | BaseException
            if job_id in self._ended or job_id not in polled:
                continue
            if isinstance(result, BaseException):
                item = result
            elif job_id in result:
                item = result[job_id]
            else:  # against the contract; counted for this job alone, like a per-job error
                item = LookupError(f"{self.backend.name} backend returned no status for job {job_id}")
            if isinstance(item, JobStatus) and item.state.terminal:
                self._ended[job_id] = item
            for queue in queues:
                queue.put_nowait(item)


class GpuJobTrigger(BaseTrigger):
    """Waits for one attempt of a GPU job to end, or for its spot wait deadline.

    :param backend: the backend in mapping form (``Backend.spec()``), JSON-serialisable.
    :param handle: the attempt's ``JobHandle.to_dict()``.
    :param poll_interval: seconds between status checks (shared with other triggers of the backend).
    :param spot_wait_timeout: seconds of waiting for capacity after which a still-queued attempt
        fires ``capacity_timeout`` (None: wait forever).
    :param queue_timeout: seconds of waiting after which a still-queued attempt not covered by
        ``spot_wait_timeout`` fires ``queue_timeout`` (None: wait forever).
    :param deadline: Unix time when the task's ``execution_timeout`` ends: the trigger fires
        ``deadline`` then, and the task cancels the job (Airflow does not time deferred tasks out).
    :param stream_logs: copy the job's new log lines into the task log on every tick.
    :param task_label: names the task and run in the reason given to the service when a kill cancels the job.
    :param restart_limit: restarts inside the job (managed spot) after which the trigger fires
        ``restart_limit`` so the task stops the attempt and the policy's next one runs (None: never).
    :param cost_limit: the attempt's running budget (``usd_per_gpu_second``, ``remaining_usd``, ...): the
        trigger fires ``budget`` once the job's GPU-seconds cost that much, and the task stops the job.
    :param try_number: the Airflow try that deferred; a kill leaves the job alone when a later try owns it.
    :param spend: the team, nodes and price of the attempt (``SpendControl.kill_report``): a kill that
        stops the job reports its end once, with the service's GPU time and cost, in the metrics and the
        team's month (the triggerer cannot write the task's records; the GPU page reads the end from the
        service). ``None``: the kill stops the job and reports nothing.
    :param spot_return: back to spot (``SpotReturn.watch_for``): while the attempt runs on on-demand, the trigger
        reads spot capacity every ``check_every`` and fires ``spot_returned`` (with the reading, ``spot_return``)
        when the move pays; the task then asks the job to checkpoint and stop. ``None``: no readings.
    """

    #: whether the task behind the trigger owns the job (and may stop it); a watching task's trigger does not
    owns_job: bool = True

    def __init__(
        self,
        *,
        backend: dict[str, Any],
        handle: dict[str, Any],
        poll_interval: float = 30.0,
        spot_wait_timeout: float | None = None,
        queue_timeout: float | None = None,
        deadline: float | None = None,
        stream_logs: bool = True,
        task_label: str | None = None,
        restart_limit: int | None = None,
        cost_limit: dict[str, float] | None = None,
        try_number: int | None = None,
        spend: dict[str, Any] | None = None,
        spot_return: dict[str, Any] | None = None,
        **_newer: Any,
    ) -> None:
        # ``_newer``: arguments a newer provider version added; a triggerer one version behind still runs it
        super().__init__()  # type: ignore[no-untyped-call]
        self.spot_return = dict(spot_return) if spot_return else None
        self.backend = dict(backend)
        self.handle = dict(handle)
        self.poll_interval = float(poll_interval)
        self.spot_wait_timeout = None if spot_wait_timeout is None else float(spot_wait_timeout)
        self.queue_timeout = None if queue_timeout is None else float(queue_timeout)
        self.deadline = None if deadline is None else float(deadline)
        self.stream_logs = stream_logs
        self.task_label = task_label
        self.restart_limit = None if restart_limit is None else int(restart_limit)
        self.cost_limit = dict(cost_limit) if cost_limit else None
        self.try_number = None if try_number is None else int(try_number)
        self.spend = dict(spend) if spend else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "backend": self.backend,
                "handle": self.handle,
                "poll_interval": self.poll_interval,
                "spot_wait_timeout": self.spot_wait_timeout,
                "queue_timeout": self.queue_timeout,
                "deadline": self.deadline,
                "stream_logs": self.stream_logs,
                "task_label": self.task_label,
                "restart_limit": self.restart_limit,
                "cost_limit": self.cost_limit,
                "try_number": self.try_number,
                "spend": self.spend,
                "spot_return": self.spot_return,
            },
        )

    def _event(self, status: str, job_status: JobStatus | None, message: str, **more: Any) -> TriggerEvent:
        # a deadline event may carry no sample: the task treats the job as still running
        sample = job_status or JobStatus(state=JobState.RUNNING)
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {"status": status, "handle": self.handle, "job_status": sample.to_dict(), "message": message, **more}
        )

    def _spot_return_watch(self) -> Any:
        """The spot readings of the wait (``SpotReturnWatch``), ``None`` without ``spot_return`` or for a watcher."""
        if not self.spot_return or not self.owns_job:
            return None
        from gpu_provider.capacity.spot_return import SpotReturnWatch

        return SpotReturnWatch(self.spot_return)

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
            backend,
            handle,
            capacity_wait=self.spot_wait_timeout,
            queue_timeout=self.queue_timeout,
            deadline=self.deadline,
            log=self.log,
            stream_logs=self.stream_logs,
            restart_limit=self.restart_limit,
            cost_limit=self.cost_limit,
            owner=self.owns_job,
        )
        last: JobStatus | None = None
        spot = self._spot_return_watch()
        try:
            while True:
                item = await within(queue.get(), self._next_look(last))
                if item is TIMED_OUT:
                    if last is None or watch.past_deadline():  # the deadline came while no status arrived
                        yield self._event(DEADLINE_EVENT, None, self._deadline_message(backend, handle))
                        return
                    # no news: while events flow the poller's full tick slows to its backstop, but the
                    # time-based rules (capacity wait, queue timeout, budget) are this task's own and
                    # run on its poll_interval, from the last status (unchanged, or an event would say).
                    # After a failed read, the next read is this trigger's own, at its poll_interval, as the
                    # worker's wait reads: failed reads count to the give-up at that pace, not the backstop's
                    item = await asyncio.to_thread(read_now, backend, handle) if watch.errors else last
                if isinstance(item, JobStatus):
                    last = item
                if isinstance(item, BaseException):
                    give_up = watch.failed_read(item)
                    if give_up:
                        yield self._event(names.EVENT_POLL_ERROR, None, give_up)
                        return
                    if watch.past_deadline():
                        yield self._event(DEADLINE_EVENT, None, self._deadline_message(backend, handle))
                        return
                    continue
                outcome = await asyncio.to_thread(watch.read, item)  # reads logs: not on the event loop
                if outcome in RECHECKED:
                    # a stop would follow, and the sample may be stale (a lost or late event, the backstop's
                    # slow tick): read this one job now and fire only if the condition still holds
                    fresh = await asyncio.to_thread(poll_one, backend, handle)
                    if fresh is None:
                        self.log.warning("%s job %s: unread now, so no %s yet.", backend.name, handle.job_id, outcome)
                        continue
                    item = last = fresh
                    outcome = await asyncio.to_thread(watch.read, item)
                item = watch.complete(item)
                if outcome == ENDED:
                    yield self._event(
                        EVENT_STATUS_BY_STATE[item.state],
                        item,
                        f"{backend.name} job {handle.job_id} ended {item.state.value}: {item.reason or '-'}",
                    )
                    return
                if outcome is not None:
                    yield self._event(
                        EVENT_STATUS_BY_OUTCOME[outcome],
                        item,
                        f"{backend.name} job {handle.job_id} is {item.state.value} after waiting "
                        f"{watch.waited():.0f}s ({outcome})",
                    )
                    return
                if spot is not None and spot.due():  # back to spot: a reading every check_every, on-demand only
                    decision = await asyncio.to_thread(spot.check, item, self.log)
                    if decision is not None:
                        yield self._event(
                            names.EVENT_SPOT_RETURNED,
                            item,
                            f"{backend.name} job {handle.job_id}: spot returned: {decision.get('summary')}",
                            spot_return=decision,
                        )
                        return
        finally:
            watch.logs.finish()
            poller.unsubscribe(handle, queue)

    def _until_deadline(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.time())

    def _next_look(self, last: JobStatus | None) -> float | None:
        """How long to wait for the next status: until the execution deadline, and once a status is
        known at most ``poll_interval`` (then the last status is read again for the time-based rules)."""
        until = self._until_deadline()
        if last is None:
            return until
        every = max(self.poll_interval, MIN_RELOOK_S)
        return every if until is None else min(until, every)

    @staticmethod
    def _deadline_message(backend: Backend, handle: JobHandle) -> str:
        return f"{backend.name} job {handle.job_id} was still running when the task's execution_timeout ran out"

    async def on_kill(self) -> None:
        """The deferred task was killed by a user: cancel the job so it stops billing, unless a later
        Airflow try owns it now (read from the service at this moment, :meth:`Backend.read_owner`).
        When the owner cannot be read, it cancels: a job nobody watches must not keep billing."""
        backend = resolve_backend(self.backend)
        handle = JobHandle.from_dict(self.handle)
        owner = await asyncio.to_thread(read_owner, backend, handle)
        if owner is not None and owner.later_than(self.try_number):
            self.log.info(
                "Not cancelling %s job %s on kill: Airflow try %s owns it now (this trigger is try %s's).",
                backend.name,
                handle.job_id,
                owner.owner_try,
                self.try_number,
            )
            return
        who = self.task_label or f"Airflow task of job {handle.name}"
        reason = f"{who} was killed while deferred"
        await asyncio.to_thread(backend.cancel, handle, reason)
        if self.spend is not None and self.owns_job:
            await asyncio.to_thread(self._report_kill, backend, handle, reason)

    def _report_kill(self, backend: Backend, handle: JobHandle, reason: str) -> None:
        """The killed attempt's end, once: read from the service after the stop (bounded), priced, reported."""
        from gpu_provider.spend.ended import price_from_dict, report_stopped

        spend = self.spend or {}
        status = poll_one(backend, handle, timeout=KILL_STATUS_READ_S)
        record = report_stopped(
            handle,
            status,
            reason,
            team=spend.get("team"),
            backend=backend.name,
            price=price_from_dict(spend.get("price")),
            nodes=int(spend.get("nodes") or 1),
            log=self.log,
        )
        self.log.info(
            "%s job %s stopped by the kill: %.4f GPU-hours, %s.",
            backend.name,
            handle.job_id,
            record.gpu_hours,
            f"${record.cost_usd:.4f}" if record.cost_usd is not None else "cost unknown (no price)",
        )


class GpuBackoffTrigger(BaseTrigger):
    """Waits out the backoff before an attempt is resubmitted (after a spot interruption), in the
    triggerer: the deferred task holds no worker slot meanwhile. Fires once, at ``moment``.

    :param moment: Unix time at which the task resumes and submits its next attempt.
    :param note: what the wait is for, for the triggerer's log.
    """

    def __init__(self, *, moment: float, note: str = "", **_newer: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.moment = float(moment)
        self.note = note

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"moment": self.moment, "note": self.note})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        delay = self.moment - time.time()
        if delay > 0:
            self.log.info("Waiting %.1fs before the next attempt%s.", delay, f": {self.note}" if self.note else "")
            await asyncio.sleep(delay)
        yield TriggerEvent({"status": names.EVENT_BACKOFF_DONE, "moment": self.moment})  # type: ignore[no-untyped-call]
