"""A zombie try never stops, nor duplicates, the job its successor took over: on every backend.

Airflow may start try 2 while try 1's worker still runs (a lost heartbeat), then SIGTERM try 1.
Try 2 reattaches and marks the job as its own (``Backend.mark``). Try 1's backend object has polled
the job before and may keep what it read (SageMaker keeps a job's tags while its status does not
change): everything destructive try 1 then decides (its ``on_kill``, a restart limit, a capacity
timeout, a resubmission after an interruption) must read the owner from the service at that
moment (``Backend.read_owner``) and leave the job alone.

Each world runs 20 zombies: 19 in this process (the backend objects and the operator's kill path,
quick) and one as a real process that Airflow's way of killing reaches (SIGTERM -> ``on_kill``).
Capacity is held meanwhile, so the jobs wait queued and the emulators start no job processes.
What the services received is read from the emulators' request logs (the local backend's service
is its state directory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.local.common import CANCEL_FILE
from gpu_provider.engine.attempts import AttemptEngine, Fail, Submit, Wait
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.engine.watch import CAPACITY_TIMEOUT, DEADLINE, RESTART_LIMIT
from gpu_provider.exceptions import GpuJobCancelledError, GpuJobPollError, GpuJobStatusError
from gpu_provider.operators import GpuJobOperator
from gpu_provider.records import AttemptRecord, load_records
from gpu_provider.recovery import SpotFallback
from gpu_provider.testing.dagrun import wait_for
from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.backends.contract.worlds import IMAGE, LONG_JOB, BackendWorld, LocalBackendWorld, poll_one
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

log = logging.getLogger("test-ownership")

RUN_TRY = Path(__file__).parents[2] / "operators" / "run_try.py"
#: zombies per backend: in-process ones, then one real process
ZOMBIES = 20
#: the operator's key in the task state store (the real-process try writes its records there)
STATE_KEY = "gpu_provider_attempts"


# --- what the service received -------------------------------------------------------------------


def _local_jobs(world: BackendWorld, handle: JobHandle) -> list[JobHandle]:
    backend = world.backend()
    assert isinstance(backend, LocalBackend)
    return [h for h in backend.list_jobs() if h.name == handle.name]


def creates(world: BackendWorld, handle: JobHandle) -> int:
    """How many times the service was asked to create the attempt's job (accepted requests)."""
    if world.name == "local":
        return len(_local_jobs(world, handle))
    emulator: Any = getattr(world, "emulator")  # noqa: B009 - every remote world has one
    action, field = {
        "batch": ("SubmitJob", "jobName"),
        "sagemaker": ("CreateTrainingJob", "TrainingJobName"),
        "kubernetes": ("create pods", None),
    }[world.name]
    found = 0
    for entry in emulator.requests(action):
        if entry["throttled"]:
            continue
        body = entry["body"]
        name = body["body"]["metadata"]["name"] if field is None else body.get(field)
        found += name == handle.name
    return found


def stops(world: BackendWorld, handle: JobHandle) -> int:
    """How many times the service was asked to stop the attempt's job."""
    if isinstance(world, LocalBackendWorld):
        return sum((world._job_dir(h) / CANCEL_FILE).exists() for h in _local_jobs(world, handle))
    emulator: Any = getattr(world, "emulator")  # noqa: B009
    if world.name == "batch":
        return sum(e["body"].get("jobId") == handle.job_id for e in emulator.requests("TerminateJob"))
    if world.name == "sagemaker":
        return sum(e["body"].get("TrainingJobName") == handle.name for e in emulator.requests("StopTrainingJob"))
    return sum(e["body"]["path"].endswith(f"/pods/{handle.name}") for e in emulator.requests("delete pods"))


def reads(world: BackendWorld, handle: JobHandle) -> int | None:
    """Status reads of the job the service answered (the zombie's polls); ``None`` for the local backend,
    whose service is a folder it reads anew each time (nothing kept between reads)."""
    emulator: Any = getattr(world, "emulator", None)
    if world.name == "batch":
        return sum(handle.job_id in (e["body"].get("jobs") or []) for e in emulator.requests("DescribeJobs"))
    if world.name == "sagemaker":
        return sum(e["body"].get("TrainingJobName") == handle.name for e in emulator.requests("DescribeTrainingJob"))
    if world.name == "kubernetes":
        return len(emulator.requests("list pods"))
    return None


# --- one try's side ----------------------------------------------------------------------------------


def _runner(backend: Backend, record: AttemptRecord, try_number: int) -> AttemptRunner:
    engine = AttemptEngine(SpotFallback(backoff=0), [record], try_number=try_number, backend_name=backend.name)
    return AttemptRunner(
        backend,
        engine,
        log=log,
        label=f"Airflow task zombie.job (try {try_number})",
        stop=threading.Event(),
        persist=lambda records: None,
        cancel_retry_s=0.0,
    )


