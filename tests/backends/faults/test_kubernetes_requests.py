"""Kubernetes asks only for what it needs: requests, objects and bytes per tick, read from the fake
API server's request log.

A namespace where pod garbage collection has not yet removed 200 ended pods of this provider, and 20
sync tasks each waiting on its own attempt: a tick of those waits (a poll and a log read each) costs
one LIST of the attempt's own pods per read, never the namespace's ended pods. ``on_kill`` and a
recovery read the same way. The triggerer's shared poller, polling many attempts at once, costs one
LIST per namespace per tick. Following a job's log costs about the log's size, however many reads.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpu_provider.backends.base import JobIdentity, JobRequest, JobState, TaskKey
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.kubernetes.logs import SETTLED_S
from gpu_provider.engine.logs import LogForwarder
from gpu_provider.engine.runner import poll_one, recover
from gpu_provider.job import GpuResources
from tests.backends.contract.worlds import py, wait_ended
from tests.harness import wait_for
from tests.kubernetes_world import KubernetesWorld

ENDED_PODS = 200
SYNC_WAITS = 20
log = logging.getLogger(__name__)


def _request(dag: str, task: str, command: tuple[str, ...] = ("true",), capacity: str = "spot") -> JobRequest:
    identity = JobIdentity(TaskKey(dag, task, "manual__1"), try_number=1, attempt=1, capacity=capacity)
    return JobRequest(identity, command, {}, GpuResources(), capacity, image="x")


def _leave_ended_pods(kubernetes: KubernetesWorld, backend: KubernetesBackend, count: int) -> None:
    """``count`` pods of this provider that ended (half succeeded, half failed), as pod GC leaves them."""
    for i in range(count):
        (manifest,) = backend.manifests(_request("k8s_gc_left", f"done{i}"))
        name = manifest["metadata"]["name"]
        kubernetes.emulator.create("pods", "default", manifest)
        phase = "Succeeded" if i % 2 else "Failed"
        kubernetes.emulator.patch("pods", "default", name, {"status": {"phase": phase}})


def _cost(requests: list[dict[str, Any]]) -> tuple[int, int]:
    answered = [r for r in requests if not r["throttled"]]
    return len(answered), sum(int(r.get("objects") or 0) for r in answered)


def _log_requests(kubernetes: KubernetesWorld, since: int) -> list[dict[str, Any]]:
    return kubernetes.emulator.requests(since=since)


def test_twenty_sync_waits_beside_200_ended_pods_fetch_only_their_own_pods(kubernetes: KubernetesWorld) -> None:
    submitter = KubernetesBackend()
    _leave_ended_pods(kubernetes, submitter, ENDED_PODS)
    kubernetes.emulator.set_shortage("spot")  # the waits stay queued: a tick is the same every time
    handles = [submitter.submit(_request("k8s_sync", f"t{i}")) for i in range(SYNC_WAITS)]
    # each sync task runs in its own worker, with its own backend and log reader
    waits = [(KubernetesBackend(), h) for h in handles]
    readers = [LogForwarder(b, h, log) for b, h in waits]

    for _tick in range(3):
        before = len(kubernetes.emulator.requests())
        for (backend, handle), reader in zip(waits, readers, strict=True):
            status = poll_one(backend, handle)
            assert status is not None and status.state is JobState.QUEUED, status
            reader.pump()
        requests = _log_requests(kubernetes, before)
        count, objects = _cost(requests)
        # a poll and a log read per wait, each one LIST by the attempt's label answering its one pod
        assert {r["action"] for r in requests} == {"list pods"}, {r["action"] for r in requests}
        assert count == 2 * SYNC_WAITS, [r["body"]["query"] for r in requests]
        assert objects == 2 * SYNC_WAITS, f"{objects} objects for {SYNC_WAITS} waits (before: 20 x 220 per poll)"
        for r in requests:
            assert "gpu-provider/job" in str(r["body"]["query"].get("labelSelector")), r["body"]["query"]


def test_on_kill_and_recovery_read_only_the_task_s_own_attempts(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    _leave_ended_pods(kubernetes, backend, ENDED_PODS)
    kubernetes.emulator.set_shortage("spot")
    request = _request("k8s_kill", "train")
    handle = backend.submit(request)
    backend.submit(_request("k8s_kill", "other"))  # another task of the same run: not this task's

    before = len(kubernetes.emulator.requests())
    records = recover(backend, request.identity.task, [], log)
    assert [r.job_id for r in records] == [handle.job_id]
    count, objects = _cost(_log_requests(kubernetes, before))
    assert objects <= 2, f"recovery fetched {objects} objects in {count} requests for one attempt"

    before = len(kubernetes.emulator.requests())
    assert poll_one(backend, handle, timeout=10) is not None  # what on_kill reads before it cancels
    backend.cancel(handle, "the task was killed")
    requests = _log_requests(kubernetes, before)
    # the status read, then the pod by name, its mark, the Event and the delete: one object each
    assert len(requests) <= 6, [r["action"] for r in requests]
    assert all(int(r.get("objects") or 0) <= 1 for r in requests), [(r["action"], r.get("objects")) for r in requests]


def test_a_batched_poll_of_many_attempts_is_one_list_per_tick_without_ended_pods(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    _leave_ended_pods(kubernetes, backend, ENDED_PODS)
    kubernetes.emulator.set_shortage("spot")
    handles = [backend.submit(_request("k8s_batched", f"t{i}")) for i in range(200)]

    for _tick in range(3):
        before = len(kubernetes.emulator.requests())
        result = backend.poll(handles)
        assert {s.state for s in result.values()} == {JobState.QUEUED}  # type: ignore[union-attr]
        requests = _log_requests(kubernetes, before)
        count, objects = _cost(requests)
        assert count == 1, [(r["action"], r["body"]["query"]) for r in requests]
        assert objects == 200, f"{objects} objects: the 200 ended pods nobody asked about were fetched"

    # an attempt that ended since the last tick is read once more, by its label, with nothing else ended
    quick = backend.submit(_request("k8s_batched", "quick", capacity="on-demand"))  # spot stays short
    wait_ended(backend, quick)
    before = len(kubernetes.emulator.requests())
    result = backend.poll([*handles, quick])
    assert result[quick.job_id].state is JobState.SUCCEEDED  # type: ignore[union-attr]
    requests = _log_requests(kubernetes, before)
    assert [r["action"] for r in requests] == ["list pods", "list pods"], requests
    assert int(requests[1].get("objects") or 0) == 1, requests[1]


def test_following_a_log_reads_about_its_size_however_many_reads(kubernetes: KubernetesWorld) -> None:
    """The job writes its log in a burst, then runs on quietly: once the burst's second has settled,
    a read brings nothing again (before: every read brought the whole log, 2,699 bytes in 11 reads of
    a 279-byte log)."""
    backend = KubernetesBackend()
    lines, quiet_s, every_s = 30, SETTLED_S + 4.0, 0.2
    command = py(
        f"""
        import time
        for i in range({lines}):
            print(f'burst line {{i:03d}} ' + 'x' * 40, flush=True)
        time.sleep({quiet_s})
        print('last line', flush=True)
        """
    )
    request = _request("k8s_logs", "follow")
    handle = backend.submit(JobRequest(request.identity, command, {}, GpuResources(), "spot", image="x"))
    reader = LogForwarder(backend, handle, log)
    wait_for(lambda: reader.pump() >= 0 and reader.lines_read >= lines, 30, "the burst in the log")
    settled_at = time.monotonic() + SETTLED_S + 1.5
    late_from: int | None = None
    deadline = time.monotonic() + quiet_s + 20
    while reader.lines_read <= lines:  # the quiet part: read as a sync wait does, many times
        assert time.monotonic() < deadline, f"the last line never came ({reader.lines_read} lines)"
        if late_from is None and time.monotonic() > settled_at:
            late_from = len(kubernetes.emulator.requests())
        reader.pump()
        time.sleep(every_s)
    wait_ended(backend, handle)
    reader.settle(1.0)
    assert reader.lines_read == lines + 1, reader.lines_read

    container = kubernetes.emulator._containers[("default", handle.name)]
    size = len(container.read({"timestamps": "true"}))  # the log's size as read, its timestamps included
    reads = kubernetes.emulator.requests("get pods/log")
    total = sum(int(r.get("bytes") or 0) for r in reads)
    assert late_from is not None
    late = [r for r in kubernetes.emulator.requests(since=late_from) if r["action"] == "get pods/log"]
    assert len(late) >= 5, f"only {len(late)} reads after the burst settled"
    # a settled second is never read again: a late read brings at most the last line and its timestamp
    assert all(int(r.get("bytes") or 0) <= 64 for r in late), [r.get("bytes") for r in late]
    # so what the reads cost stops growing once the burst has settled: the quiet part of the run (and
    # any longer run) adds nothing but the last line, where before every read brought the whole log
    early = len(reads) - len(late)
    assert total <= size * early + 64 * len(late), f"{total} bytes in {len(reads)} reads of a {size}-byte log"


def test_the_end_of_a_long_log_is_read_from_its_end(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    command = py(
        """
        import sys
        for i in range(3000):
            print(f'line {i:05d} ' + 'z' * 60)
        sys.exit(1)
        """
    )
    request = _request("k8s_tail", "long")
    handle = backend.submit(JobRequest(request.identity, command, {}, GpuResources(), "spot", image="x"))
    assert wait_ended(backend, handle).state is JobState.FAILED
    before = len(kubernetes.emulator.requests())
    tail = backend.output_tail(handle, 20)
    assert [line[:10] for line in tail] == [f"line {i:05d}" for i in range(2980, 3000)], tail
    reads = [r for r in _log_requests(kubernetes, before) if r["action"] == "get pods/log"]
    assert len(reads) == 1 and reads[0]["body"]["query"].get("tailLines") == "20", reads
    assert int(reads[0]["bytes"]) <= 20 * 120, reads[0]["bytes"]  # not the log's 200 KB
