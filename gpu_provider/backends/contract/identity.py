"""Who a job belongs to: the task instance, the attempt's deterministic name and tags, and reading them back."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_provider import names

_NAME_UNSAFE = re.compile(r"[^a-z0-9-]+")


def _slug(text: str, limit: int) -> str:
    return _NAME_UNSAFE.sub("-", text.lower()).strip("-")[:limit].strip("-") or "x"


@dataclass(frozen=True)
class TaskKey:
    """The Airflow task instance a job belongs to, across all its tries and attempts."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    @property
    def run_hash(self) -> str:
        """A short, stable hash of the dag id, task id and run id.

        Run ids are long and hold characters no service allows, and names keep only the first
        characters of the dag and task ids. Hashing all three keeps two DAGs whose ids share a
        prefix apart even when their runs have the same id (e.g. ``scheduled__2026-01-05T00:00:00+00:00``).
        """
        key = "\x1f".join((self.dag_id, self.task_id, self.run_id))
        return hashlib.sha256(key.encode()).hexdigest()[:10]

    @property
    def prefix(self) -> str:
        """The name prefix every attempt of this task instance shares (DNS-1123 safe, <= 50 chars)."""
        mi = f"-m{self.map_index}" if self.map_index >= 0 else ""
        return f"{names.JOB_NAME_PREFIX}{_slug(self.dag_id, 14)}-{_slug(self.task_id, 14)}-{self.run_hash}{mi}"


@dataclass(frozen=True)
class JobIdentity:
    """Deterministic identity of one attempt, carried in job names and tags so a retry can find it."""

    task: TaskKey
    try_number: int
    attempt: int
    capacity: str
    team: str | None = None

    @property
    def name(self) -> str:
        """``gp-<dag>-<task>-<runhash>[-m<map>]-t<try>-a<attempt>``: valid as a Batch, SageMaker and k8s name."""
        return f"{self.task.prefix}-t{self.try_number}-a{self.attempt}"

    def tags(self) -> dict[str, str]:
        """Tags/labels for cost attribution, the reaper and lookup."""
        tags = {
            names.TAG_DAG_ID: self.task.dag_id,
            names.TAG_TASK_ID: self.task.task_id,
            names.TAG_RUN_ID: self.task.run_id,
            names.TAG_RUN_HASH: self.task.run_hash,
            names.TAG_MAP_INDEX: str(self.task.map_index),
            names.TAG_TRY_NUMBER: str(self.try_number),
            names.TAG_OWNER_TRY: str(self.try_number),
            names.TAG_ATTEMPT: str(self.attempt),
            names.TAG_CAPACITY: self.capacity,
        }
        if self.team:
            tags[names.TAG_TEAM] = self.team
        return tags


def lookup_key(job_id: str | None, name: str | None) -> tuple[str, str]:
    """``("job_id", value)`` or ``("name", value)`` for :meth:`Backend.lookup`: exactly one, a non-empty string."""
    given = [(field, value) for field, value in (("job_id", job_id), ("name", name)) if value is not None]
    if len(given) != 1:
        raise ValueError(f"lookup takes exactly one of job_id= and name=; got {[f for f, _ in given] or 'neither'}")
    field_name, value = given[0]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field_name}={value!r} must be a non-empty string")
    return field_name, value.strip()


def task_from_tags(tags: Mapping[str, Any]) -> TaskKey | None:
    """The task instance named by a job's tags/labels (:meth:`JobIdentity.tags`), ``None`` without them."""
    dag_id, task_id, run_id = (tags.get(k) for k in (names.TAG_DAG_ID, names.TAG_TASK_ID, names.TAG_RUN_ID))
    if not (dag_id and task_id and run_id):
        return None
    try:
        map_index = int(tags.get(names.TAG_MAP_INDEX) or -1)
    except ValueError:
        return None
    return TaskKey(str(dag_id), str(task_id), str(run_id), map_index)
