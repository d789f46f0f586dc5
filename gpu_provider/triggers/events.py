"""The event sources behind the shared pollers: one thread per source key in a process.

A backend's :meth:`~gpu_provider.backends.base.Backend.event_source` (a Kubernetes watch, an SQS queue
of EventBridge events) is run here, once per ``EventSource.key`` however many pollers listen (pollers
differ by event loop and poll interval; a namespace still gets one watch). Each listening poller gets
every event; a source that raises is reported down to its listeners (they poll at their interval
again) and run again after a backoff. The thread stops when the last listener leaves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from gpu_provider.backends.base import EventSink, EventSource

log = logging.getLogger(__name__)

#: seconds before a failed source runs again: doubling from the first to the last
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
#: a run that lasted this long before failing resets the backoff
HEALTHY_RUN_S = 60.0


class _Running(EventSink):
    """One source's thread and its listeners (a fan-out sink)."""

    def __init__(self, source: EventSource) -> None:
        self.source = source
        self.listeners: list[EventSink] = []
        self.stop = threading.Event()
        self.flowing = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"gpu-events-{source.key}")

    def _each(self) -> list[EventSink]:
        with self._lock:
            return list(self.listeners)

    def changed(self, keys: Collection[str] | None) -> None:
        for listener in self._each():
            listener.changed(keys)

    def watches(self, key: str) -> bool:
        return any(listener.watches(key) for listener in self._each())

    def up(self, flowing: bool) -> None:
        self.flowing = flowing
        for listener in self._each():
            listener.up(flowing)

    def _main(self) -> None:
        delay = RETRY_FIRST_S
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.source.run(self, self.stop)
            except Exception as err:
                if not self.stop.is_set():
                    log.warning(
                        "Event source %s failed (%s: %s); polling at the regular interval, retrying in %.0fs.",
                        self.source.key,
                        type(err).__name__,
                        err,
                        delay,
                    )
            if self.flowing:
                self.up(False)
            if time.monotonic() - started >= HEALTHY_RUN_S:
                delay = RETRY_FIRST_S
            if self.stop.wait(delay):
                return
            delay = min(RETRY_MAX_S, delay * 2)


_running: dict[str, _Running] = {}
_lock = threading.Lock()


def attach(source: EventSource, listener: EventSink) -> Callable[[], None]:
    """Listen to ``source`` (started unless one of its key runs already); returns the detach function."""
    with _lock:
        running = _running.get(source.key)
        if running is None or running.stop.is_set():
            running = _running[source.key] = _Running(source)
            running.listeners.append(listener)
            running.thread.start()
        else:
            with running._lock:
                running.listeners.append(listener)
            if running.flowing:
                listener.up(True)

    def detach() -> None:
        with _lock:
            with running._lock:
                if listener in running.listeners:
                    running.listeners.remove(listener)
                last = not running.listeners
            if last:
                running.stop.set()
                if _running.get(source.key) is running:
                    del _running[source.key]
        if last:
            running.source.close()

    return detach


def running_sources() -> list[str]:
    """The keys of the sources whose threads run now (for tests and diagnostics)."""
    with _lock:
        return sorted(k for k, r in _running.items() if r.thread.is_alive())


def running_source(key: str) -> EventSource | None:
    """The source of ``key`` whose thread runs now, if any (for tests and diagnostics)."""
    with _lock:
        running = _running.get(key)
        return running.source if running is not None and running.thread.is_alive() else None
