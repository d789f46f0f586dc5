"""The first try of a task reads no attempt records from the task state store, and loses nothing by it.

``GpuJobOperator.execute()`` skips the store's read (an API-server round trip before every launch) on the
first execution of a task instance (:func:`gpu_provider.operators._state.first_execution`: try 1, never
rescheduled), because nothing can be in the store then; elsewhere it reads the store while the backend
looks the task's attempts up. What that rests on is Airflow's, so the first test checks it against the
installed Airflow: should a later Airflow run a task instance twice under try 1 with its store kept, the
suite turns red. The others show what the skip and the overlap keep: a retry and a crashed worker's
successor still reattach, and a first try that finds an attempt after all reads the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, JobState, JobStatus, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.engine.places import recover_at_start
from gpu_provider.job import GpuResources
from gpu_provider.operators import GpuJobOperator
from gpu_provider.records import AttemptRecord
from tests.harness import HERE
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

PROBE_DAG = """
import json
from datetime import datetime, timedelta, timezone
from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowRescheduleException
from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
from gpu_provider.operators._state import first_execution

NOTES = {notes!r}


class Probe(BaseOperator):
    def __init__(self, *, scenario, **kwargs):
        super().__init__(**kwargs)
        self.scenario = scenario

    def note(self, context, method):
        seen = context["task_state_store"].get("probe")
        with open(NOTES, "a") as f:
            f.write(json.dumps({{
                "task": self.task_id, "method": method, "try": context["ti"].try_number,
                "reschedules": context.get("task_reschedule_count"), "seen": seen,
                "first": first_execution(context) if method == "execute" else None,
            }}) + "\\n")
        return seen or []

    def execute(self, context):
        runs = self.note(context, "execute") + [context["ti"].try_number]
        context["task_state_store"].set("probe", runs)
        if self.scenario == "retry" and len(runs) == 1:
            raise RuntimeError("the first execution fails")
        if self.scenario == "reschedule" and len(runs) == 1:
            raise AirflowRescheduleException(datetime.now(timezone.utc) + timedelta(seconds=0.2))
        if self.scenario == "defer":
            self.defer(trigger=TimeDeltaTrigger(timedelta(0)), method_name="resume")

    def resume(self, context, event=None):
        self.note(context, "resume")


with DAG(dag_id={dag_id!r}, schedule=None, catchup=False) as dag:
    for scenario in ("plain", "retry", "reschedule", "defer"):
        Probe(task_id=scenario, scenario=scenario, retries=1, retry_delay=timedelta(0))
"""


def test_airflow_runs_a_task_instance_again_only_under_a_higher_try_or_a_reschedule(airflow_home: Path) -> None:
    """Every execute() that first_execution() calls first found the store empty; every other execution of the
    same task instances (retry, clear, reschedule, resume from a deferral) did not, or was not execute()."""
    notes, dag_id = airflow_home / "first_execution_notes.jsonl", "first_execution_probe"
    notes.unlink(missing_ok=True)
    dag_file = airflow_home / "dags" / f"{dag_id}.py"
    dag_file.parent.mkdir(parents=True, exist_ok=True)
    dag_file.write_text(PROBE_DAG.format(notes=str(notes), dag_id=dag_id))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(HERE / "first_execution_run.py"), str(dag_file), dag_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and "round 2: success" in done.stdout, (done.stdout + done.stderr)[-4000:]
    seen = [json.loads(line) for line in notes.read_text().splitlines()]
    by_task: dict[str, list[tuple[str, int, int, Any, bool | None]]] = {}
    for n in seen:
        by_task.setdefault(n["task"], []).append((n["method"], n["try"], n["reschedules"], n["seen"], n["first"]))

    # the skip's condition: wherever it holds, the store was empty
    assert all(n["seen"] is None for n in seen if n["first"]), "\n".join(map(str, seen))
    # round 1 (dag.test) and round 2 (a clear, then the scheduler's schedule_tis): the store outlives tries
    assert by_task["plain"] == [("execute", 1, 0, None, True), ("execute", 2, 0, [1], False)]
    assert by_task["retry"] == [
        ("execute", 1, 0, None, True),
        ("execute", 2, 0, [1], False),  # the retry: try 2, try 1's record still there
        ("execute", 3, 0, [1, 2], False),  # after the clear
    ]
    # a reschedule keeps try 1, counted in task_reschedule_count: not a first execution
    assert by_task["reschedule"] == [
        ("execute", 1, 0, None, True),
        ("execute", 1, 1, [1], False),
        ("execute", 2, 0, [1, 1], False),
    ]
    # a resume from a deferral enters its next_method under the same try, never execute()
    assert by_task["defer"] == [
        ("execute", 1, 0, None, True),
        ("resume", 1, 0, [1], None),
        ("execute", 2, 0, [1], False),
        ("resume", 2, 0, [1, 2], None),
    ]


# --- the read skipped, overlapped, or read after all: recover_at_start with a scripted service ---------------
TASK = TaskKey("first_dag", "job", "manual__run", -1)


class LookingUp(ScriptedBackend):
    """A service whose lookup notes when it runs; while ``lookup_waits_for`` is set, the lookup waits (with a
    deadline) for it, so a test can see whether the store's read runs at the same time."""

    lookup_started = threading.Event()
    lookup_waits_for: threading.Event | None = None
    lookups: list[float] = []

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        LookingUp.lookups.append(time.monotonic())
        LookingUp.lookup_started.set()
        if LookingUp.lookup_waits_for is not None:
            assert LookingUp.lookup_waits_for.wait(30), "the store's read did not start while the lookup ran"
        return [h for h in self.handles.values() if h.name.startswith(task.dag_id)]


