"""The DAG checks of :mod:`gpu_provider.testing.check`: each ``GpuJobOperator`` task's checkpoint URI renders
differently per run and for a run without a logical date, no two tasks share one, and (from a finished run)
each GPU stage that succeeded declared its output."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_provider.testing.findings import CheckReport, Finding


def check_dag(dag_file: str | Path, dag_id: str | None = None) -> CheckReport:
    """Check the checkpoint URIs of a DAG file's ``GpuJobOperator`` tasks: each renders differently for two
    runs and renders for a run without a logical date (a manual run triggered with none, an asset-triggered
    run), and no two tasks share one. The file's DAGs are found as Airflow finds them (every DAG in it, or
    ``dag_id``). Imports the DAG file (Airflow needed), renders in this process."""
    from gpu_provider.testing.dagchild import _load_dag, load_dags

    report = CheckReport()
    dags = [_load_dag(str(dag_file), dag_id)] if dag_id else list(load_dags(dag_file).values())
    if not dags:
        raise SystemExit(f"{dag_file}: Airflow finds no DAG in it")
    for dag in dags:
        report.findings += _check_one_dag(dag, prefix=f"{dag.dag_id}." if len(dags) > 1 else "").findings
    return report


def _check_one_dag(dag: Any, prefix: str) -> CheckReport:
    from gpu_provider.operators import GpuJobOperator

    report = CheckReport()
    rendered: dict[str, tuple[str, str]] = {}
    for task in dag.tasks:
        if not isinstance(task, GpuJobOperator):
            continue
        report.findings += _reaper_scope(task, prefix)
        if not task.checkpoint_uri:
            continue
        try:
            uris = tuple(_render(task, run_id) for run_id in _RUN_IDS)
        except Exception as err:
            report.findings.append(
                Finding(
                    "unique_uri", None, f"could not render {task.checkpoint_uri!r} here: {err}", prefix + task.task_id
                )
            )
            continue
        rendered[task.task_id] = (uris[0], uris[1])
        try:
            _render(task, _NO_LOGICAL_DATE_RUN_ID, logical_date=False)
        except Exception as err:
            report.findings.append(
                Finding(
                    "unique_uri",
                    False,
                    f"{task.checkpoint_uri!r} renders only for runs with a logical date ({err}): a manual run "
                    "triggered without one (the UI, the REST API with logical_date null) and every asset-triggered "
                    "run would fail. Use what every run has, e.g. '.../{{ run_id | path_segment }}'",
                    prefix + task.task_id,
                )
            )
            continue
        if uris[0] == uris[1]:
            report.findings.append(
                Finding(
                    "unique_uri",
                    False,
                    f"{task.checkpoint_uri!r} renders to {uris[0]} for every run: a re-run, a backfill or the next "
                    "scheduled run would resume from this run's checkpoints. Put the run in it, e.g. "
                    "'.../{{ run_id | path_segment }}'",
                    prefix + task.task_id,
                )
            )
        else:
            report.findings.append(Finding("unique_uri", True, f"e.g. {uris[0]}", prefix + task.task_id))
    shared: dict[str, list[str]] = {}
    for task_id, (uri, _) in rendered.items():
        shared.setdefault(uri, []).append(task_id)
    for uri, task_ids in shared.items():
        if len(task_ids) > 1:
            report.findings.append(
                Finding(
                    "unique_uri",
                    False,
                    f"tasks {', '.join(task_ids)} share the checkpoint URI {uri}: each would resume from the "
                    "others' checkpoints. Put the task in it ({{ task.task_id }})",
                    dag.dag_id,
                )
            )
    return report


def _reaper_scope(task: Any, prefix: str) -> list[Finding]:
    """A ladder's rungs outside the scope of the reaper this process's configuration gives (``None``: this
    machine's ``[gpu_provider] reaper_backends`` may not be the deployment's)."""
    from gpu_provider.capacity import Ladder
    from gpu_provider.operators._ladder import unswept_rungs

    if not isinstance(task.capacity, Ladder):
        return []
    lines = unswept_rungs(task.capacity, [rung.build() for rung in task.capacity.rungs])
    if not lines:
        return [Finding("reaper_scope", True, f"{len(task.capacity.rungs)} rung(s) swept", prefix + task.task_id)]
    return [
        Finding(
            "reaper_scope",
            None,
            f"{line}: add the rung's backend to [gpu_provider] reaper_backends, or its jobs outlive a gone task",
            prefix + task.task_id,
        )
        for line in lines
    ]


def check_dag_run(run: Any) -> CheckReport:
    """From a finished run (:class:`~gpu_provider.testing.dagrun.DagRun`): did each GPU stage that succeeded
    declare its output?"""
    report = CheckReport()
    for task_id, task in run.tasks.items():
        if not task.attempts:
            continue
        if task.output:
            report.findings.append(Finding("output", True, f"declared {task.output}", task_id))
        elif task.state == "success":
            report.findings.append(
                Finding(
                    "output",
                    False,
                    "its job succeeded without declaring an output (gpu_provider.runtime.declare_output): the next "
                    "stage cannot read output_uri from its XCom",
                    task_id,
                )
            )
    return report


_RUN_IDS = ("manual__2026-01-05T00:00:00+00:00", "scheduled__2026-01-06T00:00:00+00:00")
#: a run without a logical date or data interval (the context has none of the keys that depend on them)
_NO_LOGICAL_DATE_RUN_ID = "asset_triggered__2026-01-07T00:00:00+00:00"


def _render(task: Any, run_id: str, *, logical_date: bool = True) -> str:
    """The task's checkpoint URI rendered for a run ``run_id`` with the DAG's template environment (for a run
    without a logical date: a context without ``logical_date``, ``ds``, ``data_interval_*``..., as Airflow's)."""
    from datetime import datetime

    from airflow.sdk.execution_time import macros

    from gpu_provider.templates import TEMPLATE_FILTERS

    when = datetime.fromisoformat(run_id.split("__", 1)[1])
    env = task.get_template_env()
    for name, function in TEMPLATE_FILTERS.items():
        env.filters.setdefault(name, function)
    context: dict[str, Any] = {
        "run_id": run_id,
        "dag": task.dag,
        "task": task,
        "params": dict(task.params or {}),
        "dag_run": _FakeDagRun(run_id, when if logical_date else None, when),
        "ti": _FakeTi(task, run_id),
        "macros": macros,
    }
    if logical_date:
        context.update(
            {
                "logical_date": when,
                "data_interval_start": when,
                "data_interval_end": when,
                "ds": when.strftime("%Y-%m-%d"),
                "ds_nodash": when.strftime("%Y%m%d"),
                "ts": when.isoformat(),
                "ts_nodash": when.strftime("%Y%m%dT%H%M%S"),
            }
        )
    return str(env.from_string(task.checkpoint_uri).render(**context))


@dataclass
class _FakeDagRun:
    run_id: str
    logical_date: Any
    run_after: Any
    conf: dict[str, Any] = field(default_factory=dict)


@dataclass
class _FakeTi:
    task: Any
    run_id: str
    map_index: int = 0

    @property
    def task_id(self) -> str:
        return str(self.task.task_id)

    def xcom_pull(self, *args: Any, **kwargs: Any) -> Any:
        return _AnyKey(output_uri="file:///upstream-output")


class _AnyKey(dict[str, Any]):
    """An upstream XCom standing in for any: every key reads as a path."""

    def __missing__(self, key: str) -> str:
        return f"file:///upstream-{key}"
