"""DAG files in every form Airflow loads: the checker (``gpu-provider check --dag``) and the runner behind
``run_gpu_dag`` find their DAGs as Airflow's DagBag does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.checker_runs import PROCESS, Checked, run_checks
from tests.harness import Harness

TASK = 'GpuJobOperator(task_id="job", command=[sys.executable, "-c", "print(1)"], {extra})'
HEADER = """
import sys
from airflow.sdk import DAG, dag
from gpu_provider.operators import GpuJobOperator
"""
#: the forms, each a file defining DAG ``form_<name>`` (and, for "two", a second one)
FORMS = {
    "with_as": 'with DAG(dag_id="form_with_as", schedule=None) as the_dag:\n    ' + TASK,
    # the README's own form: the context manager without a name
    "with_no_as": 'with DAG(dag_id="form_with_no_as", schedule=None):\n    ' + TASK,
    "decorator": '@dag(dag_id="form_decorator", schedule=None)\ndef pipeline():\n    ' + TASK + "\n\npipeline()",
    "decorator_default_id": "@dag(schedule=None)\ndef form_decorator_default_id():\n    "
    + TASK
    + "\n\nform_decorator_default_id()",
    "plain": 'built = DAG(dag_id="form_plain", schedule=None)\n' + TASK.replace("{extra}", "dag=built, {extra}"),
    "two": 'for name in ("form_two", "form_two_other"):\n    with DAG(dag_id=name, schedule=None):\n        ' + TASK,
}


def write(folder: Path, form: str, extra: str = "") -> Path:
    path = folder / f"form_{form}.py"
    path.write_text(textwrap.dedent(HEADER) + "\n" + FORMS[form].format(extra=extra) + "\n")
    return path


def check(*args: str) -> subprocess.CompletedProcess[str]:
    """``gpu-provider check ARGS``, the console script, in a process of its own."""
    command = [str(Path(sys.executable).with_name("gpu-provider")), "check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=dict(os.environ))


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checked]:
    """Every checker run of this module's tests, named, made in one process: Airflow is imported once, not
    once per run (the console script itself runs in its own process in the test of a file Airflow cannot
    import)."""
    folder = tmp_path_factory.mktemp("forms")
    fixed = 'checkpoint="file:///data/ckpt"'
    runs = {f"form-{form}": ["--dag", str(write(folder, form, extra=fixed))] for form in FORMS if form != "two"}
    two = str(write(folder, "two", extra='checkpoint="file:///data/{{ run_id | path_segment }}/ckpt"'))
    runs["two-every"] = ["--dag", two]
    runs["two-one"] = ["--dag", two, "--dag-id", "form_two_other"]
    runs["two-missing"] = ["--dag", two, "--dag-id", "nope"]
    dated = folder / "dated"
    dated.mkdir()
    needs_date = 'checkpoint="file:///data/{{ ds }}/{{ run_id | path_segment }}"'
    runs["needs-logical-date"] = ["--dag", str(write(dated, "with_no_as", extra=needs_date))]
    return run_checks(runs, folder)


@pytest.mark.parametrize("form", sorted(set(FORMS) - {"two"}))
def test_the_checker_finds_the_dag_of_every_form(form: str, checked: dict[str, Checked]) -> None:
    done = checked[f"form-{form}"]
    assert "expected one DAG" not in done.stderr, done.stderr
    # it found the task: the fixed checkpoint URI is named
    assert "[FAIL] job: checkpoint URI unique per run: 'file:///data/ckpt'" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1


def test_the_checker_checks_every_dag_of_a_file_or_the_one_named(checked: dict[str, Checked]) -> None:
    every = checked["two-every"]
    assert every.returncode == 0, every.stdout + every.stderr
    assert "[PASS] form_two.job:" in every.stdout and "[PASS] form_two_other.job:" in every.stdout
    one = checked["two-one"]
    findings = [line for line in one.stdout.splitlines() if line.startswith("[")]
    assert one.returncode == 0 and findings[0].startswith("[PASS] job:") and len(findings) == 1, one.stdout
    missing = checked["two-missing"]
    assert missing.returncode == 1
    assert "no DAG 'nope'; its DAGs: ['form_two', 'form_two_other']" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert "Traceback" not in checked[PROCESS].stderr + checked[PROCESS].stdout, "a run logged a traceback"


def test_the_checker_reports_a_file_airflow_cannot_import_in_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("from airflow.sdk import DAG\nraise RuntimeError('boom in the DAG file')\n")
    done = check("--dag", str(broken))
    assert done.returncode == 1
    assert "Airflow could not import it: RuntimeError: boom in the DAG file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_checkpoint_uri_that_needs_a_logical_date_fails_the_check(checked: dict[str, Checked]) -> None:
    done = checked["needs-logical-date"]
    assert done.returncode == 1
    assert "renders only for runs with a logical date" in done.stdout, done.stdout


@pytest.mark.parametrize(("form", "dag_id"), [("with_no_as", None), ("decorator", None), ("two", "form_two_other")])
def test_the_runner_runs_the_dag_of_every_form(harness: Harness, form: str, dag_id: str | None) -> None:
    dag_file = write(harness.home / "dags", form)
    run = harness.run(dag_file, dag_id)
    assert run.state.endswith("success"), run.log[-3000:]
    assert run.result["dag_id"] == (dag_id or f"form_{form}")
    assert run["job"].attempt_states == ["SUCCEEDED"]


def test_the_runner_asks_for_a_dag_id_when_a_file_has_several(harness: Harness) -> None:
    dag_file = write(harness.home / "dags", "two")
    proc, _out, log = harness.start(dag_file)
    assert proc.wait(timeout=120) != 0
    assert "expected one DAG, found ['form_two', 'form_two_other']: name one with dag_id" in log.read_text()
