"""GpuJobSensor against real backends: local processes and the AWS Batch emulator (DAGs run by
``dag.test()`` in a child process), the trigger's JSON round trip, following a resubmitted attempt,
and 100 deferred sensors sharing one batched poll per tick (scripted service)."""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from gpu_provider import names
from gpu_provider.backends.aws import calls as batch_calls
from gpu_provider.backends.base import (
    JobHandle,
    JobIdentity,
    JobRequest,
    JobState,
    JobStatus,
    TaskKey,
    registered_backends,
)
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from gpu_provider.links.gpu_job import CONSOLE_URL_XCOM_KEY
from gpu_provider.sensors.gpu_job import GpuJobSensor
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from gpu_provider.triggers.gpu_job_watch import GpuJobWatchTrigger
from tests.batch_world import BatchWorld
from tests.harness import Harness, wait_for
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

SENSOR_IMPORT = "from gpu_provider.sensors.gpu_job import GpuJobSensor\n"


class LinkedLocalBackend(LocalBackend):
    """The local backend with a console page per job, as the cloud backends have (the local backend
    itself has none): for the tests of the sensor's "GPU job" link."""

    def console_url(self, handle: JobHandle) -> str | None:
        return f"https://console.example/jobs/{handle.job_id}"


def _request(task: TaskKey, command: list[str], *, attempt: int = 1, capacity: str = names.ON_DEMAND) -> JobRequest:
    return JobRequest(
        identity=JobIdentity(task, try_number=1, attempt=attempt, capacity=capacity),
        command=tuple(command),
        env={names.ENV_ATTEMPT: str(attempt), names.ENV_CAPACITY: capacity},
        resources=GpuResources(gpus=1),
        capacity=capacity,
        image="trainer:1",
    )


def _task(name: str) -> TaskKey:
    return TaskKey("sensor_source", name, f"manual__{uuid.uuid4().hex[:10]}")


def _state(backend: LocalBackend, handle: JobHandle) -> JobState | None:
    status = backend.poll([handle])[handle.job_id]
    return status.state if isinstance(status, JobStatus) else None


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _held(release: Path, out: Path | None = None) -> list[str]:
    """A job that runs until the test creates ``release``, then declares ``out`` as its output."""
    declare = f"from gpu_provider.runtime import declare_output; declare_output({f'file://{out}'!r})" if out else ""
    return _py(f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.1)\n{declare}")


def _run_releasing(
    harness: Harness, dag: Path, dag_id: str, steps: list[tuple[str, Path]]
) -> tuple[dict[str, Any], str]:
    """Run the DAG; each time the log shows a marker (a sensor waiting on its running job), release that job."""
    proc, out_file, log_file = harness.start(dag, dag_id)
    for marker, release in steps:
        wait_for(lambda marker=marker: marker in log_file.read_text(), 90, f"the log to show {marker!r}")
        release.touch()
    assert proc.wait(timeout=120) == 0, log_file.read_text()[-4000:]
    return json.loads(out_file.read_text())["tasks"], log_file.read_text()


class _TaskInstance:
    """What ``execute`` reads from ``context["ti"]`` outside a DAG run: it records the XComs pushed."""

    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def _deferred(sensor: GpuJobSensor, ti: _TaskInstance) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"ti": ti})  # type: ignore[arg-type]
    return deferred.value


async def _first_event(trigger: GpuJobTrigger, timeout: float = 30) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)


# --- parse time -----------------------------------------------------------------------------------


