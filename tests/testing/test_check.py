"""The checker's command line on a DAG whose tasks checkpoint in the same place for every run: it says so."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_provider.testing.check import CheckReport, Finding

COMMANDS = {
    "module": [sys.executable, "-m", "gpu_provider.testing.check"],
    "console script": [str(Path(sys.executable).with_name("gpu-provider")), "check"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_the_checker_names_checkpoint_uris_that_are_not_unique_per_run(tmp_path: Path, command: list[str]) -> None:
    dag_file = tmp_path / "shared_checkpoints.py"
    dag_file.write_text(
        textwrap.dedent(
            """
            from airflow.sdk import DAG
            from gpu_provider.operators import GpuJobOperator

            with DAG(dag_id="shared_checkpoints", schedule=None) as dag:
                GpuJobOperator(task_id="fixed", command=["true"], checkpoint="file:///data/ckpt")
                GpuJobOperator(task_id="twin", command=["true"], checkpoint="file:///data/ckpt")
                GpuJobOperator(
                    task_id="per_run", command=["true"], checkpoint="file:///data/{{ run_id | path_segment }}/ckpt"
                )
            """
        )
    )
    done = subprocess.run(
        [*command, "--dag", str(dag_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("[FAIL] fixed: checkpoint URI unique per run: 'file:///data/ckpt'") for line in lines)
    assert any(
        line.startswith("[PASS] per_run: checkpoint URI unique per run: e.g. file:///data/manual__") for line in lines
    )
    assert any("tasks fixed, twin share the checkpoint URI file:///data/ckpt" in line for line in lines), lines
    assert lines[-1] == "3 check(s) failed"


def test_a_check_that_could_not_decide_does_not_fail_the_report() -> None:
    report = CheckReport([Finding("sigterm", None, "ended before the interruption"), Finding("output", True, "ok")])
    assert report.ok and report.text().splitlines()[0].startswith("[????] honours SIGTERM")
    report.findings.append(Finding("resume", False, "started over"))
    assert not report.ok and report.failed() == [report["resume"]]