def _killed_operator(backend: Backend, handle: JobHandle, try_number: int) -> GpuJobOperator:
    """Try ``try_number``'s operator as Airflow kills it: its backend object is the one that polled."""
    op = GpuJobOperator(task_id="job", command=["true"], image=IMAGE, backend=backend, deferrable=False)
    op._backend, op._handle, op._try_number = backend, handle, try_number
    return op


def _take_over(successor: Backend, handle: JobHandle) -> None:
    """Try 2 reattaches: its runner reads the owner fresh (try 1: not later) and marks the job as its own."""
    record = AttemptRecord.new(handle, try_number=1)
    _runner(successor, record, 2).take_over(record)
    assert record.owner_try == 2


def _zombie_in_process(world: BackendWorld, zombie: Backend, successor: Backend, n: int) -> JobHandle:
    """One zombie; ``zombie`` and ``successor`` are the two tries' backend objects (each keeps its caches
    across the zombies, as a long-lived worker's would; building AWS clients anew each time is slow)."""
    task = world.task(f"zombie{n}")
    handle = zombie.submit(world.request("zombie", LONG_JOB, task=task, capacity=names.SPOT))
    assert poll_one(zombie, handle).owner_try == 1  # try 1 watches; what it read may be kept
    _take_over(successor, handle)
    stale = poll_one(zombie, handle)  # still watching: a cache may still say try 1

    _killed_operator(zombie, handle, 1).on_kill()  # Airflow's SIGTERM reaches try 1's on_kill

    record = AttemptRecord.new(handle, try_number=1)
    runner = _runner(zombie, record, 1)
    spot_restarted = JobStatus.from_dict({**stale.to_dict(), "restarts": 3, "state": JobState.QUEUED.value})
    for outcome in (RESTART_LIMIT, CAPACITY_TIMEOUT, DEADLINE):
        with pytest.raises(GpuJobCancelledError, match="owned by Airflow try 2"):
            runner.after_wait(record, spot_restarted, outcome)
    record.update(JobStatus(state=JobState.PREEMPTED, interruption=names.PREEMPTED, reason="spot reclaimed"))
    with pytest.raises(GpuJobCancelledError, match="owned by Airflow try 2"):
        runner.check_submit(Submit(attempt=2, capacity=names.ON_DEMAND))
    return handle


