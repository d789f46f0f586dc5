"""The Batch backend against the Batch emulator: the requests it sends and what it makes of the answers."""

from __future__ import annotations

import dataclasses
import json
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
from gpu_provider.backends.aws import calls as batch_calls
from gpu_provider.backends.base import (
    MAX_LOG_LINE_CHARS,
    JobHandle,
    JobIdentity,
    JobRequest,
    JobState,
    JobStatus,
    LogChunk,
    TaskKey,
)
from gpu_provider.backends.batch import CANCEL_PREFIX, BatchBackend
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobStatusError
from gpu_provider.job import GpuResources
from tests.batch_world import BatchWorld
from tests.harness import REPO, pid_alive, wait_for


def _request(
    command: list[str],
    *,
    task: str = "job",
    map_index: int = -1,
    capacity: str = "on-demand",
    nodes: int = 1,
    attempt: int = 1,
    team: str | None = None,
    priority: int | None = None,
    env: dict[str, str] | None = None,
    max_runtime_s: float | None = None,
) -> JobRequest:
    identity = JobIdentity(
        TaskKey("batch_tests", task, "manual__run", map_index),
        try_number=1,
        attempt=attempt,
        capacity=capacity,
        team=team,
    )
    return JobRequest(
        identity=identity,
        command=tuple(command),
        env=env or {"GPU_PROVIDER_ATTEMPT": str(attempt)},
        resources=GpuResources(gpus=1, nodes=nodes),
        capacity=capacity,
        image="gpu-test:1",
        priority=priority,
        max_runtime_s=max_runtime_s,
    )


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _status(backend: BatchBackend, handle: JobHandle) -> JobStatus:
    status = backend.poll([handle])[handle.job_id]
    assert isinstance(status, JobStatus), status
    return status


def _wait_state(backend: BatchBackend, handle: JobHandle, *states: JobState, timeout: float = 30) -> JobStatus:
    def reached() -> JobStatus | None:
        status = _status(backend, handle)
        return status if status.state in states else None

    return wait_for(reached, timeout, f"job {handle.job_id} to reach {states}")  # type: ignore[no-any-return]