@pytest.fixture
def looking_up(scripted: type[ScriptedBackend]) -> type[LookingUp]:  # noqa: F811 (the fixture, by name)
    LookingUp.lookup_started = threading.Event()
    LookingUp.lookup_waits_for = None
    LookingUp.lookups = []
    return LookingUp


def _log() -> Any:
    import logging

    return logging.getLogger("test-first-execution")


def _handle(attempt: int) -> JobHandle:
    return JobHandle("scripted", f"j{attempt}", f"first_dag-job-{attempt}", attempt, "on-demand", time.time() - 60)


def test_a_first_execution_that_finds_nothing_does_not_read_the_store(looking_up: type[LookingUp]) -> None:
    reads: list[float] = []

    def read_store() -> tuple[list[AttemptRecord], None]:
        reads.append(time.monotonic())
        return [], None

    records, stored, summary = recover_at_start(LookingUp(), TASK, read_store, _log(), first_execution=True)
    assert (records, stored, summary, reads) == ([], [], None, [])
    assert len(looking_up.lookups) == 1, "the backend's lookup is asked in every case"


def test_a_first_execution_that_finds_an_attempt_reads_the_store_after_the_lookup(
    looking_up: type[LookingUp],
) -> None:
    """An earlier execution of try 1 after all (``airflow tasks test`` run again, a future Airflow): the store's
    records (resume point, interruption, owner) are read and kept, as on any retry."""
    handle = _handle(1)
    looking_up.handles[handle.job_id] = handle
    looking_up.table[handle.job_id] = JobStatus(state=JobState.RUNNING)
    kept = AttemptRecord.new(handle, try_number=1)
    kept.owner_try = 1
    reads: list[float] = []

    def read_store() -> tuple[list[AttemptRecord], None]:
        reads.append(time.monotonic())
        return [kept], None

    records, stored, _ = recover_at_start(LookingUp(), TASK, read_store, _log(), first_execution=True)
    assert len(reads) == 1 and reads[0] > looking_up.lookups[0], "read once, after the lookup found an attempt"
    assert stored == [kept] and records == [kept] and records[0].state is JobState.RUNNING


def test_a_later_execution_reads_the_store_while_the_backend_looks_up(looking_up: type[LookingUp]) -> None:
    """A retry pays the longer of the store's read and the lookup, not both: each waits (30 s at most) for
    the other to have started, which only a concurrent read lets happen."""
    handle = _handle(1)
    looking_up.handles[handle.job_id] = handle
    looking_up.table[handle.job_id] = JobStatus(state=JobState.RUNNING)
    looking_up.lookup_waits_for = read_started = threading.Event()
    stored_record = AttemptRecord.new(handle, try_number=1)

    def read_store() -> tuple[list[AttemptRecord], None]:
        read_started.set()
        assert looking_up.lookup_started.wait(30), "the lookup did not start while the store was read"
        return [stored_record], None

    records, stored, _ = recover_at_start(LookingUp(), TASK, read_store, _log(), first_execution=False)
    assert stored == [stored_record] and [r.job_id for r in records] == [handle.job_id]