def test_parse_time_checks_name_the_field() -> None:
    with pytest.raises(ValueError, match="exactly one of job_id= and job_name=; got job_id and job_name"):
        GpuJobSensor(task_id="s", backend="local", job_id="a", job_name="b")
    with pytest.raises(ValueError, match="exactly one of job_id= and job_name=; got neither"):
        GpuJobSensor(task_id="s", backend="local")
    with pytest.raises(ValueError, match="job_id='  ' must be a non-empty string"):
        GpuJobSensor(task_id="s", backend="local", job_id="  ")
    with pytest.raises(
        ValueError, match="backend='nope' is not a known backend; valid names: " + ", ".join(registered_backends())
    ):
        GpuJobSensor(task_id="s", backend="nope", job_id="a")
    with pytest.raises(ValueError, match="poll_interval=0 must be > 0"):
        GpuJobSensor(task_id="s", backend="local", job_id="a", poll_interval=0)
    with pytest.raises(ValueError, match="deferrable=True with mode='reschedule'"):
        GpuJobSensor(task_id="s", backend="local", job_id="a", deferrable=True, mode="reschedule")
    with pytest.raises(ValueError, match="deferrable='maybe'"):
        GpuJobSensor(task_id="s", backend="local", job_id="a", deferrable="maybe")
    with pytest.raises(ValueError, match="backend option 'state_dir' of the 'local' backend cannot be a template"):
        GpuJobSensor(task_id="s", backend={"name": "local", "state_dir": "{{ params.dir }}"}, job_id="a")

    default = GpuJobSensor(task_id="s", backend="local", job_name="{{ params.job }}")
    assert default.deferrable is True and default.follow_resubmits is False
    assert default.timeout == timedelta(days=7).total_seconds()  # as long as GPU jobs run
    assert default.poke_interval == LocalBackend.default_poll_interval
    rescheduled = GpuJobSensor(task_id="s", backend="local", job_id="a", mode="reschedule", poll_interval=5)
    assert (rescheduled.deferrable, rescheduled.poke_interval) == (False, 5)


# --- local backend: real processes, real Airflow --------------------------------------------------


def test_local_jobs_success_failure_cancel_in_deferred_poke_and_reschedule_modes(harness: Harness) -> None:
    backend = LocalBackend(state_dir=str(harness.state_dir), grace_period=0.5)
    out = harness.tmp / "out"
    # both run until released: the test releases each once its sensor is seen waiting on it
    ok = backend.submit(_request(_task("ok"), _held(harness.tmp / "release-ok", out)))
    ok_poke = backend.submit(_request(_task("ok_poke"), _held(harness.tmp / "release-poke")))
    bad = backend.submit(_request(_task("bad"), _py("import sys, time; time.sleep(0.5); sys.exit(3)")))
    gone = backend.submit(_request(_task("gone"), _py("import time; time.sleep(60)")))
    backend.cancel(gone, "stopped by a person")
    source = f"LocalBackend(state_dir={str(harness.state_dir)!r})"
    dag = harness.write_dag(
        "local_sensors",
        SENSOR_IMPORT
        + textwrap.dedent(f"""
        common = dict(backend={source}, poll_interval=0.2)
        deferred = GpuJobSensor(task_id="deferred_ok", job_name={ok.name!r}, **common)
        poke = GpuJobSensor(task_id="poke_ok", job_id={ok_poke.job_id!r}, deferrable=False, **common)
        rescheduled = GpuJobSensor(task_id="reschedule_ok", job_id={ok.job_id!r}, mode="reschedule", **common)
        deferred >> poke >> rescheduled
        GpuJobSensor(task_id="failed", job_id={bad.job_id!r}, retries=1, retry_delay=0, **common)
        GpuJobSensor(task_id="cancelled", job_id={gone.job_id!r}, retries=1, retry_delay=0, **common)
        GpuJobSensor(task_id="unknown", job_id="gp-no-such-job-t1-a1", **common)
        """),
    )
    tasks, log = _run_releasing(
        harness,
        dag,
        "local_sensors",
        [
            (f"Waiting for local job {ok.job_id} (attempt 1, on-demand)", harness.tmp / "release-ok"),
            (f"{ok_poke.job_id}, attempt 1, on-demand) is RUNNING; poking every 0.2s", harness.tmp / "release-poke"),
        ],
    )
    assert {t: tasks[t]["state"] for t in tasks} == {
        "deferred_ok": "success",
        "poke_ok": "success",
        "reschedule_ok": "success",
        "failed": "failed",
        "cancelled": "failed",
        "unknown": "failed",
    }, log[-5000:]
    result = tasks["deferred_ok"]["xcom"]
    assert (result["state"], result["job_id"], result["job_name"], result["backend"]) == (
        "SUCCEEDED",
        ok.job_id,
        ok.name,
        "local",
    )
    assert result["output_uri"] == f"file://{out}" and result["exit_code"] == 0
    assert result["console_url"] == result["log_url"] == backend.console_url(ok)
    assert result["followed"] == [] and result["gpu_seconds"] > 0
    assert tasks["poke_ok"]["xcom"]["job_id"] == ok_poke.job_id
    assert tasks["reschedule_ok"]["xcom"]["job_id"] == ok.job_id
    # the job's own error: Airflow retries the sensor; a deliberate cancel is final
    assert tasks["failed"]["try_number"] == 2 and tasks["cancelled"]["try_number"] == 1
    assert f"local job {bad.name} (id {bad.job_id}, attempt 1, on-demand) ended FAILED: " in log
    assert "(exit code 3)" in log
    assert f"local job {gone.name} (id {gone.job_id}, attempt 1, on-demand) was CANCELLED: stopped by a person" in log
    assert "has no job with job_id='gp-no-such-job-t1-a1' (backend 'local')" in log
    # the sensor only watched: the jobs ended on their own
    assert backend.poll([ok])[ok.job_id].state is JobState.SUCCEEDED  # type: ignore[union-attr]