def test_single_node_job_runs_and_its_request_carries_the_contract(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(
        _request(_py("print('hello from batch')"), env={"GPU_PROVIDER_ATTEMPT": "1", "MY_VAR": "x"}, max_runtime_s=90)
    )
    status = _wait_state(backend, handle, JobState.SUCCEEDED, JobState.FAILED)
    assert status.state is JobState.SUCCEEDED, status
    assert status.started_at and status.ended_at and status.ended_at >= status.started_at
    assert status.gpu_seconds > 0 and status.capacity == "on-demand"
    (body,) = batch.bodies("SubmitJob")
    assert body["jobName"] == handle.name
    assert body["jobQueue"] == batch.setup.on_demand_queue
    env = {e["name"]: e["value"] for e in body["containerOverrides"]["environment"]}
    assert env == {
        "GPU_PROVIDER_ATTEMPT": "1",
        "MY_VAR": "x",
        "NNODES": "1",
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert body["timeout"] == {"attemptDurationSeconds": 90}
    assert body["tags"]["gpu-provider/task-id"] == "job"
    assert body["tags"]["gpu-provider/capacity"] == "on-demand"
    assert body["propagateTags"] is True
    # not a fair-share queue: real Batch rejects these fields there
    assert "shareIdentifier" not in body and "schedulingPriorityOverride" not in body
    (definition,) = batch.bodies("RegisterJobDefinition")
    assert body["jobDefinition"].split("/")[-1].startswith(definition["jobDefinitionName"] + ":")
    assert {"type": "GPU", "value": "1"} in definition["containerProperties"]["resourceRequirements"]
    chunk = backend.logs(handle)
    assert "hello from batch" in chunk.lines and not chunk.more
    again = backend.logs(handle, chunk.cursor)
    assert (again.lines, again.more, again.cursor) == ([], False, chunk.cursor)
    assert status.log_url and "log-events" in status.log_url


def test_job_definition_is_registered_once_and_reused(batch: BatchWorld) -> None:
    first = BatchBackend(**batch.queues)
    first.submit(_request(_py("pass"), task="reuse"))
    first.submit(_request(_py("pass"), task="reuse", attempt=2))
    # a fresh backend (another worker) finds the definition instead of registering a new revision
    BatchBackend(**batch.queues).submit(_request(_py("pass"), task="reuse", attempt=3))
    assert len(batch.bodies("RegisterJobDefinition")) == 1
    assert len({b["jobDefinition"] for b in batch.bodies("SubmitJob")}) == 1
    # a changed command is a new definition
    first.submit(_request(_py("print(1)"), task="reuse", attempt=4))
    assert len(batch.bodies("RegisterJobDefinition")) == 2


def test_fair_share_fields_only_on_a_fair_share_queue(batch: BatchWorld) -> None:
    assert batch.setup.fair_share_queue
    fair = BatchBackend(spot_queue=batch.setup.spot_queue, on_demand_queue=batch.setup.fair_share_queue)
    fair.submit(_request(_py("pass"), task="fair", team="ml-infra", priority=70))
    fair.submit(_request(_py("pass"), task="fair2"))
    plain = BatchBackend(**batch.queues)
    plain.submit(_request(_py("pass"), task="plain", team="ml-infra", priority=70))
    with_team, without_team, on_plain = batch.bodies("SubmitJob")
    assert (with_team["shareIdentifier"], with_team["schedulingPriorityOverride"]) == ("ml_infra", 70)
    assert (without_team["shareIdentifier"], without_team["schedulingPriorityOverride"]) == ("default", 0)
    assert "shareIdentifier" not in on_plain and "schedulingPriorityOverride" not in on_plain
    assert on_plain["tags"]["gpu-provider/team"] == "ml-infra"


def test_a_team_can_map_to_any_share_identifier(batch: BatchWorld) -> None:
    assert batch.setup.fair_share_queue
    fair = BatchBackend(
        spot_queue=batch.setup.spot_queue,
        on_demand_queue=batch.setup.fair_share_queue,
        share_identifiers={"team-a": "teamA"},
    )
    fair.submit(_request(_py("pass"), task="share-a", team="team-a"))
    fair.submit(_request(_py("pass"), task="share-b", team="ml-infra"))  # not mapped: '-' written as '_'
    mapped, rewritten = batch.bodies("SubmitJob")
    assert (mapped["shareIdentifier"], rewritten["shareIdentifier"]) == ("teamA", "ml_infra")
    assert mapped["tags"]["gpu-provider/team"] == "team-a"


def test_multi_node_request_and_the_normalised_environment_on_each_node(batch: BatchWorld, tmp_path: Path) -> None:
    backend = BatchBackend(**batch.queues, master_port=29611)
    code = (
        "import os, pathlib, time\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        "here.joinpath(os.environ['NODE_RANK']).write_text("
        "' '.join(os.environ[k] for k in ('NNODES', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT')))\n"
        # the main node's exit ends the job and stops the other node (as on Batch): on a loaded
        # machine node 1 may start late, so the main node waits until it has written
        "deadline = time.monotonic() + 60\n"
        "while os.environ['NODE_RANK'] == '0' and not here.joinpath('1').exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    handle = backend.submit(_request(_py(code), task="mnp", nodes=2))
    status = _wait_state(backend, handle, JobState.SUCCEEDED, JobState.FAILED)
    assert status.state is JobState.SUCCEEDED, status
    (definition,) = batch.bodies("RegisterJobDefinition")
    assert definition["type"] == "multinode"
    props = definition["nodeProperties"]
    assert (props["numNodes"], props["mainNode"]) == (2, 0)
    assert props["nodeRangeProperties"][0]["targetNodes"] == "0:"
    assert props["nodeRangeProperties"][0]["container"]["command"][:2] == ["/bin/sh", "-c"]
    (body,) = batch.bodies("SubmitJob")
    assert "containerOverrides" not in body
    (override,) = body["nodeOverrides"]["nodePropertyOverrides"]
    assert override["targetNodes"] == "0:"
    env = {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}
    # rank and master address differ per node: the entry derives them from Batch's variables
    assert (env["NNODES"], env["MASTER_PORT"]) == ("2", "29611")
    assert "NODE_RANK" not in env and "MASTER_ADDR" not in env
    # the request asks for 29611 (above); the emulator runs both nodes on this machine and gives each job a port of
    # its own there (two jobs at once must not meet), the same on both nodes
    node0, node1 = (tmp_path / "0").read_text().split(), (tmp_path / "1").read_text().split()
    assert node0[:3] == ["2", "0", "127.0.0.1"] and node1[:3] == ["2", "1", "127.0.0.1"]
    assert node0[3] == node1[3] and int(node0[3]) > 0
    assert status.gpu_seconds > 0


def test_poll_describes_up_to_100_jobs_per_call(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    handles = [backend.submit(_request(_py("pass"), task=f"many{i}", capacity="spot")) for i in range(250)]
    batch.emulator.reset_requests()
    statuses = backend.poll(handles)
    assert set(statuses) == {h.job_id for h in handles}
    assert {s.state for s in statuses.values() if isinstance(s, JobStatus)} == {JobState.QUEUED}
    calls = batch.bodies("DescribeJobs")
    assert [len(c["jobs"]) for c in calls] == [100, 100, 50]


def test_throttled_status_reads_back_off_and_persistent_throttling_is_not_a_failure(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_botocore_retries(batch, monkeypatch)  # the backend's own backoff alone, shortened
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(_request(_py("pass"), task="throttled"))
    batch.emulator.throttle("DescribeJobs", 2)
    for _ in range(5):
        assert _status(backend, handle).state in set(JobState)
    throttled = [r for r in batch.emulator.requests("DescribeJobs") if r["throttled"]]
    assert throttled, "the emulator must have throttled some calls"
    batch.emulator.throttle("DescribeJobs", 1)  # every call
    with pytest.raises(GpuBackendThrottledError, match="throttled DescribeJobs"):
        backend.poll([handle])


def test_cancel_terminates_with_the_reason_and_stops_the_process(batch: BatchWorld, tmp_path: Path) -> None:
    backend = BatchBackend(**batch.queues)
    pid_file = tmp_path / "pid"
    code = f"import os, time, pathlib; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(60)"
    handle = backend.submit(_request(_py(code), task="cancel"))
    _wait_state(backend, handle, JobState.RUNNING)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 15, "the job's pid"))
    backend.cancel(handle, "Airflow task batch_tests.cancel of run manual__run was killed")
    status = _wait_state(backend, handle, JobState.CANCELLED, JobState.FAILED)
    assert status.state is JobState.CANCELLED
    assert status.reason == "Airflow task batch_tests.cancel of run manual__run was killed"
    (body,) = batch.bodies("TerminateJob")
    assert body == {"jobId": handle.job_id, "reason": CANCEL_PREFIX + status.reason}
    wait_for(lambda: not pid_alive(pid), 10, "the job process to stop")


def test_reclaimed_spot_host_reads_as_preempted(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(_request(_py("import time; time.sleep(60)"), task="reclaim", capacity="spot"))
    _wait_state(backend, handle, JobState.RUNNING)
    batch.emulator.preempt(handle.job_id)
    status = _wait_state(backend, handle, JobState.PREEMPTED, JobState.FAILED, JobState.CANCELLED)
    assert status.state is JobState.PREEMPTED
    assert status.reason.startswith("Host EC2 (instance i-") and status.reason.endswith("terminated.")


def test_failed_job_keeps_its_exit_code(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(_request(_py("import sys; print('boom'); sys.exit(3)"), task="fails"))
    status = _wait_state(backend, handle, JobState.SUCCEEDED, JobState.FAILED)
    assert status.state is JobState.FAILED
    assert "boom" in backend.logs(handle).lines


def test_find_existing_finds_attempts_by_name_in_both_queues(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    first = backend.submit(_request(_py("pass"), task="lookup", capacity="spot"))
    second = backend.submit(_request(_py("pass"), task="lookup", attempt=2))
    backend.submit(_request(_py("pass"), task="lookup", map_index=3))  # another task instance
    backend.submit(_request(_py("pass"), task="lookup-other"))
    found = BatchBackend(**batch.queues).find_existing(TaskKey("batch_tests", "lookup", "manual__run", -1))
    assert [(h.job_id, h.attempt, h.capacity) for h in found] == [
        (first.job_id, 1, "spot"),
        (second.job_id, 2, "on-demand"),
    ]
    assert found[0].extra["queue"] == batch.setup.spot_queue
    assert found[0].extra["gpus"] == 1
    mapped = backend.find_existing(TaskKey("batch_tests", "lookup", "manual__run", 3))
    assert len(mapped) == 1


def test_unknown_queue_is_a_clear_error(batch: BatchWorld) -> None:
    backend = BatchBackend(spot_queue="nope", on_demand_queue="nope-either")
    with pytest.raises(Exception, match="job queue 'nope-either' does not exist"):
        backend.submit(_request(_py("pass"), task="noqueue"))


def test_a_job_batch_no_longer_returns_is_reported_lost_not_dropped(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    kept = backend.submit(_request(_py("pass"), task="kept", capacity="spot"))
    gone = backend.submit(_request(_py("pass"), task="gone", capacity="spot"))
    batch.emulator.forget(gone.job_id)
    # just submitted: DescribeJobs may not show a new job yet, so that is one failed read, not the end
    fresh = backend.poll([kept, gone])
    assert isinstance(fresh[gone.job_id], GpuJobStatusError)
    assert "does not list" in str(fresh[gone.job_id])
    assert isinstance(fresh[kept.job_id], JobStatus) and fresh[kept.job_id].state is JobState.QUEUED
    # submitted long ago (expired after Batch's retention, or deleted): a terminal status, never a missing entry
    old = dataclasses.replace(gone, submitted_at=time.time() - 3600)
    statuses = backend.poll([kept, old])
    assert set(statuses) == {kept.job_id, gone.job_id}
    lost = statuses[gone.job_id]
    assert isinstance(lost, JobStatus), lost
    assert lost.state.terminal and lost.interruption == names.LOST
    assert lost.reason.startswith(f"AWS Batch no longer knows job {gone.job_id} (expired or deleted)")
    assert statuses[kept.job_id] == fresh[kept.job_id] or statuses[kept.job_id].state is JobState.QUEUED


def test_a_job_in_a_state_this_version_does_not_know_fails_alone(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    good = backend.submit(_request(_py("pass"), task="good", capacity="spot"))
    odd = backend.submit(_request(_py("pass"), task="odd", capacity="spot"))
    batch.emulator.report_status(odd.job_id, "SCHEDULED")
    statuses = backend.poll([good, odd])
    assert isinstance(statuses[good.job_id], JobStatus)
    error = statuses[odd.job_id]
    assert isinstance(error, GpuJobStatusError)
    assert odd.job_id in str(error) and "'SCHEDULED'" in str(error) and "RUNNABLE" in str(error)


def test_a_capacity_timeout_cancel_found_by_a_later_lookup_is_an_interruption(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    timed_out = backend.submit(_request(_py("pass"), task="cap", capacity="spot"))
    killed = backend.submit(_request(_py("pass"), task="cap", capacity="spot", attempt=2))
    backend.cancel(timed_out, names.CAPACITY_TIMEOUT_MARK + "no spot capacity after 600s waiting")
    backend.cancel(killed, "Airflow task batch_tests.cap of run manual__run was killed")
    # the worker crashed before it saved either outcome: a new try finds them by name and polls them
    later = BatchBackend(**batch.queues)
    found = later.find_existing(TaskKey("batch_tests", "cap", "manual__run", -1))
    assert [h.job_id for h in found] == [timed_out.job_id, killed.job_id]

    def both_ended() -> dict[str, JobStatus] | None:
        statuses = later.poll(found)
        done = {k: v for k, v in statuses.items() if isinstance(v, JobStatus) and v.state.terminal}
        return done if len(done) == 2 else None

    statuses = wait_for(both_ended, 15, "both jobs to end")
    assert statuses[timed_out.job_id].state is JobState.CANCELLED
    assert statuses[timed_out.job_id].interruption == names.CAPACITY_TIMEOUT
    assert statuses[timed_out.job_id].reason == names.CAPACITY_TIMEOUT_MARK + "no spot capacity after 600s waiting"
    assert statuses[killed.job_id].state is JobState.CANCELLED
    assert statuses[killed.job_id].interruption is None


NO_SPOT = (
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - There is no Spot capacity available that meets the job requirements."
)
TOO_BIG = (
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement (vCPU/memory/GPU) is higher than that "
    "can be met by the CE(s) attached to the job queue."
)


def test_a_runnable_job_shows_why_it_waits_and_one_that_can_never_run_is_reported_not_stopped(
    batch: BatchWorld,
) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue, reason=NO_SPOT)
    waiting = backend.submit(_request(_py("pass"), task="waits", capacity="spot"))
    status = wait_for(lambda: (s := _status(backend, waiting)).reason and s, 10, "a status reason")
    assert (status.state, status.reason, status.never_starts) == (JobState.QUEUED, NO_SPOT, None)

    batch.emulator.hold(batch.setup.on_demand_queue)
    stuck = backend.submit(_request(_py("pass"), task="too-big"))
    wait_for(lambda: batch.describe(stuck.job_id)["status"] == "RUNNABLE", 10, "the job to be RUNNABLE")
    batch.emulator.set_status_reason(stuck.job_id, TOO_BIG)
    status = _status(backend, stuck)
    # the read reports it; only the task that owns the job stops it (a read never changes anything)
    assert (status.state, status.reason, status.never_starts) == (JobState.QUEUED, TOO_BIG, TOO_BIG)
    assert batch.bodies("TerminateJob") == []
    assert batch.describe(stuck.job_id)["status"] == "RUNNABLE"

    # the owner's stop: Batch then reports the job FAILED, with the reason, from any reader
    backend.cancel(stuck, names.UNRUNNABLE_MARK + TOO_BIG)
    wait_for(lambda: batch.describe(stuck.job_id)["status"] == "FAILED", 10, "the job to end")
    after = _status(backend, stuck)
    assert (after.state, after.interruption) == (JobState.FAILED, None)
    assert after.reason.startswith("AWS Batch cannot run this job: " + TOO_BIG), after
    assert _status(backend, waiting).state is JobState.QUEUED


# A task process whose SIGTERM handler (Airflow's on_kill) cancels the job. The main thread is building
# the backend's first client (as after resuming from a deferral) when the signal arrives: it holds
# whatever the build holds, and the handler runs on that same thread.
SIGTERM_DURING_BUILD = """
import json, signal, sys, time
from gpu_provider.backends.base import JobHandle
from gpu_provider.backends.batch import BatchBackend

handle = JobHandle.from_dict(json.loads(sys.argv[1]))
backend = BatchBackend(**json.loads(sys.argv[2]))
real_build, slow = backend._clients.build, [True]

def build(service, **options):  # the first build is slow, as a connection lookup or a credential fetch can be
    if slow.pop() if slow else False:
        print("building", flush=True)
        time.sleep(60)
    return real_build(service, **options)

backend._clients.build = build

def on_kill(signum, frame):
    backend.cancel(handle, "Airflow task was killed")
    print("cancelled", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_kill)
backend.poll([handle])
print("the poll finished: the signal was not delivered during the build", flush=True)
"""


def test_sigterm_while_the_main_thread_builds_a_client_still_cancels_and_exits(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    handle = backend.submit(_request(_py("pass"), task="kill-build", capacity="spot"))
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_DURING_BUILD, json.dumps(handle.to_dict()), json.dumps(batch.queues)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        output = []
        for line in proc.stdout:  # until the child is inside the slow build (it then prints nothing for 60 s)
            output.append(line)
            if line.strip() == "building":
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "".join(output) + rest
    assert proc.returncode == 0 and "cancelled" in text, text
    (terminate,) = batch.bodies("TerminateJob")
    assert terminate == {"jobId": handle.job_id, "reason": CANCEL_PREFIX + "Airflow task was killed"}


def test_cancel_does_not_wait_for_a_client_another_thread_is_building(batch: BatchWorld) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    handle = BatchBackend(**batch.queues).submit(_request(_py("pass"), task="kill-thread", capacity="spot"))
    real_build, inside, release = backend._clients.build, threading.Event(), threading.Event()

    def build(service: str, **options: Any) -> Any:
        if not inside.is_set():
            inside.set()
            release.wait(30)  # a build that hangs (slow credentials, an unreachable endpoint)
        return real_build(service, **options)

    backend._clients.build = build  # type: ignore[method-assign]
    builder = threading.Thread(target=backend.poll, args=([handle],))
    builder.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        backend.cancel(handle, "Airflow task was killed")
        assert time.monotonic() - started < 10
        # the cancel goes on in its own thread past CANCEL_WAIT_S (common.py): on a loaded machine it lands later
        sent = wait_for(lambda: batch.bodies("TerminateJob"), 30, "TerminateJob")
        assert [b["jobId"] for b in sent] == [handle.job_id]
    finally:
        release.set()
        builder.join(30)


def _without_botocore_retries(batch: BatchWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection turns botocore's own retries off (its config_kwargs win), and the backend's backoff
    is shortened: every throttled call then reaches the backend's backoff at once, and quickly."""
    extra = {
        "endpoint_url": batch.emulator.endpoint_url,
        "region_name": batch.emulator.region,
        "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 1}},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": extra}))
    monkeypatch.setattr(batch_calls, "BASE_DELAY_S", 0.01, raising=False)


def test_throttling_outside_the_wait_loop_is_retried_with_backoff(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_botocore_retries(batch, monkeypatch)
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    batch.emulator.throttle_bursts("*", 4)  # 4 throttled in a row, more than botocore's retries would absorb
    try:
        handle = backend.submit(_request(_py("pass"), task="throttled-all", capacity="spot"))
        found = BatchBackend(**batch.queues).find_existing(TaskKey("batch_tests", "throttled-all", "manual__run", -1))
        status = backend.poll([handle])[handle.job_id]
        backend.mark(handle, owner_try=2)
        backend.cancel(handle, "Airflow task was killed")
    finally:
        batch.emulator.throttle_bursts("*", 0)
    assert [h.job_id for h in found] == [handle.job_id]
    assert isinstance(status, JobStatus) and status.state is JobState.QUEUED
    throttled = {r["action"] for r in batch.emulator.requests() if r["throttled"]}
    expected = {"ListJobs", "DescribeJobQueues", "DescribeJobDefinitions", "RegisterJobDefinition", "SubmitJob"}
    assert expected | {"DescribeJobs", "TagResource", "TerminateJob"} <= throttled
    assert len(batch.bodies("SubmitJob")) == 1  # one job: every throttled submit was looked up before it was re-sent
    assert [b["jobId"] for b in batch.bodies("TerminateJob")] == [handle.job_id]
    # throttling that does not stop is reported as such, within a bound
    batch.emulator.throttle("DescribeJobs", 1)
    with pytest.raises(GpuBackendThrottledError, match="throttled DescribeJobs"):
        backend.poll([handle])


@pytest.mark.parametrize("how", ["error", "disconnect"])
def test_a_lost_submit_answer_makes_exactly_one_job(batch: BatchWorld, how: str) -> None:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.spot_queue)
    batch.emulator.lose_response("SubmitJob", how=how)  # the job is created, its answer lost (HTTP 500 / no answer)
    handle = backend.submit(_request(_py("pass"), task=f"lost-{how}", capacity="spot"))
    client = batch.emulator.client("batch")
    listed = client.list_jobs(jobQueue=batch.setup.spot_queue, filters=[{"name": "JOB_NAME", "values": [handle.name]}])
    assert [s["jobId"] for s in listed["jobSummaryList"]] == [handle.job_id]
    assert [r["lost"] for r in batch.emulator.requests("SubmitJob")] == [how]  # looked up, not sent again
    assert handle.extra["queue"] == batch.setup.spot_queue and handle.attempt == 1


def test_submit_adopts_the_job_of_its_attempt_instead_of_creating_another(batch: BatchWorld) -> None:
    batch.emulator.hold(batch.setup.spot_queue)
    request = _request(_py("pass"), task="adopt", capacity="spot")
    first = BatchBackend(**batch.queues).submit(request)
    again = BatchBackend(**batch.queues).submit(request)  # e.g. a worker that crashed before saving the handle
    assert (again.job_id, again.name, again.attempt, again.capacity) == (
        first.job_id,
        first.name,
        first.attempt,
        first.capacity,
    )
    assert again.extra["job_arn"] == first.extra["job_arn"] and first.extra["job_arn"].endswith(first.job_id)
    assert len(batch.bodies("SubmitJob")) == 1
    # the next attempt has another name: a new job
    assert BatchBackend(**batch.queues).submit(_request(_py("pass"), task="adopt", attempt=2)).job_id != first.job_id


def test_marks_are_recorded_on_the_job_and_read_back_by_any_worker(batch: BatchWorld) -> None:
    batch.emulator.hold(batch.setup.spot_queue)
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(_request(_py("pass"), task="marks", capacity="spot"))
    status = _status(backend, handle)
    assert (status.owner_try, status.collected) == (1, False)  # the submitting try owns it
    backend.mark(handle, owner_try=3)  # a later try took it over
    other = BatchBackend(**batch.queues)  # another worker, which knows the job only by lookup
    (found,) = other.find_existing(TaskKey("batch_tests", "marks", "manual__run", -1))
    status = _status(other, found)
    assert (status.owner_try, status.collected) == (3, False)
    other.mark(dataclasses.replace(found, extra={}), collected=True)  # an old handle without the ARN
    status = _status(backend, handle)
    assert (status.owner_try, status.collected) == (3, True)
    tags_sent = [b["tags"] for b in batch.bodies("TagResource")]
    assert tags_sent == [{names.TAG_OWNER_TRY: "3"}, {names.TAG_COLLECTED: "true"}]
    assert batch.describe(handle.job_id)["tags"][names.TAG_RUN_ID] == "manual__run"
    with pytest.raises(ValueError, match="owner_try=0"):
        backend.mark(handle, owner_try=0)


CHATTY = """
import os, pathlib, sys, time
node, done = os.environ["NODE_RANK"], pathlib.Path(sys.argv[1], "node-1-done")
out = sys.stdout
for i in range(50_000):
    out.write(f"{node} {i:06d} " + "x" * 40 + "\\n")
    if i == 123:
        out.write("long " + "y" * 40_000 + "\\n")
out.flush()
if node == "1":  # its pid, written whole: the main node waits for this process to be gone
    done.with_suffix(".tmp").write_text(str(os.getpid()))
    done.with_suffix(".tmp").rename(done)
    sys.exit(0)
def gone(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
# the main node's end stops the others: it ends once node 1 has exited, not just printed (on a loaded machine
# node 1 was still shutting down when the main node ended, and its SIGTERM added 'Terminated' to its log)
deadline = time.monotonic() + 60
while node == "0" and time.monotonic() < deadline:
    if done.exists() and gone(int(done.read_text())):
        break
    time.sleep(0.05)
"""


def test_a_chatty_multi_node_log_is_read_in_bounded_chunks_every_line_exactly_once(
    batch: BatchWorld, tmp_path: Path
) -> None:
    backend = BatchBackend(**batch.queues)
    handle = backend.submit(_request([*_py(CHATTY), str(tmp_path)], task="chatty", nodes=2))
    assert backend.logs(handle) == LogChunk(lines=[], cursor=None, more=False)  # not started: nothing yet
    status = _wait_state(backend, handle, JobState.SUCCEEDED, JobState.FAILED, timeout=60)
    assert status.state is JobState.SUCCEEDED, status
    limit = 256 * 1024
    lines: list[str] = []
    cursor: str | None = None
    readers = [backend, BatchBackend(**batch.queues)]  # no reading state in a backend: any one goes on
    sizes = []
    for calls in range(1, 200):
        chunk = readers[calls % 2].logs(handle, cursor, max_bytes=limit)
        sizes.append(sum(len(line.encode()) + 1 for line in chunk.lines))
        lines.extend(chunk.lines)
        cursor = chunk.cursor
        if not chunk.more:
            break
    assert calls > 10, calls  # about 5.2 MB in 256 KiB chunks
    assert max(sizes) <= limit + 64 * 1024, max(sizes)  # about the limit: the last page read may pass it a little
    long_lines = [line for line in lines if line[len("node 0: ") :].startswith("long yyy")]
    assert len(long_lines) == 2
    for line in long_lines:
        assert len(line) < MAX_LOG_LINE_CHARS + 100
        assert line.endswith(f"[line cut: {5 + 40_000 - MAX_LOG_LINE_CHARS} more characters]")
    for node in ("0", "1"):
        mine = [
            line
            for line in lines
            if line.startswith(f"node {node}: ") and line not in long_lines and names.END_OF_LOG not in line
        ]
        assert mine == [f"node {node}: {node} {i:06d} " + "x" * 40 for i in range(50_000)]
    ends = [line for line in lines if names.END_OF_LOG in line]  # each node's end-of-log marker, once
    assert sorted(ends) == [f"node {n}: {names.END_OF_LOG} node={n} nnodes=2 exit=0" for n in ("0", "1")]
    assert len(lines) == 100_002 + 2
    assert backend.logs(handle, cursor).lines == []  # drained: nothing twice
