"""What the SageMaker backend's status reads saw, kept for polling only, and bounded.

:meth:`~gpu_provider.backends.sagemaker.SageMakerBackend.poll` describes a job only when its
``LastModifiedTime`` moved (one ListTrainingJobs per tick finds those), and reads its tags only when
its ``TrainingJobStatus`` changed: the rest comes from here. Two rules keep that safe and small:

- **Full describes on a bound.** Whether SageMaker moves ``LastModifiedTime`` when only
  ``SecondaryStatus`` changes (a managed-spot ``Interrupted``) is not documented. Every active
  managed-spot job is described again at least every ``full_describe_every`` ticks
  (:meth:`JobCache.due`), so an interruption is seen within that many ticks whatever the list says.
- **Eviction.** An entry not asked about by a poll in the last ``keep_ticks`` ticks is dropped at the
  next tick (:meth:`JobCache.next_tick`): a triggerer's shared poller lives as long as the
  triggerer, and the jobs it watches come and go.

Nothing destructive reads this cache: ownership is read fresh (``SageMakerBackend.read_owner``).
Entries are replaced, never locked: ``cancel`` runs in a signal handler and must not wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ticks after which a job no poll asked about is forgotten
KEEP_TICKS = 5
#: ticks after which an active managed-spot job is described in full again, listed as changed or not
FULL_DESCRIBE_EVERY = 10
#: training job states in which a job still runs (and bills), so an interruption may still come
ACTIVE_STATUSES = frozenset({"InProgress", "Stopping"})


@dataclass
class Entry:
    """One job as the last describe saw it."""

    modified: float | None
    """``LastModifiedTime`` of that describe (the list's value it is compared with)."""
    job: dict[str, Any]
    """The DescribeTrainingJob answer."""
    tags: dict[str, str]
    """The job's tags, read when its ``TrainingJobStatus`` last changed (or since, fresh)."""
    described: int
    """The tick of that describe."""
    asked: int
    """The last tick a poll asked about the job."""


class JobCache:
    """Per job name, the last describe and tags; bounded by the ticks since a poll last asked.

    :param full_describe_every: describe an active managed-spot job at least every this many ticks
    :param keep_ticks: forget a job no poll asked about for this many ticks
    """

    def __init__(self, *, full_describe_every: int = FULL_DESCRIBE_EVERY, keep_ticks: int = KEEP_TICKS) -> None:
        if full_describe_every < 1 or keep_ticks < 1:
            raise ValueError(
                f"full_describe_every={full_describe_every!r} and keep_ticks={keep_ticks!r} must be 1 or more"
            )
        self.full_describe_every = full_describe_every
        self.keep_ticks = keep_ticks
        self.tick = 0
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def next_tick(self) -> None:
        """A poll begins: count it, and forget the jobs no poll asked about in the last ``keep_ticks`` ticks."""
        self.tick += 1
        oldest = self.tick - self.keep_ticks
        for name, entry in list(self._entries.items()):
            if entry.asked < oldest:
                self._entries.pop(name, None)

    def ask(self, name: str) -> None:
        """A poll asks about ``name`` in this tick (it stays kept)."""
        entry = self._entries.get(name)
        if entry is not None:
            entry.asked = self.tick

    def put(self, name: str, modified: float | None, job: dict[str, Any], tags: dict[str, str]) -> None:
        """A describe of ``name`` in this tick."""
        self._entries[name] = Entry(modified, job, tags, described=self.tick, asked=self.tick)

    def set_tags(self, name: str, tags: dict[str, str]) -> None:
        """Tags read (or written) since the describe: the next poll reports them."""
        entry = self._entries.get(name)
        if entry is not None:
            self._entries[name] = Entry(entry.modified, entry.job, tags, entry.described, entry.asked)

    def pop(self, name: str) -> None:
        self._entries.pop(name, None)

    def due(self, name: str) -> bool:
        """Whether ``name`` is an active managed-spot job not described in the last ``full_describe_every`` ticks."""
        entry = self._entries.get(name)
        if entry is None:
            return True
        job = entry.job
        running_spot = bool(job.get("EnableManagedSpotTraining")) and job.get("TrainingJobStatus") in ACTIVE_STATUSES
        return running_spot and self.tick - entry.described >= self.full_describe_every
