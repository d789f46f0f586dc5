"""``gpu-provider pools sync``: one Airflow pool ``gpu_<team>`` per team of the quota file.

Each team's pool gets one slot per GPU of its quota and ``include_deferred=True`` (a deferred GPU task
still holds its GPUs while its job runs). The sync goes through Airflow's REST API, like any client:

- a team without its pool: the pool is created;
- a pool whose slots or ``include_deferred`` differ from the file (someone changed it by hand, or the
  file changed): reported as drift and updated to the file;
- a ``gpu_*`` pool of no team in the file: reported and kept. The sync never deletes a pool (tasks may
  still name it); delete it yourself once its team is gone;
- task instances waiting (``scheduled``) for a ``gpu_*`` pool that does not exist: Airflow's
  scheduler only logs "Tasks using non-existent pool ... will not be scheduled" and leaves them
  there forever. The sync reports each of them; with ``fail_stuck`` it marks them failed with a
  note that says why, so their owners see it on their own DAG run.

A dry run reads the same and changes nothing.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from gpu_provider.airflow_api import AirflowApi
from gpu_provider.quotas.file import POOL_PREFIX, Quotas

#: task instance states of a task waiting for a pool slot
WAITING_STATES = ("scheduled",)
_PAGE = 100

CREATE = "create"
UPDATE = "update"
OK = "ok"
UNMANAGED = "unmanaged"


@dataclass(frozen=True)
class PoolChange:
    """What the sync does (or, in a dry run, would do) to one pool."""

    pool: str
    action: str
    """``create`` | ``update`` | ``ok`` | ``unmanaged`` (a ``gpu_*`` pool of no team: kept)"""
    slots: int | None = None
    """the slots the file wants (None for an unmanaged pool)"""
    drift: tuple[str, ...] = ()
    """for ``update``: each field that differs, as ``field: found -> wanted``"""

    def line(self, dry_run: bool) -> str:
        verb = {CREATE: "would create" if dry_run else "created", UPDATE: "would update" if dry_run else "updated"}
        if self.action == CREATE:
            return f"{self.pool}: {verb[CREATE]} with {self.slots} slots, include_deferred=True"
        if self.action == UPDATE:
            return f"{self.pool}: drift ({'; '.join(self.drift)}); {verb[UPDATE]} to the quota file"
        if self.action == UNMANAGED:
            return (
                f"{self.pool}: no team in the quota file; kept (the sync never deletes a pool: "
                f"`airflow pools delete {self.pool}` once no task uses it)"
            )
        return f"{self.pool}: in sync ({self.slots} slots, include_deferred=True)"


@dataclass(frozen=True)
class StuckTask:
    """A task instance waiting for a pool that does not exist (Airflow never schedules it)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    pool: str
    failed: bool = False

    def line(self) -> str:
        where = f"{self.dag_id}.{self.task_id}" + (f"[{self.map_index}]" if self.map_index >= 0 else "")
        done = "; marked failed with a note" if self.failed else ""
        return f"task {where} of run {self.run_id} waits for pool {self.pool}, which does not exist{done}"


@dataclass
class SyncReport:
    dry_run: bool
    changes: list[PoolChange] = field(default_factory=list)
    stuck: list[StuckTask] = field(default_factory=list)

    @property
    def drift(self) -> list[PoolChange]:
        return [c for c in self.changes if c.action in (UPDATE, UNMANAGED)]

    def lines(self) -> list[str]:
        head = "dry run: nothing changed" if self.dry_run else "pools synced"
        return [head] + [c.line(self.dry_run) for c in self.changes] + [t.line() for t in self.stuck]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "changes": [
                {"pool": c.pool, "action": c.action, "slots": c.slots, "drift": list(c.drift)} for c in self.changes
            ],
            "stuck": [
                {
                    "dag_id": t.dag_id,
                    "run_id": t.run_id,
                    "task_id": t.task_id,
                    "map_index": t.map_index,
                    "pool": t.pool,
                    "failed": t.failed,
                }
                for t in self.stuck
            ],
        }


def stuck_note(pool: str, source: str) -> str:
    team = pool[len(POOL_PREFIX) :]
    return (
        f"gpu-provider: this task waited for the pool {pool}, which does not exist, so Airflow would never run it. "
        f"Add team {team!r} to the quota file ({source}) and run `gpu-provider pools sync`, or change the "
        "task's team=; then clear the task."
    )


