"""The closed set of job states every backend maps its service's states onto, and the lookup in a backend's table."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class JobState(str, Enum):
    """The closed set of states a job attempt can be in, on every backend."""

    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        return not self.terminal


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.PREEMPTED, JobState.CANCELLED})


def map_state(table: Mapping[str, JobState], remote_state: str, *, backend: str) -> JobState:
    """Look a service's state up in a backend's table; an unknown state is an error, never a guess."""
    try:
        return table[remote_state]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ValueError(
            f"{backend} backend: unknown remote job state {remote_state!r}; known states: {known}. "
            "This provider version does not understand the service's answer; upgrade it or report this."
        ) from None
