"""The gpu_provider_priority plugin: registered through its entry point, kept by DAG serialization, and
lowering a task's weight in backfill runs only (the weights the scheduler stores when it creates the
task instances; tests/integration/test_scheduler_postgres.py shows the order under a real scheduler)."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpu_provider.operators._fields import ABSOLUTE_RULE, DOWNSTREAM_RULE
from gpu_provider.plugins.priority import GpuAbsolutePriority, GpuDownstreamPriority, backfill_penalty


def _dag() -> object:
    from airflow.sdk import DAG

    from gpu_provider.operators import GpuJobOperator

    with DAG(dag_id="prio", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        first = GpuJobOperator(task_id="urgent", command=["true"], priority=50)
        second = GpuJobOperator(task_id="plain", command=["true"])
        third = GpuJobOperator(task_id="last", command=["true"], priority_weight=3)
        first >> second >> third
    return dag


def test_the_plugin_is_registered_through_its_entry_point() -> None:
    from importlib.metadata import entry_points

    from airflow import plugins_manager

    (entry,) = [e for e in entry_points(group="airflow.plugins") if e.name == "gpu_provider_priority"]
    assert entry.value == "gpu_provider.plugins.priority:GpuPriorityPlugin"
    registered = plugins_manager.get_priority_weight_strategy_plugins()
    assert registered[ABSOLUTE_RULE] is GpuAbsolutePriority and registered[DOWNSTREAM_RULE] is GpuDownstreamPriority


def _weights(run_id: str) -> dict[str, int]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagSerialization.from_dict(DagSerialization.to_dict(_dag()))  # what the scheduler reads
    out = {}
    for task in dag.tasks:
        ti = TaskInstance(task=task, run_id=run_id, map_index=-1, dag_version_id=None)
        out[task.task_id] = ti.priority_weight
    return out


def test_serialized_tasks_keep_the_rules_and_backfill_runs_get_the_penalty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BACKFILL_PRIORITY_PENALTY", "500")
    # absolute 50 for `urgent`; downstream sums for the others (plain: 1 + 3, last: 3)
    assert _weights("scheduled__2026-11-30T00:00:00+00:00") == {"urgent": 50, "plain": 4, "last": 3}
    assert _weights("manual__2026-11-30T00:00:00+00:00") == {"urgent": 50, "plain": 4, "last": 3}
    assert _weights("backfill__2026-11-02T00:00:00+00:00") == {"urgent": -450, "plain": -496, "last": -497}
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BACKFILL_PRIORITY_PENALTY", "0")
    assert _weights("backfill__2026-11-02T00:00:00+00:00") == {"urgent": 50, "plain": 4, "last": 3}


def test_a_weight_rule_the_task_sets_is_kept_without_priority() -> None:
    from gpu_provider.operators import GpuJobOperator

    assert GpuJobOperator(task_id="a", command=["true"], weight_rule="upstream").weight_rule == "upstream"
    assert GpuJobOperator(task_id="b", command=["true"]).weight_rule == DOWNSTREAM_RULE
    assert GpuJobOperator(task_id="c", command=["true"], priority=5).weight_rule == ABSOLUTE_RULE


@pytest.mark.parametrize("value", ["-1", "lots", "99999999999"])
def test_a_bad_penalty_names_the_config_key(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BACKFILL_PRIORITY_PENALTY", value)
    with pytest.raises(ValueError, match=r"\[gpu_provider\] backfill_priority_penalty=.* must be a whole number"):
        backfill_penalty()