def test_where_the_store_cannot_be_read_from_a_thread_it_is_read_first(looking_up: type[LookingUp]) -> None:
    """dag.test()'s in-process comms have no lock: there the read comes first, alone."""
    order: list[str] = []

    def read_store() -> tuple[list[AttemptRecord], None]:
        order.append("read" if not looking_up.lookup_started.is_set() else "read after lookup")
        return [], None

    recover_at_start(LookingUp(), TASK, read_store, _log(), first_execution=False, in_parallel=False)
    assert order == ["read"] and len(looking_up.lookups) == 1


# --- the operator: a first try's launch reads nothing; a try that finds a job reattaches to it -----------------
class CountingStore:
    """A task state store (Airflow's is per task instance, across tries) that counts its reads."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.reads = 0

    def get(self, key: str) -> Any:
        self.reads += 1
        return self.data.get(key)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = json.loads(json.dumps(value))


class _Ti:
    def __init__(self, run_id: str, try_number: int) -> None:
        self.dag_id, self.task_id, self.run_id, self.map_index = "first_dag", "job", run_id, -1
        self.try_number, self.max_tries, self.start_date = try_number, 1, None
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def _execute(tmp_path: Path, store: CountingStore, try_number: int, command: list[str]) -> dict[str, Any]:
    op = GpuJobOperator(
        task_id="job",
        backend=LocalBackend(state_dir=str(tmp_path / "state"), grace_period=1),
        command=command,
        poll_interval=0.1,
        deferrable=False,
        retries=1,
    )
    context = {"ti": _Ti("manual__first", try_number), "task_state_store": store, "task_reschedule_count": 0}
    result: dict[str, Any] = op.execute(context)  # type: ignore[arg-type]
    return result


def test_a_first_try_launches_without_reading_the_task_state_store_and_records_its_attempt(tmp_path: Path) -> None:
    store = CountingStore()
    result = _execute(tmp_path, store, 1, [sys.executable, "-c", "pass"])
    assert store.reads == 0, "a first try's store can hold nothing: no read (an API-server round trip)"
    assert [a["state"] for a in result["attempts"]] == ["SUCCEEDED"]
    assert store.data, "its attempt is recorded for a retry"

    # the retry (try 2) of the same task instance reads the store, and a new job runs as attempt 2
    again = _execute(tmp_path, store, 2, [sys.executable, "-c", "pass"])
    assert store.reads == 1
    assert [a["attempt"] for a in again["attempts"]] == [2], "the retry runs the next attempt"


def test_a_first_try_run_again_after_a_crash_reattaches_to_the_job_it_started(tmp_path: Path) -> None:
    """Try 1 executed again with its store kept (``airflow tasks test`` twice; dag.test() also wipes the store):
    the lookup finds the running job, so the store is read after all, and the job is adopted, not doubled."""
    backend = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=1)
    release = tmp_path / "release"
    hold = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"]
    task = TaskKey("first_dag", "job", "manual__first", -1)
    handle = backend.submit(
        JobRequest(
            identity=JobIdentity(task=task, try_number=1, attempt=1, capacity="on-demand"),
            command=tuple(hold),
            env={},
            resources=GpuResources(gpus=1),
            capacity="on-demand",
        )
    )
    store = CountingStore()
    releaser = threading.Timer(1.0, release.touch)  # ends the held job once the try has had time to reattach
    releaser.start()
    try:
        result = _execute(tmp_path, store, 1, hold)
    finally:
        releaser.cancel()
        release.touch()
    assert store.reads == 1, "the lookup found a job: the store is read"
    assert result["job_id"] == handle.job_id and [a["attempt"] for a in result["attempts"]] == [1]
    assert len(backend.list_jobs()) == 1, "no second job"
