"""A worker that dies does not cost a second job, on every backend: the retry reattaches to the running
job, takes the result of one that succeeded meanwhile, and finds by its name a job submitted just before
the crash (before the task could record it). Real Airflow (dag.test in a child process); the worker is
SIGKILLed as a crash would end it."""

from __future__ import annotations

import json
import os
import signal

from gpu_provider.backends.base import JobIdentity
from tests.harness import Harness, pid_alive, wait_for
from tests.operators.suite.helpers import pids, write_job_dag
from tests.operators.suite.worlds import OperatorWorld


def test_worker_crash_then_retry_reattaches_without_a_second_create(harness: Harness, world: OperatorWorld) -> None:
    dag_id = world.dag_id("crash")
    out, pid_dir, release = harness.tmp / "out", harness.tmp / "pids", harness.tmp / "release"
    dag = write_job_dag(
        harness,
        world,
        dag_id,
        harness.toy_args(str(out), 20, 0.15, "--hold-until", str(release)),
        env={"PID_DIR": str(pid_dir)},
        checkpoint=world.checkpoint_uri(harness.tmp, "ckpt"),
        poll_interval=0.3,
        deferrable=False,
    )
    worker, _, _ = harness.start(dag, dag_id)
    job_pid = wait_for(lambda: pids(pid_dir).get("1-0"), 120, f"the {world.name} job to start")
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies; the job does not
    worker.wait(timeout=10)
    assert pid_alive(job_pid), "the job must survive its worker"
    assert len(world.created()) == 1

    # the retry; the job is held after its last step until the retry has reattached, so a slow start of the
    # retry cannot find it already ended
    retry = harness.start(dag, dag_id)
    reattached = f"Reattached to {world.name} job"
    wait_for(lambda: reattached in retry[2].read_text(), 180, "the retry to reattach")
    release.touch()
    run = harness.finish(*retry)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    # (dag.test() re-runs a cleared running task under the same try number; a scheduler would bump it)
    assert len(world.created()) == 1, "the retry must not create a second job"
    assert len(task["xcom"]["attempts"]) == 1, "exactly one job ran"
    assert set(pids(pid_dir)) == {"1-0"}, "no second job was started"
    history = json.loads((out / "result.json").read_text())["history"]
    assert history == [{"attempt": 1, "capacity": "on-demand", "start": 0}]


def test_a_retry_adopting_a_succeeded_job_returns_its_declared_output(harness: Harness, world: OperatorWorld) -> None:
    """Issue 15 defect 2: the job succeeded while no worker watched; the retry used to return output_uri None."""
    dag_id = world.dag_id("adopt")
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = write_job_dag(
        harness,
        world,
        dag_id,
        harness.toy_args(str(out), 3, 0.1),
        env={"PID_DIR": str(pid_dir)},
        poll_interval=600,
        deferrable=False,
    )
    worker, _, worker_log = harness.start(dag, dag_id)

    def started() -> int | None:
        ran = pids(pid_dir)
        # attempt 1 is the only one: another means the try saw attempt 1 end early, and the log says why
        assert set(ran) <= {"1-0"}, f"attempts {sorted(ran)} ran, not attempt 1 alone"
        return ran.get("1-0")

    try:
        wait_for(started, 120, f"the {world.name} job to start")
    except AssertionError as err:
        raise AssertionError(f"{err}\n--- the worker's log:\n{worker_log.read_text()[-6000:]}") from None
    wait_for(lambda: (out / "result.json").exists(), 120, "the job to finish its work")
    os.killpg(worker.pid, signal.SIGKILL)  # dies before its next poll (every 10 minutes) could see the end
    worker.wait(timeout=10)

    run = harness.run(dag, dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    assert "(started by try 1;" in run.log and "it already succeeded: returning its result" in run.log
    assert len(world.created()) == 1
    assert task["xcom"]["output_uri"] == f"file://{out}"


def test_a_job_submitted_before_the_crash_could_record_it_is_found_by_name(
    harness: Harness, world: OperatorWorld
) -> None:
    """The task state store is empty (the crash came first): the retry asks the service by the job's name."""
    dag_id = world.dag_id("lookup")
    out, release = harness.tmp / "out", harness.tmp / "release"
    # held after its last step until the retry has reattached: however slow the machine, it is still running
    command = harness.toy_args(str(out), 5, 0.1, "--hold-until", str(release))
    dag = write_job_dag(harness, world, dag_id, command, poll_interval=0.3, deferrable=False)
    # submit "attempt 1 of try 1" as the crashed worker would have, with nothing recorded
    request = world.request("lookup", command, task=world.task_key(dag_id))
    assert request.identity == JobIdentity(world.task_key(dag_id), try_number=1, attempt=1, capacity="on-demand")
    world.backend().submit(request)
    retry = harness.start(dag, dag_id)
    wait_for(lambda: f"Reattached to {world.name} job" in retry[2].read_text(), 180, "the retry to reattach")
    release.touch()
    run = harness.finish(*retry)
    assert run.task()["state"] == "success", run.log[-4000:]
    assert [c.name for c in world.created()] == [request.identity.name], "found by name, not created again"
    assert run.task()["xcom"]["job_id"] in {request.identity.name} | {
        h.job_id for h in world.handles(request.identity.task)
    }
    world.check_found_by_name()
