"""A reattach the user can see (issue 36, item 7), on every backend world.

A worker dies (SIGKILL) while its job runs; the task runs again and adopts the job instead of submitting a
second one. The second run's task log must say so, in one wording on every backend and every way the job is
found (the task state store, the backend's lookup, or create-or-adopt at submit): ``Reattached to <backend>
job <name> (started by try N; ...)``. Real Airflow (``dag.test()`` in a child process); the service's own
request log counts the creates.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Harness, pid_alive, wait_for
from tests.operators.suite.helpers import pids, write_job_dag
from tests.operators.suite.worlds import (
    OPERATOR_WORLDS,
    OperatorWorld,
    SageMakerOperatorWorld,
    operator_world,
)

__all__ = ["operator_world"]  # fixture "world"

#: the words of a run's log once it took a job over or submitted one, and (the run defers) once it deferred
DECIDED = ("Reattached to", "Submitted ", "Pausing task as DEFERRED")


@pytest.fixture
def sagemaker_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SageMakerOperatorWorld]:
    """The SageMaker operator world alone (its emulator can leave jobs out of ListTrainingJobs)."""
    built = OPERATOR_WORLDS["sagemaker"].create(request, tmp_path)
    assert isinstance(built, SageMakerOperatorWorld)
    try:
        yield built
    finally:
        built.cleanup()


def _crash_while_running(harness: Harness, world: OperatorWorld, dag_id: str) -> tuple[Path, Path, Path]:
    """Run ``dag_id``'s task (sync) until its job runs, then SIGKILL the worker. Returns the DAG file, the
    file that lets the held job end, and the first run's log."""
    out, pid_dir, release = harness.tmp / "out", harness.tmp / "pids", harness.tmp / "release"
    command = harness.toy_args(str(out), 5, 0.1, "--hold-until", str(release))
    dag = write_job_dag(harness, world, dag_id, command, env={"PID_DIR": str(pid_dir)}, poll_interval=0.3)
    worker, _, first_log = harness.start(dag, dag_id)
    job_pid = wait_for(lambda: pids(pid_dir).get("1-0"), 120, f"the {world.name} job to start")
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies; the job does not
    worker.wait(timeout=10)
    assert pid_alive(job_pid), "the job must survive its worker"
    # the next run defers: a new try's deferral is a reattach of the task too
    write_job_dag(harness, world, dag_id, command, env={"PID_DIR": str(pid_dir)}, poll_interval=0.3, deferrable=True)
    return dag, release, first_log


def _run_again(harness: Harness, dag: Path, dag_id: str, release: Path) -> str:
    """Run the task again; the job, held after its last step, ends once the run took it over (or submitted
    one), so that however slow the machine, it is still running when the run looks. Returns its log."""
    retry = harness.start(dag, dag_id)
    try:
        wait_for(lambda: any(w in retry[2].read_text() for w in DECIDED), 180, "the second run to take the job")
    finally:
        release.touch()
    run = harness.finish(*retry)
    assert run.task()["state"] == "success", run.log[-4000:]
    return run.log


def test_a_run_after_a_worker_crash_says_it_reattached(harness: Harness, world: OperatorWorld) -> None:
    dag_id = world.dag_id("seen")
    dag, release, first_log = _crash_while_running(harness, world, dag_id)
    (created,) = world.created()

    log = _run_again(harness, dag, dag_id, release)
    line = f"Reattached to {world.name} job {created.name} (started by try 1;"
    assert log.count(line) == 1, log[-4000:]
    assert "Submitted " not in log
    assert [c.name for c in world.created()] == [created.name], "exactly one create for the attempt"
    assert "Reattached to" not in first_log.read_text(), "the try that submitted the job did not reattach"


def test_a_job_adopted_at_submit_is_a_reattach_too(harness: Harness, sagemaker_world: SageMakerOperatorWorld) -> None:
    """The lookup misses the job (ListTrainingJobs leaves it out, as an eventually consistent listing can), so
    the run, under try 1 with nothing found, does not read the task state store either (the first execution's
    fast path) and submits: SageMaker refuses the name, and the submit adopts the job. The log says so as it
    does for a job found by the lookup, not "Submitted"."""
    world = sagemaker_world
    dag_id = world.dag_id("adopt")
    dag, release, _ = _crash_while_running(harness, world, dag_id)
    (created,) = world.created()
    world.emulator.unlist(created.name)

    log = _run_again(harness, dag, dag_id, release)
    assert log.count(f"Reattached to sagemaker job {created.name} (started by try 1;") == 1, log[-4000:]
    assert "found by its name when submitting" in log
    assert "Submitted " not in log
    creates = world.emulator.requests("CreateTrainingJob")
    assert [r["status"] for r in creates] == [200, 400], "the second create was refused: the name is in use"
    assert {h.job_id for h in world.backend().find_existing(world.task_key(dag_id))} == set()  # still unlisted
    assert world.emulator.job(created.name).status == "Completed", "the adopted job ran to its end"
