"""Priority weights that put backfill runs behind every other run (plugin ``gpu_provider_priority``).

Airflow 3.3 computes a task instance's ``priority_weight`` once, when the scheduler creates the task
instance (``TaskInstance.insert_mapping`` and ``refresh_from_task``), with the task's ``weight_rule``:
a built-in rule (``absolute``, ``downstream``, ``upstream``) or a ``PriorityWeightStrategy`` subclass
registered by an Airflow plugin (``priority_weight_strategies``). A serialized DAG stores only the
class's import path, so a strategy has no parameters: each rule here is its own class, and the
penalty is read from ``[gpu_provider] backfill_priority_penalty`` when the weight is computed.

Can a strategy see the run type? Not directly: ``insert_mapping`` hands it a fresh ``TaskInstance``
holding the task, the run id and the map index, not the DAG run. The run id says it: Airflow names a
run ``<run type>__<date>`` (``backfill__2026-11-02T00:00:00+00:00`` for ``airflow backfill create``),
which ``DagRunType.from_run_id`` reads back. Where the DAG run is loaded on the task instance (the
``refresh_from_task`` path), its ``run_type`` is read too. One case keeps its weight: a backfill with
``--reprocess-behavior`` that re-runs an *existing* run keeps that run's id and the weights its task
instances already have.

``GpuJobOperator`` uses :class:`GpuAbsolutePriority` when ``priority=`` is given and
:class:`GpuDownstreamPriority` otherwise (unless the task sets ``weight_rule`` itself); any operator
can use them by name, e.g. ``weight_rule="gpu_provider.plugins.priority.GpuAbsolutePriority"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.plugins_manager import AirflowPlugin
from airflow.task.priority_strategy import PriorityWeightStrategy

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

#: the ``weight_rule`` names of the strategies (what the operator sets; no import needed)
ABSOLUTE = "gpu_provider.plugins.priority.GpuAbsolutePriority"
DOWNSTREAM = "gpu_provider.plugins.priority.GpuDownstreamPriority"
DEFAULT_BACKFILL_PENALTY = 1000
#: Airflow stores weights as 32-bit integers
_LIMIT = 2**31 - 1


def backfill_penalty() -> int:
    """``[gpu_provider] backfill_priority_penalty`` (default 1000), 0 or more."""
    from gpu_provider.backends.base import provider_config

    text = provider_config("backfill_priority_penalty")
    if not text:
        return DEFAULT_BACKFILL_PENALTY
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= _LIMIT:
        raise ValueError(
            f"[gpu_provider] backfill_priority_penalty={text!r} must be a whole number from 0 to {_LIMIT} "
            "(how much lower a backfill run's priority weights are)"
        )
    return value


def is_backfill(ti: Any) -> bool:
    """Whether the task instance belongs to a backfill run (see the module docstring for how)."""
    from airflow.utils.types import DagRunType

    run_id = str(getattr(ti, "run_id", "") or "")
    if DagRunType.from_run_id(run_id) == DagRunType.BACKFILL_JOB:
        return True
    # only a relationship already loaded: reading ti.dag_run otherwise would query the database
    dag_run = vars(ti).get("dag_run")
    return str(getattr(dag_run, "run_type", "")) == DagRunType.BACKFILL_JOB.value


class _BackfillLast(PriorityWeightStrategy):
    """A weight rule whose weight is lowered by the backfill penalty in backfill runs."""

    def base_weight(self, ti: TaskInstance) -> int:
        raise NotImplementedError

    def get_weight(self, ti: TaskInstance) -> int:
        weight = self.base_weight(ti)
        if is_backfill(ti):
            weight -= backfill_penalty()
        return max(-_LIMIT, min(_LIMIT, weight))


class GpuAbsolutePriority(_BackfillLast):
    """The task's own ``priority_weight`` (Airflow's ``absolute``), lowered in backfill runs."""

    def base_weight(self, ti: TaskInstance) -> int:
        assert ti.task is not None
        return int(ti.task.priority_weight)


class GpuDownstreamPriority(_BackfillLast):
    """The task's ``priority_weight`` plus its downstream tasks' (Airflow's default), lowered in backfills."""

    def base_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        assert task is not None
        dag = task.get_dag()
        weight = int(task.priority_weight)
        if dag is None:
            return weight
        return weight + sum(int(dag.task_dict[t].priority_weight) for t in task.get_flat_relative_ids(upstream=False))


class GpuPriorityPlugin(AirflowPlugin):
    """Registers the weight rules (entry point ``gpu_provider_priority`` in the ``airflow.plugins`` group)."""

    name = "gpu_provider_priority"
    priority_weight_strategies = [GpuAbsolutePriority, GpuDownstreamPriority]