def test_follow_resubmits_waits_for_the_next_attempt_of_the_same_task(harness: Harness) -> None:
    """A spot job is reclaimed; the next attempt of its task instance (as GpuJobOperator submits it) is
    followed to its end. Without follow_resubmits the sensor fails naming the interruption; when the
    owning task gave up (the attempt is marked collected) it fails at once."""
    backend = LocalBackend(state_dir=str(harness.state_dir), grace_period=0.5)
    task, given_up = _task("train"), _task("given_up")
    first = backend.submit(_request(task, _py("import time; time.sleep(60)"), capacity=names.SPOT))
    lost = backend.submit(_request(given_up, _py("import time; time.sleep(60)"), capacity=names.SPOT))
    wait_for(lambda: backend.job_pids(lost), 20, "the second spot job to start")
    backend.simulate_preemption(lost)
    wait_for(lambda: _state(backend, lost) is JobState.PREEMPTED, 20, "the second spot job to be reclaimed")
    backend.mark(lost, collected=True)  # what GpuJobOperator does when its interruption budget is spent
    source = f"LocalBackend(state_dir={str(harness.state_dir)!r})"
    dag = harness.write_dag(
        "follow_sensors",
        SENSOR_IMPORT
        + textwrap.dedent(f"""
        common = dict(backend={source}, poll_interval=0.2)
        follow = GpuJobSensor(
            task_id="follow", job_name={first.name!r}, follow_resubmits=True, resubmit_timeout=60, **common
        )
        follow >> GpuJobSensor(task_id="no_follow", job_id={first.job_id!r}, **common)
        follow >> GpuJobSensor(task_id="given_up", job_id={lost.job_id!r}, follow_resubmits=True, **common)
        """),
    )
    proc, out_file, log_file = harness.start(dag, "follow_sensors")
    # the spot capacity is reclaimed while the sensor waits deferred on the first attempt
    wait_for(lambda: f"Waiting for local job {first.job_id}" in log_file.read_text(), 120, "the sensor to defer")
    backend.simulate_preemption(first)
    wait_for(lambda: _state(backend, first) is JobState.PREEMPTED, 20, "the first attempt to be reclaimed")
    second = backend.submit(_request(task, _py("print('attempt 2 done')"), attempt=2))
    assert proc.wait(timeout=120) == 0, log_file.read_text()[-4000:]
    tasks = json.loads(out_file.read_text())["tasks"]
    log = log_file.read_text()
    assert {t: tasks[t]["state"] for t in tasks} == {
        "follow": "success",
        "no_follow": "failed",
        "given_up": "failed",
    }, log[-4000:]
    result = tasks["follow"]["xcom"]
    assert (result["job_id"], result["attempt"], result["state"], result["followed"]) == (
        second.job_id,
        2,
        "SUCCEEDED",
        [first.job_id],
    )
    assert "following the next attempt: local job " + second.name in log
    reclaimed = "ended PREEMPTED: simulated spot interruption (LocalBackend.simulate_preemption)"
    assert f"{first.name} (id {first.job_id}, attempt 1, spot) {reclaimed}" in log
    assert "set follow_resubmits=True to wait for that attempt" in log
    assert "The task that runs it gave up on it" in log