def plan(quotas: Quotas, existing: dict[str, dict[str, Any]]) -> list[PoolChange]:
    """The change for each team's pool and each ``gpu_*`` pool of no team."""
    changes = []
    for quota in quotas.teams:
        found = existing.get(quota.pool)
        if found is None:
            changes.append(PoolChange(quota.pool, CREATE, quota.gpus))
            continue
        drift = []
        if int(found.get("slots", -2)) != quota.gpus:
            drift.append(f"slots: {found.get('slots')} -> {quota.gpus}")
        if found.get("include_deferred") is not True:
            drift.append(f"include_deferred: {found.get('include_deferred')} -> True")
        changes.append(PoolChange(quota.pool, UPDATE if drift else OK, quota.gpus, tuple(drift)))
    managed = {q.pool for q in quotas.teams}
    for name in sorted(existing):
        if name.startswith(POOL_PREFIX) and name not in managed:
            changes.append(PoolChange(name, UNMANAGED))
    return changes


class PoolSync:
    """Sync the quota file's pools through Airflow's REST API."""

    def __init__(self, api: AirflowApi, quotas: Quotas) -> None:
        self.api = api
        self.quotas = quotas

    def pools(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        offset = 0
        while True:
            page = self.api.send("GET", f"/pools?limit={_PAGE}&offset={offset}")
            for pool in page["pools"]:
                found[str(pool["name"])] = dict(pool)
            offset += _PAGE
            if offset >= int(page["total_entries"]) or not page["pools"]:
                return found

    def waiting_tasks(self) -> list[dict[str, Any]]:
        """Task instances of every DAG waiting for a slot of a ``gpu_*`` pool."""
        out: list[dict[str, Any]] = []
        query = [("pool_name_prefix_pattern", POOL_PREFIX), ("limit", str(_PAGE))]
        query += [("state", s) for s in WAITING_STATES]
        offset = 0
        while True:
            qs = urllib.parse.urlencode([*query, ("offset", str(offset))])
            page = self.api.send("GET", f"/dags/~/dagRuns/~/taskInstances?{qs}")
            out.extend(page["task_instances"])
            offset += _PAGE
            if offset >= int(page["total_entries"]) or not page["task_instances"]:
                return out

    def sync(self, *, dry_run: bool = False, fail_stuck: bool = False) -> SyncReport:
        existing = self.pools()
        report = SyncReport(dry_run=dry_run, changes=plan(self.quotas, existing))
        for change in report.changes:
            if dry_run or change.action not in (CREATE, UPDATE):
                continue
            description = f"GPUs of team {change.pool[len(POOL_PREFIX) :]} (gpu-provider quota file)"
            if change.action == CREATE:
                body = {"name": change.pool, "slots": change.slots, "include_deferred": True}
                self.api.send("POST", "/pools", {**body, "description": description})
            else:
                q = urllib.parse.quote(change.pool, safe="")
                mask = "update_mask=slots&update_mask=include_deferred"
                body = {"pool": change.pool, "slots": change.slots, "include_deferred": True}
                self.api.send("PATCH", f"/pools/{q}?{mask}", body)
        pools = set(existing) | {c.pool for c in report.changes if c.action == CREATE and not dry_run}
        if dry_run:
            pools |= {c.pool for c in report.changes if c.action == CREATE}
        for ti in self.waiting_tasks():
            if ti.get("pool") in pools:
                continue
            stuck = StuckTask(
                dag_id=str(ti["dag_id"]),
                run_id=str(ti["dag_run_id"]),
                task_id=str(ti["task_id"]),
                map_index=int(ti.get("map_index", -1)),
                pool=str(ti["pool"]),
            )
            if fail_stuck and not dry_run:
                self._fail(stuck)
                stuck = StuckTask(**{**stuck.__dict__, "failed": True})
            report.stuck.append(stuck)
        return report

    def _fail(self, task: StuckTask) -> None:
        q = urllib.parse.quote
        run = f"/dags/{q(task.dag_id, safe='')}/dagRuns/{q(task.run_id, safe='')}"
        path = f"{run}/taskInstances/{q(task.task_id, safe='')}"
        if task.map_index >= 0:
            path += f"/{task.map_index}"
        self.api.send("PATCH", path, {"new_state": "failed", "note": stuck_note(task.pool, self.quotas.source)})
