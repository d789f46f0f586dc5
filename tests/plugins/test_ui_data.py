"""The GPU page's figures from attempt records (gpu_provider.plugins.ui.data): classification of how
attempts ended, team windows, interruption rates, the two charts' series and pagination."""

from __future__ import annotations

import inspect
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from gpu_provider.backends.base import JobHandle, JobState, OwnedJob, TaskKey
from gpu_provider.plugins.ui import data
from gpu_provider.records import AttemptRecord, dump_records

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def record(
    job_id: str,
    *,
    attempt: int = 1,
    capacity: str = "spot",
    state: JobState = JobState.SUCCEEDED,
    start: float | None = NOW - 2 * HOUR,
    end: float | None = NOW - HOUR,
    gpu_seconds: float = 0.0,
    cost: float | None = None,
    **extra: Any,
) -> AttemptRecord:
    handle = JobHandle("local", job_id, job_id, attempt, capacity, (start or NOW) - 10)
    return AttemptRecord(
        attempt=attempt,
        handle=handle,
        state=state,
        started_at=iso(start) if start else None,
        ended_at=iso(end) if end else None,
        gpu_seconds=gpu_seconds,
        cost_usd=cost,
        **extra,
    )


def row(*records: AttemptRecord, dag_id: str = "d", team: str | None = "vision", **extra: Any) -> data.TaskRow:
    return data.TaskRow(
        dag_id=dag_id,
        run_id="r",
        task_id="t",
        map_index=-1,
        value=json.dumps(dump_records(records)),
        pool=f"gpu_{team}" if team else "default_pool",
        **extra,
    )


@pytest.mark.parametrize(
    ("state", "fields", "kind"),
    [
        (JobState.SUCCEEDED, {}, "succeeded"),
        (JobState.PREEMPTED, {}, "preempted"),
        (JobState.FAILED, {"interruption": "lost"}, "lost"),
        (JobState.CANCELLED, {"interruption": "capacity_timeout"}, "capacity_timeout"),
        (
            JobState.CANCELLED,
            {"reason": "gpu-provider: the GPU reaper: no live Airflow task is behind this job"},
            "reaped",
        ),
        (JobState.CANCELLED, {"reason": "gpu-provider: Airflow task d.t was killed"}, "cancelled"),
        (JobState.FAILED, {"reason": "exit code 3"}, "failed"),
    ],
)
def test_how_an_attempt_ended(state: JobState, fields: dict[str, Any], kind: str) -> None:
    assert data.end_kind(record("j", state=state, **fields)) == kind


def test_the_reapers_cancel_reason_is_what_the_page_reads_as_reaped() -> None:
    from gpu_provider.spend.reaper import reap

    assert data.REAPED_MARK in inspect.signature(reap).parameters["reason"].default


def test_a_record_left_running_by_a_task_that_ended_counts_as_ended_then() -> None:
    stale = record("j", state=JobState.RUNNING, end=None, gpu_seconds=HOUR)
    ti_end = datetime.fromtimestamp(NOW - HOUR, tz=timezone.utc)
    (gone,) = data.attempts_of([row(stale, ti_state="failed", ti_end_date=ti_end)], {}, NOW)
    assert not gone.active and gone.end == NOW - HOUR
    (live,) = data.attempts_of([row(stale, ti_state="deferred")], {}, NOW)
    assert live.active


def test_a_live_job_gives_state_gpus_and_cost_of_a_running_attempt() -> None:
    rec = record("j", state=JobState.QUEUED, start=None, end=None, capacity="on-demand")
    owned = OwnedJob(
        handle=rec.handle,
        task=TaskKey("d", "t", "r"),
        state=JobState.RUNNING,
        started_at=NOW - HOUR,
        nodes=2,
        gpus=4.0,
    )
    (a,) = data.attempts_of([row(rec)], {"j": owned}, NOW, {"j": 8 * 1.5})
    shown = a.to_dict(NOW)
    assert (shown["state"], shown["gpus"], shown["gpus_per_node"], shown["nodes"]) == ("RUNNING", 8.0, 4.0, 2)
    assert shown["running_for_s"] == HOUR
    assert shown["cost_usd"] == pytest.approx(12.0)  # 8 GPUs x 1 h at $1.5 per GPU-hour
    assert shown["gpu_hours"] == pytest.approx(8.0)


