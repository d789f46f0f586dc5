"""A job's own failure, on every backend: the task fails with the service's reason and the exit code, its
last lines reach the task log and its error, and nothing is resubmitted without retries. Real Airflow
(dag.test in a child process)."""

from __future__ import annotations

import sys

from tests.harness import Harness
from tests.operators.suite.helpers import write_job_dag
from tests.operators.suite.worlds import OperatorWorld


def test_a_failing_job_fails_the_task_with_its_exit_code_and_last_log_lines(
    harness: Harness, world: OperatorWorld
) -> None:
    dag_id = world.dag_id("fails")
    code = "import sys; print('loading data'); print('fatal: no such table', file=sys.stderr); sys.exit(3)"
    dag = write_job_dag(harness, world, dag_id, [sys.executable, "-c", code], poll_interval=0.3, deferrable=False)
    run = harness.run(dag, dag_id)
    assert run.task()["state"] == "failed", run.log[-4000:]
    ended = [line for line in run.log.splitlines() if "ended FAILED: " in line and "(exit code 3)" in line]
    assert ended and world.exit_3_words in ended[0].split("ended FAILED: ", 1)[1], ended or run.log[-4000:]
    # the job exits at once; its last lines still reach the task log (read until the log settles)
    streamed = [line.split("[job] ", 1)[1] for line in run.log.splitlines() if "[job] " in line]
    for said in ("loading data", "fatal: no such table"):
        assert any(said in line for line in streamed), (said, streamed)
    # and the task's error quotes them: read from the end of the job's stream
    quoted = run.log[run.log.index("lines of the job's output:") :].splitlines()[1:4]
    assert any(line.strip().endswith("fatal: no such table") for line in quoted), quoted
    assert len(world.created()) == 1, "a job's own failure is not resubmitted without retries"
