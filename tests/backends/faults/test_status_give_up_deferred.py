"""A deferred task that gives up reading its job's status stops the job as the worker's wait does (issue 36,
item 3), on every backend world: with no Airflow retry left, nobody would watch the job again.

The task runs in a real DAG run (``dag.test()``, its trigger inline), deferred, ``retries=0``. Once its job runs,
every status read of it fails; the trigger gives up and the task, resumed with the poll-error event, takes the
sync path's give-up (:meth:`AttemptRunner.gave_up_reading`): one stop sent to the service, the job ended, and a
message that says so. Evidence from the service's side (the emulators' request logs, the local job folders).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from gpu_provider.backends.base import JobHandle, JobState
from tests.backends.contract.worlds import poll_one, py, wait_ended
from tests.backends.faults.reads import break_reads
from tests.harness import Harness, wait_for
from tests.operators.suite.helpers import write_job_dag
from tests.operators.suite.worlds import OperatorWorld, operator_world  # noqa: F401 (fixture "world")

#: what each AWS world refuses: the status read, as for a role that lost the permission (the issue's reproduction)
DENIED_READ = {"batch": "DescribeJobs", "sagemaker": "DescribeTrainingJob"}


def unreadable(world: OperatorWorld, handle: JobHandle) -> Callable[[], None]:
    """Every status read of the running job fails from now on (AWS: AccessDeniedException on the status call;
    elsewhere a status the backend cannot read); returns what undoes it."""
    action = DENIED_READ.get(world.name)
    if action is None:
        return break_reads(world, handle)
    emulator = world.emulator  # type: ignore[attr-defined]
    emulator.deny(action)
    return lambda: emulator.deny(action, on=False)


def test_a_deferred_task_with_retries_0_that_gives_up_reading_stops_its_job(
    harness: Harness, world: OperatorWorld
) -> None:
    release = harness.tmp / "release"
    command = list(py(f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.1)"))
    dag_id = world.dag_id("giveupdf")
    dag = write_job_dag(harness, world, dag_id, command, poll_interval=0.05, retries=0, deferrable=True)
    worker = harness.start(dag, dag_id)
    key = world.task_key(dag_id)

    def running() -> JobHandle | None:
        found = world.handles(key)
        return found[0] if found and poll_one(world.backend(), found[0]).state is JobState.RUNNING else None

    try:
        handle = wait_for(running, 120, "the task's job to run")
        restore = unreadable(world, handle)  # every status read of the job fails from now on
        try:
            run = harness.finish(*worker, timeout=180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run did not end in 180 s; its log:\n{worker[2].read_text()[-8000:]}") from None
    finally:
        release.touch()
    assert run.task()["state"] == "failed", run.log[-4000:]
    assert "times in a row" in run.log, run.log[-4000:]
    assert "No Airflow retry is left to watch the job, so it was cancelled" in run.log, run.log[-4000:]
    assert "reattaches" not in run.log, "no retry will come: the message must not promise one"
    restore()
    stops = world.stopped()
    assert len(stops) == 1 and stops[0][0] in (handle.job_id, handle.name), stops
    assert "times in a row" in stops[0][1], stops  # the stop's reason says why (SageMaker keeps 256 characters)
    if world.name != "kubernetes":  # its pod's phase stays overwritten; the stop deleted the pod
        assert wait_ended(world.backend(), handle).state is JobState.CANCELLED