def test_team_figures_windows_rates_and_pools() -> None:
    rows = [
        row(
            record("a1", state=JobState.PREEMPTED, end=NOW - HOUR, gpu_seconds=2 * HOUR, cost=1.0),
            record("a2", attempt=2, capacity="on-demand", end=NOW - 0.5 * HOUR, gpu_seconds=HOUR, cost=2.0),
        ),
        row(record("b1", end=NOW - 3 * 86400, start=NOW - 3 * 86400 - HOUR, gpu_seconds=HOUR, cost=4.0)),
        row(record("c1", end=NOW - 20 * 86400, start=NOW - 20 * 86400 - HOUR, gpu_seconds=HOUR, cost=8.0), team=None),
    ]
    pools = [data.PoolRow("gpu_vision", 8, running=2, queued=1, deferred=3, scheduled=4, include_deferred=True)]
    attempts = data.attempts_of(rows, {}, NOW)
    vision, nobody = data.team_figures(attempts, pools, NOW)
    assert (vision["team"], nobody["team"]) == ("vision", "-")
    assert vision["slots_total"] == 8 and vision["slots_in_use"] == 6  # running + queued + deferred
    assert vision["tasks_waiting"] == 5
    assert vision["cost_usd"] == {"day": 3.0, "week": 7.0, "month": 7.0}
    assert vision["gpu_hours"] == {"day": 3.0, "week": 4.0, "month": 4.0}
    assert vision["interruption_rate"]["day"] == {
        "on-demand": {"attempts": 1, "interrupted": 0, "rate": 0.0},
        "spot": {"attempts": 1, "interrupted": 1, "rate": 1.0},
    }
    assert vision["interruption_rate"]["week"]["spot"] == {"attempts": 2, "interrupted": 1, "rate": 0.5}
    assert nobody["cost_usd"] == {"day": 0.0, "week": 0.0, "month": 8.0} and nobody["pool"] is None