def _zombie_process(world: BackendWorld, tmp_path: Path) -> JobHandle:
    """Try 1 as a real process running the operator (sync wait); try 2 takes over; Airflow SIGTERMs try 1."""
    run_id = "manual__zombie_process"
    store, out = tmp_path / "store.json", tmp_path / "try1.json"
    spec = {
        "state_dir": str(tmp_path / "unused-local-state"),
        "backend": world.backend().spec(),
        "image": IMAGE,
        "command": list(LONG_JOB),
        "try_number": 1,
        "store": str(store),
        "run_id": run_id,
        "poll_interval": 0.2,
    }
    with (tmp_path / "try1.log").open("w") as output:
        zombie = subprocess.Popen(
            [sys.executable, str(RUN_TRY), json.dumps(spec), str(out)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
            start_new_session=True,
        )
    try:

        def submitted() -> JobHandle | None:
            if zombie.poll() is not None:
                raise AssertionError(f"try 1 ended early: {(tmp_path / 'try1.log').read_text()[-3000:]}")
            data = json.loads(store.read_text()) if store.exists() else {}
            records = load_records(data.get(STATE_KEY))
            return records[0].handle if records else None

        handle: JobHandle = wait_for(submitted, 90, "try 1 to submit its job")
        assert handle.name.startswith(TaskKey("zombie_dag", "job", run_id).prefix)
        if reads(world, handle) is not None:
            wait_for(lambda: (reads(world, handle) or 0) >= 1, 30, "try 1 to poll its job")
        _take_over(world.backend(), handle)
        polled = reads(world, handle)
        if polled is not None:
            wait_for(lambda: (reads(world, handle) or 0) > polled, 30, "try 1 to poll again after try 2 took over")
        wait_for(lambda: Path(f"{out}.pid-ready").exists(), 30, "try 1's SIGTERM handler")
        zombie.send_signal(signal.SIGTERM)  # what Airflow does to the replaced worker
        zombie.wait(timeout=60)
        result = json.loads(out.read_text())
        assert result["state"] == "failed", result  # it stopped watching, without touching the job
        return handle
    finally:
        if zombie.poll() is None:
            os.killpg(zombie.pid, signal.SIGKILL)
            zombie.wait(timeout=10)


def test_a_zombie_try_never_stops_or_duplicates_its_successors_job(world: BackendWorld, tmp_path: Path) -> None:
    """Issue 24.1: 20 zombies per backend; 0 stops of the successor's job, 0 duplicate creates."""
    world.hold_capacity()
    handles: list[JobHandle] = []
    try:
        zombie, successor = world.backend(), world.backend()
        handles += [_zombie_in_process(world, zombie, successor, n) for n in range(ZOMBIES - 1)]
        handles.append(_zombie_process(world, tmp_path))
        checker = world.backend()
        for handle in handles:
            assert stops(world, handle) == 0, f"a zombie stopped {handle.name}, which try 2 owns"
            assert creates(world, handle) == 1, f"{handle.name} was created {creates(world, handle)} times"
            status = poll_one(checker, handle)
            assert status.state.active and status.owner_try == 2, status
        assert len(handles) == ZOMBIES
    finally:
        owner = world.backend()
        for handle in handles:
            owner.cancel(handle, "ownership test teardown")
        world.release_capacity()


def test_a_kill_cancels_the_job_its_own_try_still_owns(world: BackendWorld) -> None:
    """The other side of the rule: a killed try that still owns its job stops it (no GPU billing for nobody)."""
    world.hold_capacity()
    try:
        backend = world.backend()
        handle = backend.submit(world.request("owned", LONG_JOB))
        poll_one(backend, handle)
        assert not backend.read_owner(handle).later_than(1)
        _killed_operator(backend, handle, 1).on_kill()
        assert stops(world, handle) == 1
    finally:
        world.release_capacity()


def test_a_deferred_zombies_kill_leaves_its_successors_job(world: BackendWorld) -> None:
    """The trigger's ``on_kill`` (a task killed while deferred) reads the owner fresh too."""
    world.hold_capacity()
    try:
        zombie = world.backend()
        handle = zombie.submit(world.request("deferred", LONG_JOB))
        poll_one(zombie, handle)
        _take_over(world.backend(), handle)

        def killed(try_number: int) -> None:
            trigger = GpuJobTrigger(backend=zombie.spec(), handle=handle.to_dict(), try_number=try_number)
            asyncio.run(trigger.on_kill())

        killed(1)
        assert stops(world, handle) == 0, "try 1's trigger stopped the job try 2 owns"
        killed(2)
        assert stops(world, handle) == 1, "the owner's trigger must stop its job when killed"
    finally:
        world.release_capacity()


# --- when the owner cannot be read (scripted service: its reads fail) ---------------------------------


def _scripted_record(job_id: str, owner_try: int) -> AttemptRecord:
    handle = JobHandle("scripted", job_id, f"gp-{job_id}", 1, names.SPOT, time.time() - 100)
    return AttemptRecord.new(handle, try_number=owner_try)


@pytest.mark.usefixtures("scripted")
def test_an_unreadable_owner_stops_nothing_that_a_new_attempt_would_follow() -> None:
    """Missing evidence: no stop that leads to a resubmission, no resubmission, no take over; a stop that
    ends the try (deadline) still happens, so the job does not bill for nobody."""
    record = _scripted_record("j1", owner_try=1)
    ScriptedBackend.table["j1"] = GpuJobStatusError("the service did not answer")
    runner = _runner(ScriptedBackend(), record, 1)
    queued = JobStatus(state=JobState.QUEUED, restarts=3)
    for outcome in (RESTART_LIMIT, CAPACITY_TIMEOUT):
        assert runner.after_wait(record, queued, outcome) == Wait(record)
    assert ScriptedBackend.cancels == []
    with pytest.raises(GpuJobPollError, match="nothing was submitted on a guess"):
        runner.check_submit(Submit(attempt=2, capacity=names.ON_DEMAND))
    with pytest.raises(GpuJobPollError, match="did not take it over"):
        _runner(ScriptedBackend(), record, 2).take_over(record)
    assert ScriptedBackend.marks == []
    step = runner.after_wait(record, queued, DEADLINE)
    assert isinstance(step, Fail) and [job for job, _ in ScriptedBackend.cancels] == ["j1"]


@pytest.mark.usefixtures("scripted")
def test_a_retry_resumes_after_an_earlier_tries_attempt_whose_owner_cannot_be_read() -> None:
    """A newer try than the attempt's known owner is not the zombie: it submits the next attempt."""
    record = _scripted_record("j1", owner_try=1)
    record.update(JobStatus(state=JobState.FAILED, reason="exit code 1"))
    ScriptedBackend.table["j1"] = GpuJobStatusError("another machine's job")
    _runner(ScriptedBackend(), record, 2).check_submit(Submit(attempt=2, capacity=names.ON_DEMAND))
    assert ScriptedBackend.owner_reads == ["j1"]


@pytest.mark.usefixtures("scripted")
def test_a_later_owner_read_now_wins_over_the_records() -> None:
    """The record (from a poll's cache, or the task state store) says try 1; the service says try 2."""
    record = _scripted_record("j1", owner_try=1)
    ScriptedBackend.table["j1"] = JobStatus(state=JobState.RUNNING, owner_try=2)
    runner = _runner(ScriptedBackend(), record, 1)
    with pytest.raises(GpuJobCancelledError, match="owned by Airflow try 2"):
        runner.after_wait(record, JobStatus(state=JobState.RUNNING, owner_try=1), DEADLINE)
    assert ScriptedBackend.cancels == [] and record.owner_try == 2