def test_poke_mode_follows_a_lost_job_to_the_next_attempt(tmp_path: Path) -> None:
    """The service forgets the job while the sensor pokes (its folder is gone: ``lost``, an interruption
    the operator resubmits): the task instance was read while the job was known, so the next attempt is found."""
    backend = LinkedLocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    task = _task("lost")
    first = backend.submit(_request(task, _py("import time; time.sleep(60)"), capacity=names.SPOT))
    try:
        sensor = GpuJobSensor(
            task_id="s",
            backend=backend,
            job_id=first.job_id,
            deferrable=False,
            follow_resubmits=True,
            poll_interval=0.2,
        )
        ti = _TaskInstance()
        assert sensor.poke({"ti": ti}) is False  # type: ignore[arg-type]
        backend.cancel(first, "test: stop it before its folder goes")
        wait_for(lambda: _state(backend, first) is JobState.CANCELLED, 20, "the first attempt to stop")
        shutil.rmtree(first.extra["job_dir"])
        lost = backend.poll([first])[first.job_id]
        assert isinstance(lost, JobStatus) and lost.interruption == names.LOST, lost
        assert sensor.poke({"ti": ti}) is False  # type: ignore[arg-type]  # no next attempt yet
        second = backend.submit(_request(task, _py("print('attempt 2')"), attempt=2))
        done = wait_for(lambda: sensor.poke({"ti": ti}), 20, "the sensor to follow the second attempt")  # type: ignore[arg-type]
        assert (done.xcom_value["job_id"], done.xcom_value["followed"]) == (second.job_id, [first.job_id])
        assert ti.xcoms[CONSOLE_URL_XCOM_KEY] == backend.console_url(second)  # the link follows too
    finally:
        for handle in backend.list_jobs():
            backend.cancel(handle, "test teardown")


# --- AWS Batch emulator ----------------------------------------------------------------------------