def test_gpus_in_use_is_the_mean_over_each_bucket() -> None:
    step = data.BUCKETS["day"].total_seconds()
    last = (NOW // step) * step  # the bucket NOW is in
    full = record("x", start=last - 2 * step, end=last - step, gpu_seconds=2 * step)  # 2 GPUs, one bucket
    half = record("y", start=last - step, end=last - step / 2, gpu_seconds=4 * step / 2)  # 4 GPUs, half a bucket
    series = data.gpus_in_use(data.attempts_of([row(full, half)], {}, NOW), "day", NOW)
    values = series["teams"]["vision"]
    assert len(values) == len(series["times"]) == 288
    assert values[-3:] == [2.0, 2.0, 0.0]
    assert sum(values) == 4.0


def test_daily_cost_by_the_day_an_attempt_ended() -> None:
    rows = [
        row(record("a", end=NOW - HOUR, cost=1.25), record("b", attempt=2, end=NOW - 86400, cost=2.5)),
        row(record("c", end=NOW - 2 * HOUR, cost=4.0), team="nlp"),
    ]
    cost = data.daily_cost(data.attempts_of(rows, {}, NOW), 7, NOW)
    assert cost["days"][-1] == "2026-12-03" and len(cost["days"]) == 7
    assert cost["teams"]["vision"][-2:] == [2.5, 1.25]
    assert cost["teams"]["nlp"] == [0, 0, 0, 0, 0, 0, 4.0]


def test_recent_attempts_page_newest_first() -> None:
    records = [record(f"j{i}", attempt=i, end=NOW - i * 60) for i in range(1, 6)]
    attempts = data.attempts_of([row(*records)], {}, NOW)
    first = data.recent(attempts, NOW, offset=0, limit=2)
    second = data.recent(attempts, NOW, offset=2, limit=2)
    assert first["total"] == 5
    assert [a["job_id"] for a in first["attempts"] + second["attempts"]] == ["j1", "j2", "j3", "j4"]
    assert data.recent(attempts, NOW, offset=0, limit=5, team="nlp")["total"] == 0


def test_a_live_job_no_record_knows_is_listed_apart() -> None:
    known = record("known", state=JobState.RUNNING, end=None)
    stray = OwnedJob(
        handle=JobHandle("local", "stray", "stray", 1, "spot", NOW - 60),
        task=TaskKey("d", "t", "r"),
        state=JobState.RUNNING,
        team="vision",
        started_at=NOW - 30,
        gpus=1.0,
    )
    attempts = data.attempts_of([row(known, ti_state="running")], {}, NOW)
    mine = OwnedJob(handle=known.handle, task=TaskKey("d", "t", "r"), state=JobState.RUNNING, gpus=1.0)
    (only,) = data.untracked(attempts, {"stray": stray, "known": mine}, NOW)
    assert (only["job_id"], only["team"], only["running_for_s"]) == ("stray", "vision", 30.0)


@pytest.mark.parametrize(
    "top", [0.0, 0.0023, 0.0121, 0.0154, 0.0386, 0.01, 0.099, 0.5, 1, 3, 7.3, 12, 150, 1234.5, 2.5e6]
)
def test_axis_labels_are_distinct_and_reach_the_top(top: float) -> None:
    """Issue 25.6: the cost axis read "$0.00" on every line for amounts in cents, and repeated "$0.01"."""
    for money in (True, False):
        y = data.axis(top, money=money)
        assert len(set(y["labels"])) == len(y["labels"]) >= 2, y
        assert y["ticks"][0] == 0 and y["max"] == y["ticks"][-1] >= top, y
        assert len(y["ticks"]) <= 6, y
        # each label says its tick's value
        for value, label in zip(y["ticks"], y["labels"], strict=True):
            assert float(label.lstrip("$").replace(",", "")) == pytest.approx(value, abs=1e-9), (value, label)


def test_the_cost_chart_labels_cents() -> None:
    rows = [row(record("a", end=NOW - HOUR, cost=0.0154)), row(record("b", end=NOW - HOUR, cost=0.0023), team="nlp")]
    y = data.daily_cost(data.attempts_of(rows, {}, NOW), 7, NOW)["y_axis"]
    assert y["labels"] == ["$0.000", "$0.005", "$0.010", "$0.015", "$0.020"]


def test_gpus_in_use_steps_show_a_minute_long_run_over_the_span_with_data() -> None:
    """Issue 25.6: a day of 5-minute means drew minute-long runs as a flat line with a spike at the end."""
    runs = [
        record("a", start=NOW - 3 * HOUR, end=NOW - 3 * HOUR + 60, gpu_seconds=120),  # 2 GPUs for a minute
        record("b", attempt=2, start=NOW - HOUR, end=None, state=JobState.RUNNING),  # still running
    ]
    attempts = data.attempts_of([row(*runs, ti_state="running")], {}, NOW)
    for a in attempts:
        a.gpus = 2.0
    chart = data.gpus_in_use(attempts, "day", NOW)
    assert chart["span"] == {"start": iso(NOW - 3 * HOUR), "end": iso(NOW)}
    assert chart["steps"]["vision"] == [
        [iso(NOW - 3 * HOUR), 2.0],
        [iso(NOW - 3 * HOUR + 60), 0.0],
        [iso(NOW - HOUR), 2.0],
        [iso(NOW), 0.0],
    ]
    assert chart["y_axis"]["labels"] == ["0.0", "0.5", "1.0", "1.5", "2.0"]


def _live(job_id: str, dag_id: str | None) -> OwnedJob:
    task = TaskKey(dag_id, "t", "r") if dag_id else None
    return OwnedJob(handle=JobHandle("batch", job_id, job_id, 1, "spot", NOW), task=task, state=JobState.RUNNING)


def test_live_jobs_and_errors_are_cut_to_what_a_user_may_read() -> None:
    """Issue 25.4: every answer counted all DAGs' live jobs and quoted backends' errors naming other teams' roles."""
    from gpu_provider.plugins.ui import queries

    jobs = {"a": _live("a", "vision_train"), "b": _live("b", "nlp_train"), "c": _live("c", "deleted_dag")}
    jobs["d"] = _live("d", None)
    assert set(queries.visible_live(jobs, {"vision_train"}, every_dag=False)) == {"a"}
    # a user who may read every DAG also sees jobs of DAGs Airflow does not know (untracked)
    assert set(queries.visible_live(jobs, {"vision_train", "nlp_train"}, every_dag=True)) == {"a", "b", "c", "d"}
    secret = "batch: could not list its jobs: AccessDenied for arn:aws:iam::123456789012:role/nlp-team-batch"
    live = queries.LiveJobs(errors=[secret], failed=["batch"])
    (told,) = queries.visible_errors(live, every_dag=False)
    assert told.startswith("batch: ") and "nlp-team" not in told and "arn:" not in told
    assert queries.visible_errors(live, every_dag=True) == [secret]


def test_an_attempt_shows_the_instance_type_that_ran_and_its_hourly_price() -> None:
    ran = record(
        "j1",
        capacity="on-demand",
        instance_type="g6e.48xlarge",
        instance_choice="g6e.48xlarge",
        price={"instance_type": "g6e.48xlarge", "usd_per_hour": 30.13, "usd_per_gpu_hour": 3.77},
        cost=30.13,
    )
    (shown,) = data.recent(data.attempts_of([row(ran)], {}, NOW), NOW, offset=0, limit=5)["attempts"]
    assert (shown["instance_type"], shown["usd_per_hour"], shown["cost_usd"]) == ("g6e.48xlarge", 30.13, 30.13)


def test_a_ladders_attempts_show_their_own_service_and_region_and_link_there() -> None:
    """A capacity ladder's attempts ran on several services: each row names its backend, service and region, and
    its console link is built by its own rung's backend (another region's console), not the page's default."""
    from gpu_provider.plugins.ui.app import _add_links

    spec = {"name": "sagemaker", "region_name": "us-west-2", "role_arn": "arn:aws:iam::123456789012:role/r"}
    batch = record("b1", state=JobState.PREEMPTED, end=NOW - 2 * HOUR + 60, interruption="preempted", rung=0)
    batch.handle = JobHandle("batch", "b1", "b1", 1, "spot", NOW - 3 * HOUR, {"region": "us-east-1"})
    west = record("w2", attempt=2, capacity="on-demand", rung=1, backend_spec=spec, service="Amazon SageMaker")
    west.handle = JobHandle("sagemaker", "w2", "gp-w2", 2, "on-demand", NOW - 2 * HOUR)
    old = record("o3")  # a record written before ladders: no service, region or rung
    page = data.recent(data.attempts_of([row(batch, west), row(old, dag_id="e")], {}, NOW), NOW, offset=0, limit=5)
    shown = {a["job_id"]: a for a in page["attempts"]}
    assert (shown["w2"]["backend"], shown["w2"]["service"], shown["w2"]["region"], shown["w2"]["rung"]) == (
        "sagemaker",
        "Amazon SageMaker",
        "us-west-2",
        1,
    )
    assert (shown["b1"]["backend"], shown["b1"]["rung"], shown["o3"]["service"], shown["o3"]["region"]) == (
        "batch",
        0,
        None,
        None,
    )
    rows = [shown["w2"]]
    _add_links(rows)
    assert "_spec" not in rows[0] and "us-west-2" in str(rows[0]["console_url"]), rows[0]


def test_the_page_names_a_ladders_rung_that_no_reaper_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rung in another region ran attempts: unless the configured reaper sweeps that place, the page says so
    (once per task and place); a rung the reaper sweeps, and an attempt on the task's own backend, say nothing."""
    from gpu_provider.plugins.ui import queries

    role = "arn:aws:iam::123456789012:role/r"
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS", json.dumps([{"name": "sagemaker", "role_arn": role}]))
    west = {"name": "sagemaker", "region_name": "us-west-2", "aws_conn_id": "aws_west", "role_arn": role}
    home = {"name": "sagemaker", "role_arn": role}
    rows = [
        row(
            record("w1", rung=1, backend_spec=west),
            record("w2", attempt=2, rung=1, backend_spec=west),
            record("h3", attempt=3, rung=0, backend_spec=home),
            record("p4", attempt=4),
        )
    ]
    attempts = data.attempts_of(rows, {}, NOW)
    (line,) = data.unswept(attempts, queries.unswept_place())
    assert line.startswith("d.t ran attempts on sagemaker (aws_conn_id='aws_west', region_name='us-west-2')"), line
    assert "which no reaper sweeps ([gpu_provider] reaper_backends)" in line
    # once the reaper names that place too, nothing is left to say
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REAPER_BACKENDS", json.dumps([home, west]))
    assert data.unswept(attempts, queries.unswept_place()) == []
