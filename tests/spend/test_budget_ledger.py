"""The team budget guard never fails open silently: an unreadable month's spend (the Airflow Variable
``gpu_provider_spend_<YYYY-MM>``, here served by Airflow's environment-variable secrets backend) is
a warning in the task log on every submit, and with ``[gpu_provider] budget_fail_closed = True`` a
refusal before anything is submitted; the ledger is never overwritten from a failed read."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from gpu_provider.backends.local import LocalBackend
from gpu_provider.engine.attempts import Submit
from gpu_provider.exceptions import GpuJobBudgetError
from gpu_provider.job import GpuResources
from gpu_provider.recovery import OnDemand
from gpu_provider.spend.budget import SpendControl, SpendLedger, SpendLedgerError
from gpu_provider.spend.prices import PriceBook
from tests.harness import Harness

MONTH = "2031-07"
VARIABLE_ENV = f"AIRFLOW_VAR_GPU_PROVIDER_SPEND_{MONTH}"


def _control(tmp_path: Path, log: logging.Logger, *, fail_closed: bool) -> SpendControl:
    return SpendControl(
        LocalBackend(state_dir=str(tmp_path / "state")),
        GpuResources(gpus=1),
        OnDemand(),
        log=log,
        team="nlp",
        max_runtime_s=3600,
        book=PriceBook(local_gpu_hour_usd=1.0),
        team_budgets={"nlp": 100.0},
        ledger=SpendLedger(MONTH),
        emit_metrics=False,
        budget_fail_closed=fail_closed,
    )


@pytest.mark.parametrize("raw", ["{not json", '["a", "list"]', '{"nlp": "lots"}'])
def test_an_unreadable_ledger_warns_on_every_submit_and_fail_closed_refuses(
    raw: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(VARIABLE_ENV, raw)
    log = logging.getLogger("test.budget")
    with pytest.raises(SpendLedgerError, match=f"gpu_provider_spend_{MONTH}"):
        SpendLedger(MONTH).read()

    open_control = _control(tmp_path, log, fail_closed=False)
    with caplog.at_level(logging.WARNING, logger="test.budget"):
        open_control.before_submit(Submit(1, "on-demand"), [])
        open_control.before_submit(Submit(2, "on-demand"), [])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # every time, not once
    assert all("monthly budget of $100.00 is NOT checked" in w and f"gpu_provider_spend_{MONTH}" in w for w in warnings)
    assert "attempt 1" in warnings[0] and "attempt 2" in warnings[1]

    closed = _control(tmp_path, log, fail_closed=True)
    with pytest.raises(GpuJobBudgetError, match="budget_fail_closed = True refuses") as refused:
        closed.before_submit(Submit(1, "on-demand"), [])
    assert f"gpu_provider_spend_{MONTH}" in str(refused.value) and "'nlp'" in str(refused.value)


def test_a_readable_ledger_still_decides_and_an_unreadable_one_is_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("test.budget")
    monkeypatch.setenv(VARIABLE_ENV, json.dumps({"nlp": 99.5}))
    with caplog.at_level(logging.WARNING, logger="test.budget"), pytest.raises(GpuJobBudgetError, match="has spent"):
        _control(tmp_path, log, fail_closed=True).before_submit(Submit(1, "on-demand"), [])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    monkeypatch.setenv(VARIABLE_ENV, "{not json")
    with pytest.raises(SpendLedgerError):
        SpendLedger(MONTH).add("nlp", 1.0)  # refuses before writing anything


def test_budget_fail_closed_refuses_the_task_before_any_submit(harness: Harness) -> None:
    dag = harness.write_dag(
        "spend_fail_closed",
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=0.5),
            command=[sys.executable, "-c", "print('must not run')"],
            team="nlp",
            max_runtime=60,
            poll_interval=0.2,
        )
        """,
    )
    month = time.strftime("%Y-%m", time.gmtime())
    env = {
        "AIRFLOW__GPU_PROVIDER__LOCAL_GPU_HOUR_USD": "1",
        "AIRFLOW__GPU_PROVIDER__TEAM_MONTHLY_BUDGET_USD": json.dumps({"nlp": 50}),
        f"AIRFLOW_VAR_GPU_PROVIDER_SPEND_{month}": "{not json",
        "AIRFLOW__GPU_PROVIDER__BUDGET_FAIL_CLOSED": "True",
    }
    run = harness.run(dag, "spend_fail_closed", extra_env=env)
    assert run.task()["state"] == "failed", run.log[-4000:]
    assert "cannot be checked" in run.log and "budget_fail_closed = True refuses" in run.log, run.log[-4000:]
    assert LocalBackend(state_dir=str(harness.state_dir)).list_jobs() == []  # nothing was submitted


def test_the_worst_case_counts_every_attempt_the_policy_may_start(tmp_path: Path) -> None:
    """Node faults and planned moves back to spot start attempts too: a worst case that counted only
    ``max_interruptions`` and retries was below what the run could spend (6 attempts counted as 4 here)."""
    from gpu_provider import SpotFallback, SpotReturn

    policy = SpotFallback(
        max_interruptions=2,
        max_node_faults=1,
        spot_return=SpotReturn(max_moves=2, instance_types=["p4d.24xlarge"]),
    )
    control = SpendControl(
        LocalBackend(state_dir=str(tmp_path / "state")),
        GpuResources(gpus=1),
        policy,
        log=logging.getLogger("test.worst"),
        max_runtime_s=3600,
        retries=1,
        book=PriceBook(local_gpu_hour_usd=1.0),
        emit_metrics=False,
    )
    total, text = control.worst_case(Submit(1, "spot"), [])
    assert total == pytest.approx(1.0 * 1 * 1.0 * 7), text
    assert "7 attempt(s) left of 7 (1 + max_interruptions 2 + max_node_faults 1 + spot_return.max_moves 2 + " in text
    assert "retries 1)" in text
