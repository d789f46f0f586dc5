"""A service's change notifications (a watch, a queue of events) and where they are delivered."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Collection


class EventSink(ABC):
    """Where an :class:`EventSource` delivers what it learns (implemented by the triggerer's shared poller)."""

    @abstractmethod
    def changed(self, keys: Collection[str] | None) -> None:
        """Jobs changed: their ``JobHandle.job_id`` or ``name``; ``None``: any job may have changed
        (events may have been missed, e.g. after a re-list), so every watched job is polled now."""

    @abstractmethod
    def watches(self, key: str) -> bool:
        """Whether a job with this ``job_id`` or ``name`` is waited on here (a queue's message naming it is
        consumed; others are left for their own readers). May be called from the source's thread."""

    @abstractmethod
    def up(self, flowing: bool) -> None:
        """Whether events are flowing now (the watch is open, the last queue read succeeded). While they
        flow, the poller's regular tick slows to its backstop interval; when not, it polls at its interval."""


class EventSource(ABC):
    """A service's own change notifications (a Kubernetes watch, EventBridge events read from an SQS
    queue), used by the triggerer's shared poller as hints: a job named by an event is polled at once,
    in one batched :meth:`Backend.poll`. Events are never taken as a job's status: the poll is.
    Losing events therefore costs latency only; the poller's backstop tick still sees every end."""

    #: sources with equal keys are one: a process opens one per key (one watch per namespace and cluster)
    key: str = ""

    @abstractmethod
    def run(self, sink: EventSink, stop: threading.Event) -> None:
        """Deliver events to ``sink`` until ``stop`` is set (called in a thread of its own; reconnects
        and resumes itself). Raising ends this run: the caller reports the source down and runs it
        again after a backoff. Must return soon after ``stop`` is set."""

    def close(self) -> None:  # noqa: B027
        """Interrupt a blocking read so :meth:`run` returns soon after ``stop`` is set (optional)."""