def test_batch_jobs_success_failure_cancel_deferred_and_poke(harness: Harness, batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    out = harness.tmp / "out"
    # both run until released: the test releases each once its sensor is seen waiting on it
    ok = backend.submit(_request(_task("ok"), _held(harness.tmp / "release-ok", out)))
    ok_poke = backend.submit(_request(_task("ok_poke"), _held(harness.tmp / "release-poke")))
    bad = backend.submit(_request(_task("bad"), _py("import sys; print('boom', flush=True); sys.exit(3)")))
    gone = backend.submit(_request(_task("gone"), _py("import time; time.sleep(60)")))
    backend.cancel(gone, "stopped by a person")
    dag = harness.write_dag(
        "batch_sensors",
        SENSOR_IMPORT
        + textwrap.dedent(f"""
        common = dict(backend={batch.backend_source()}, poll_interval=0.3)
        deferred = GpuJobSensor(task_id="deferred_ok", job_id={ok.job_id!r}, **common)
        deferred >> GpuJobSensor(task_id="poke_ok", job_name={ok_poke.name!r}, deferrable=False, **common)
        GpuJobSensor(task_id="failed", job_id={bad.job_id!r}, **common)
        GpuJobSensor(task_id="cancelled", job_name={gone.name!r}, **common)
        """),
    )
    tasks, log = _run_releasing(
        harness,
        dag,
        "batch_sensors",
        [
            (f"Waiting for batch job {ok.job_id} (attempt 1, on-demand)", harness.tmp / "release-ok"),
            (f"{ok_poke.job_id}, attempt 1, on-demand) is RUNNING; poking every 0.3s", harness.tmp / "release-poke"),
        ],
    )
    assert {t: tasks[t]["state"] for t in tasks} == {
        "deferred_ok": "success",
        "poke_ok": "success",
        "failed": "failed",
        "cancelled": "failed",
    }, log[-5000:]
    result = tasks["deferred_ok"]["xcom"]
    assert (result["backend"], result["job_id"], result["job_name"], result["state"]) == (
        "batch",
        ok.job_id,
        ok.name,
        "SUCCEEDED",
    )
    assert result["output_uri"] == f"file://{out}"  # declared in the job's log, read from CloudWatch
    assert result["console_url"] == backend.console_url(ok)
    assert "/aws/batch/job" in result["log_url"].replace("$252F", "/")  # the job's CloudWatch stream
    assert tasks["poke_ok"]["xcom"]["job_id"] == ok_poke.job_id
    assert f"batch job {bad.name} (id {bad.job_id}, attempt 1, on-demand) ended FAILED: " in log
    assert f"batch job {gone.name} (id {gone.job_id}, attempt 1, on-demand) was CANCELLED: stopped by a person" in log


def test_a_throttled_poke_is_not_yet_and_the_next_one_reads_the_job(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore's own retries off and the backend's backoff shortened: persistent throttling shows at once
    extra = {
        "endpoint_url": batch.emulator.endpoint_url,
        "region_name": batch.emulator.region,
        "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 1}},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))
    monkeypatch.setattr(batch_calls, "BASE_DELAY_S", 0.01, raising=False)
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(_request(_task("throttled"), _py("print('done')")))
    sensor = GpuJobSensor(task_id="s", backend=backend, job_id=handle.job_id, deferrable=False, poll_interval=0.2)
    ti = _TaskInstance()
    batch.emulator.throttle("DescribeJobs", 1)  # every call
    assert sensor.poke({"ti": ti}) is False  # type: ignore[arg-type]
    assert any(r["throttled"] for r in batch.emulator.requests("DescribeJobs"))
    batch.emulator.throttle("DescribeJobs", 0)
    done = wait_for(lambda: sensor.poke({"ti": ti}), 30, "the sensor to see the job succeed")  # type: ignore[arg-type]
    assert done.xcom_value["job_id"] == handle.job_id and done.xcom_value["state"] == "SUCCEEDED"


# --- the trigger ---------------------------------------------------------------------------------


def test_trigger_round_trips_through_json_and_its_event_completes_the_sensor(tmp_path: Path) -> None:
    backend = LinkedLocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    handle = backend.submit(_request(_task("round_trip"), _py("import time; time.sleep(1); print('ok')")))
    try:
        sensor = GpuJobSensor(task_id="s", backend=backend, job_id=handle.job_id, poll_interval=0.2, timeout=60)
        ti = _TaskInstance()
        deferred = _deferred(sensor, ti)
        assert ti.xcoms[CONSOLE_URL_XCOM_KEY] == backend.console_url(handle)  # the "GPU job" link while it runs
        classpath, kwargs = deferred.trigger.serialize()
        assert classpath == "gpu_provider.triggers.gpu_job_watch.GpuJobWatchTrigger"
        module, _, name = classpath.rpartition(".")
        rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
        assert rebuilt.serialize() == (classpath, kwargs)
        assert JobHandle.from_dict(rebuilt.handle) == handle and rebuilt.stream_logs is False
        assert 0 < rebuilt.deadline - time.time() <= 60

        event = asyncio.run(_first_event(rebuilt))
        assert event["status"] == "succeeded"
        next_kwargs = json.loads(json.dumps(deferred.kwargs))
        result = getattr(sensor, deferred.method_name)({"ti": ti}, event=event, **next_kwargs)
        assert (result["job_id"], result["state"]) == (handle.job_id, "SUCCEEDED")
    finally:
        backend.cancel(handle, "test teardown")


def test_killing_a_deferred_sensor_leaves_the_watched_job_running(tmp_path: Path) -> None:
    backend = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    handle = backend.submit(_request(_task("kill"), _py("import time; time.sleep(30)")))
    try:
        sensor = GpuJobSensor(task_id="s", backend=backend, job_id=handle.job_id, poll_interval=0.2)
        trigger = _deferred(sensor, _TaskInstance()).trigger
        assert isinstance(trigger, GpuJobWatchTrigger)
        asyncio.run(trigger.on_kill())
        status = backend.poll([handle])[handle.job_id]
        assert isinstance(status, JobStatus) and status.state.active, status
        assert not (Path(handle.extra["job_dir"]) / "cancel.json").exists()
    finally:
        backend.cancel(handle, "test teardown")


def test_a_deadline_event_times_the_sensor_out_and_leaves_the_job_alone() -> None:
    from airflow.sdk.exceptions import AirflowSensorTimeout

    sensor = GpuJobSensor(task_id="s", backend="local", job_id="gp-x-t1-a1", timeout=5)
    handle = JobHandle("local", "gp-x-t1-a1", "gp-x-t1-a1", 1, names.ON_DEMAND, time.time())
    event = {"status": "deadline", "handle": handle.to_dict(), "job_status": {"state": "RUNNING"}, "message": "-"}
    with pytest.raises(AirflowSensorTimeout, match=r"timed out after 5s \(timeout=\) waiting for local job gp-x-t1-a1"):
        sensor.execute_complete({"ti": _TaskInstance()}, event=event)  # type: ignore[arg-type]


@pytest.mark.usefixtures("scripted")
def test_100_deferred_sensors_cost_one_batched_poll_per_tick() -> None:
    """100 sensors and one operator's trigger on one backend: every tick is one poll carrying all 101 jobs."""
    ids = [f"job-{i}" for i in range(101)]
    for job_id in ids:
        ScriptedBackend.handles[job_id] = JobHandle("scripted", job_id, f"gp-{job_id}", 1, names.ON_DEMAND, time.time())
        ScriptedBackend.table[job_id] = JobStatus(state=JobState.RUNNING)
    triggers: list[GpuJobTrigger] = [
        _deferred(
            GpuJobSensor(task_id=f"s{i}", backend="scripted", job_id=job_id, poll_interval=0.05), _TaskInstance()
        ).trigger
        for i, job_id in enumerate(ids[:100])
    ]
    operator_job = ScriptedBackend.handles[ids[100]]
    triggers.append(GpuJobTrigger(backend={"name": "scripted"}, handle=operator_job.to_dict(), poll_interval=0.05))
    ScriptedBackend.polls.clear()
    # pollers an earlier test left behind on its own (closed) event loop are not this test's
    before = set(SharedPoller._pollers)

    async def all_of_them() -> list[dict[str, Any]]:
        waiting = asyncio.gather(*(_first_event(t) for t in triggers))
        while len(ScriptedBackend.polls) < 5:  # five ticks with every job still running
            await asyncio.sleep(0.01)
        loop = id(asyncio.get_running_loop())
        pollers = [p for key, p in SharedPoller._pollers.items() if key[0] == loop and key not in before]
        for job_id in ids:
            ScriptedBackend.table[job_id] = JobStatus(state=JobState.SUCCEEDED)
        events = list(await waiting)
        assert len(pollers) == 1 and pollers[0].calls == pollers[0].ticks == len(ScriptedBackend.polls)
        return events

    events = asyncio.run(asyncio.wait_for(all_of_them(), 30))
    assert [e["status"] for e in events] == ["succeeded"] * 101
    assert ScriptedBackend.polls == [101] * len(ScriptedBackend.polls), ScriptedBackend.polls
    assert set(SharedPoller._pollers) <= before, "the poller outlived its last subscriber"
