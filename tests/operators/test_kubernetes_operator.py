"""GpuJobOperator on Kubernetes, what only Kubernetes has: an indexed Job whose ranks talk over a headless
Service, a deferred kill that deletes Job, pods and Service, an image that can never be pulled, and 200
waiting attempts read with one LIST per tick. Real Airflow (dag.test in a child process) or the real
trigger, on the fake Kubernetes API server (pods run as local processes on emulated Karpenter nodes).

What every backend does (spot fallback, crash and reattach, kill, ...) is tested once for all backends in
tests/operators/suite/."""

from __future__ import annotations

import asyncio
import itertools
import socket
import sys
import time
from collections.abc import Callable

import pytest

from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.job import GpuResources
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.harness import Harness, wait_for
from tests.kubernetes_world import KubernetesWorld
from tests.operators.suite.helpers import TICKING, kill_once_seen_running

BACKEND = '{"name": "kubernetes"}'


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


RANK_EXCHANGE = """
import os, socket, time
rank, host, port = int(os.environ['NODE_RANK']), os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
print(f'rank {rank} of {os.environ["NNODES"]}, master {host}:{port}', flush=True)
if rank == 0:
    server = socket.create_server(('0.0.0.0', port))
    conn, _ = server.accept()
    got = conn.recv(100).decode()
    conn.sendall(b'hello from rank 0')
    print(f'rank 0 got: {got}', flush=True)
else:
    for _ in range(100):
        try:
            conn = socket.create_connection((host, port))
            break
        except OSError:
            time.sleep(0.1)
    conn.sendall(b'hello from rank 1')
    print(f'rank 1 got: {conn.recv(100).decode()}', flush=True)
"""


def test_two_node_indexed_job_on_spot_ranks_exchange_data(harness: Harness, kubernetes: KubernetesWorld) -> None:
    port = _free_port()
    dag = harness.write_dag(
        "k8s_two_nodes",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={{"name": "kubernetes", "master_port": {port}}},
            image="trainer:1",
            command={[sys.executable, "-c", RANK_EXCHANGE]!r},
            resources=GpuResources(gpus=1, nodes=2),
            capacity="spot",
            deferrable=False,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "k8s_two_nodes")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    assert "rank 0 got: hello from rank 1" in run.log and "rank 1 got: hello from rank 0" in run.log
    (job,) = kubernetes.bodies("create jobs")
    (service,) = kubernetes.bodies("create services")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    assert job["spec"]["template"]["spec"]["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["ownerReferences"][0]["kind"] == "Job"  # deleted with the Job
    assert not kubernetes.emulator.requests("create pods"), "a Job's pods are created by its controller"


def test_killing_a_deferred_task_deletes_its_job_pods_and_service(kubernetes: KubernetesWorld) -> None:
    """The triggerer runs the trigger's on_kill when a deferred task is killed."""
    backend = KubernetesBackend()
    identity = JobIdentity(TaskKey("k8s_deferred", "job", "manual__1"), try_number=1, attempt=1, capacity="spot")
    handle = backend.submit(JobRequest(identity, TICKING, {}, GpuResources(nodes=2), "spot", image="x"))
    wait_for(lambda: len(kubernetes.emulator.objects("pods")) == 2, 10, "the job's two pods")
    trigger = GpuJobTrigger(
        backend=backend.spec(),
        handle=handle.to_dict(),
        poll_interval=0.3,
        task_label="Airflow task k8s_deferred.job of run manual__1",
    )

    kill_once_seen_running(trigger)
    (delete,) = kubernetes.emulator.requests("delete jobs")
    assert delete["body"]["body"] == {"propagationPolicy": "Foreground"}
    assert kubernetes.emulator.requests("delete services")
    wait_for(
        lambda: not kubernetes.emulator.objects("pods") and not kubernetes.emulator.objects("jobs"),
        15,
        "the job and its pods to go",
    )
    assert not kubernetes.emulator.objects("services")
    status = backend.poll([handle])[handle.job_id]
    assert not isinstance(status, Exception) and status.state.value == "CANCELLED", status
    assert "was killed while deferred" in status.reason


def test_an_unpullable_image_fails_the_task_fast_with_the_reason(harness: Harness, kubernetes: KubernetesWorld) -> None:
    dag = harness.write_dag(
        "k8s_bad_image",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={BACKEND},
            image="registry.example.com/does-not-exist:1",
            command={[sys.executable, "-c", "print('never')"]!r},
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    run = harness.run(dag, "k8s_bad_image", timeout=90)
    assert run.task()["state"] == "failed", run.log[-4000:]
    assert "ImagePull" in run.log and "does-not-exist" in run.log and "can never start" in run.log, run.log[-3000:]
    assert not kubernetes.emulator.objects("pods"), "the pod that can never start is deleted"


def test_200_waiting_attempts_in_one_triggerer_cost_one_list_per_tick(
    kubernetes: KubernetesWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__KUBERNETES_WATCH", "false")  # the regular tick alone (no watch)
    backend = KubernetesBackend()
    kubernetes.emulator.set_shortage("spot")
    handles = []
    for i in range(200):
        identity = JobIdentity(TaskKey("k8s_many", f"t{i}", "manual__1"), try_number=1, attempt=1, capacity="spot")
        handles.append(backend.submit(JobRequest(identity, ("true",), {}, GpuResources(), "spot", image="x")))
    interval = 1.0

    async def wait_until(done: Callable[[], object], what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s"
            await asyncio.sleep(interval / 4)

    async def wait_together() -> list[str]:
        triggers = [
            GpuJobTrigger(backend=backend.spec(), handle=h.to_dict(), poll_interval=interval, stream_logs=False)
            for h in handles
        ]

        async def first(trigger: GpuJobTrigger) -> str:
            async for event in trigger.run():
                return str(event.payload["status"])
            return "none"

        waiting = [asyncio.ensure_future(first(t)) for t in triggers]
        # every trigger subscribed: the poller's LIST comes once the first tick is due
        await wait_until(lambda: kubernetes.emulator.requests("list pods"), "a first LIST")
        kubernetes.emulator.log.reset()
        # five ticks seen: counted, not timed (a loaded machine only takes longer)
        await wait_until(lambda: len(kubernetes.emulator.requests("list pods")) >= 5, "5 LISTs")
        pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
        assert len(pollers) == 1, "one shared poller per event loop and backend"
        requests = kubernetes.emulator.requests()
        kubernetes.emulator.set_shortage("spot", False)
        lists = [r for r in requests if r["action"] == "list pods"]
        assert {r["action"] for r in requests} == {"list pods"}, {r["action"] for r in requests}
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(lists)]
        assert min(gaps) > interval / 2, gaps  # one LIST per tick, not one per attempt
        return list(await asyncio.wait_for(asyncio.gather(*waiting), 120))

    statuses = asyncio.run(wait_together())
    assert statuses == ["succeeded"] * 200
