"""Stopping, on every backend: killing a running task stops its job (every node); killing a deferred task
stops its job from the triggerer; a job someone cancels is not resubmitted by Airflow's retries. Real
Airflow (dag.test in a child process, SIGTERM as Airflow kills a task) or the real trigger."""

from __future__ import annotations

import signal

from gpu_provider.backends.base import JobState
from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.backends.contract.worlds import wait_ended, wait_state
from tests.harness import Harness, pid_alive, wait_for
from tests.operators.suite.helpers import TICKING, Source, kill_once_seen_running, pids, write_job_dag
from tests.operators.suite.worlds import OperatorWorld


def test_killing_a_running_task_stops_its_job_on_every_node(harness: Harness, world: OperatorWorld) -> None:
    dag_id = world.dag_id("kill")
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = write_job_dag(
        harness,
        world,
        dag_id,
        harness.toy_args(str(out), 300, 0.2),
        resources=Source("GpuResources(gpus=1, nodes=2)"),
        env={"PID_DIR": str(pid_dir)},
        poll_interval=0.3,
        deferrable=False,
    )
    worker, _, log = harness.start(dag, dag_id)
    job_pids = wait_for(lambda: (p := pids(pid_dir)) and len(p) == 2 and p, 120, "both nodes to start")
    worker.send_signal(signal.SIGTERM)  # what Airflow sends a task it kills
    ((stopped, reason),) = wait_for(world.stopped, 30, f"the {world.name} job to be stopped")
    (created,) = world.created()
    assert stopped in {created.name} | {h.job_id for h in world.handles(world.task_key(dag_id))}
    assert reason.startswith(f"Airflow task {dag_id}.job of run ") and reason.endswith(" was killed"), reason
    wait_for(lambda: not any(pid_alive(p) for p in job_pids.values()), 30, "every node's process to stop")
    worker.wait(timeout=30)
    assert f"Cancelled {world.name} job" in log.read_text()
    # the service ends the job on its own time (SageMaker: Stopping -> Stopped), as on AWS: wait for it
    for handle in world.handles(world.task_key(dag_id)):  # a deleted Kubernetes Job is gone from the lists
        assert wait_ended(world.backend(), handle).state is JobState.CANCELLED


def test_killing_a_deferred_task_stops_its_job(world: OperatorWorld) -> None:
    """The triggerer runs the trigger's on_kill when a deferred task is killed."""
    backend = world.backend()
    request = world.request("killdef", TICKING)
    key = request.identity.task
    handle = backend.submit(request)
    label = f"Airflow task {key.dag_id}.{key.task_id} of run {key.run_id}"
    trigger = GpuJobTrigger(backend=backend.spec(), handle=handle.to_dict(), poll_interval=0.3, task_label=label)
    kill_once_seen_running(trigger)
    assert world.stopped() == [(handle.job_id, f"{label} was killed while deferred")]
    status = wait_ended(backend, handle)
    assert status.state is JobState.CANCELLED, status
    assert status.reason is not None and status.reason.endswith(f"{label} was killed while deferred"), status


def test_a_job_cancelled_by_a_person_fails_the_task_and_is_not_retried(harness: Harness, world: OperatorWorld) -> None:
    """Issue 15 defect 6: Airflow's retries used to resubmit a job someone cancelled on purpose."""
    dag_id = world.dag_id("cancelled")
    dag = write_job_dag(
        harness,
        world,
        dag_id,
        harness.toy_args(str(harness.tmp / "out"), 600, 0.1),
        retries=2,
        retry_delay=Source("timedelta(seconds=0)"),
        poll_interval=0.3,
    )
    worker = harness.start(dag, dag_id)
    key = world.task_key(dag_id)
    (handle,) = wait_for(lambda: world.handles(key), 120, "the job to be submitted")
    wait_state(world.backend(), handle, JobState.RUNNING, timeout=120)
    world.backend().cancel(handle, "stopped by a person from the console")
    run = harness.finish(*worker, timeout=120)
    assert run.task()["state"] == "failed", run.log[-4000:]
    assert "was CANCELLED" in run.log and "clear the task to run it again" in run.log, run.log[-4000:]
    assert len(world.created()) == 1, "no retry may submit a second job"
