"""Waking the worker's wait when the service says its job changed, instead of sleeping out the poll interval.

The triggerer's shared poller listens to the backend's event source (:meth:`Backend.event_source`: a
Kubernetes watch, EventBridge events read from SQS); a task that waits on its worker (``deferrable=False``)
listens to the same source here, for the attempt it waits on. An event only ends the sleep: the status is
then read from the service by the wait's own poll, as always (events are hints, never a job's status), so a
lost or late event costs latency only and the regular poll still sees every end.

It is opt-in, ``[gpu_provider] worker_wait_events = True``: each task process waiting on a worker then opens
its own reader (an SQS long-poll, or a Kubernetes watch of the namespace's provider pods), where the
triggerer has one for all its tasks. Readers of one queue take each other's messages for their visibility
timeout, and each watch gets every provider pod's changes, so turn it on where few tasks wait on workers at
a time, or give those workers a queue of their own.

One :class:`WaitWake` serves every attempt of a try (:meth:`WaitWake.follow` switches the job), so the
source keeps one reader between an interrupted attempt and the next one, and the next one's first events
are not taken by a reader that is going away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from gpu_provider.backends.base import Backend, EventSink, JobHandle

#: ``[gpu_provider]`` setting that turns the worker's listening on (default off, see the module docstring)
SETTING = "worker_wait_events"
#: while sleeping, how often the task's stop event (set by ``on_kill``) is looked at
STOP_LOOK_S = 0.1


class WaitWake(EventSink):
    """Ends a wait's sleep when the backend's event source names the followed job (or may have missed
    events); without an event source, :meth:`sleep` is a plain wait on the task's stop event.

    :param backend: whose :meth:`~gpu_provider.backends.base.Backend.event_source` to listen to
    :param log: where a source that cannot be set up is reported (the wait polls on, unchanged)
    """

    def __init__(self, backend: Backend, log: Any) -> None:
        self.backend = backend
        self.log = log
        self._keys: frozenset[str] = frozenset()
        self._news = threading.Event()
        self._detach: Callable[[], None] | None = None
        self._started = False
        #: whether the source says events flow now (the last read of the queue worked, the watch is open)
        self.flowing = False
        #: sleeps an event ended before their time (tests and diagnostics)
        self.woken = 0

    # --- EventSink: called from the source's thread ------------------------------------------------------
    def changed(self, keys: Collection[str] | None) -> None:
        if keys is None or not self._keys.isdisjoint(keys):
            self._news.set()

    def watches(self, key: str) -> bool:
        return key in self._keys  # a frozenset replaced, never changed in place: safe from another thread

    def up(self, flowing: bool) -> None:
        self.flowing = flowing

    # --- the wait's side ----------------------------------------------------------------------------------
    def follow(self, handle: JobHandle) -> None:
        """Listen for ``handle``'s job from now on (the source is attached on the first call)."""
        self._keys = frozenset({handle.job_id, handle.name})
        self._news.clear()  # what was said of the job before is read by the first poll anyway
        if self._started:
            return
        self._started = True
        try:
            from gpu_provider.backends.common import config_flag

            if not config_flag(SETTING, default=False):
                return
            source = self.backend.event_source()
        except Exception as err:  # a bad setting must not stop the wait: it polls as before
            self.log.warning("%s event source unavailable (%s); polling only.", self.backend.name, err)
            return
        if source is not None:
            from gpu_provider.triggers import events

            self._detach = events.attach(source, self)

    def sleep(self, seconds: float, stop: threading.Event) -> bool:
        """Wait up to ``seconds``, less when an event names the job or ``stop`` is set; returns whether an
        event ended it. News that came while the wait was reading is not lost: it ends the next sleep at once."""
        if self._detach is None:
            stop.wait(seconds)
            return False
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._news.wait(min(left, STOP_LOOK_S)):
                self._news.clear()
                self.woken += 1
                return True
        return False

    def close(self) -> None:
        """Stop listening (the source's reader ends when its last listener leaves)."""
        detach, self._detach = self._detach, None
        self._keys = frozenset()
        if detach is not None:
            detach()
