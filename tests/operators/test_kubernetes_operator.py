"""GpuJobOperator on Kubernetes end to end: real Airflow (dag.test in a child process), the fake
Kubernetes API server (pods run as local processes on emulated Karpenter nodes), asserting what
reached the server and what the tasks returned."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, TaskKey
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.kubernetes.mapping import CANCEL_ANNOTATION
from gpu_provider.job import GpuResources
from gpu_provider.names import CANCEL_PREFIX, CAPACITY_TIMEOUT_MARK
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.harness import Harness, pid_alive, wait_for
from tests.kubernetes_world import KubernetesWorld

BACKEND = '{"name": "kubernetes"}'


def _env(manifest: dict[str, Any]) -> dict[str, str]:
    spec = manifest["spec"]
    pod = spec["template"]["spec"] if manifest["kind"] == "Job" else spec
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


def _pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_spot_pod_disrupted_mid_run_resumes_on_on_demand(harness: Harness, kubernetes: KubernetesWorld) -> None:
    dag_id = "k8s_fallback"
    out, ckpt = harness.tmp / "out", harness.tmp / "ckpt"
    kubernetes.emulator.reclaim_after(1.5, name_contains="k8s-fallback")
    dag = harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend={BACKEND},
            image="trainer:1",
            command={harness.toy_command(str(out), 14, 0.2)},
            capacity=SpotFallback(after_preemptions=1, backoff=0),
            checkpoint="file://{ckpt}",
            deferrable=True,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["state"]) == ("spot", "PREEMPTED"), first
    assert "DisruptionTarget" in first["reason"] and "spot interruption" in first["reason"], first
    assert (second["capacity"], second["state"]) == ("on-demand", "SUCCEEDED"), second
    assert "ckpt-" in second["resume_from"] and int(second["resume_from"].rsplit("ckpt-", 1)[1]) > 0
    # what reached the API server: a spot pod, then an on-demand pod resuming from the checkpoint
    spot, on_demand = kubernetes.bodies("create pods")
    assert spot["spec"]["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert _env(spot)["GPU_PROVIDER_RESUME_FROM"] == ""
    assert on_demand["spec"]["nodeSelector"]["karpenter.sh/capacity-type"] == "on-demand"
    assert on_demand["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "gpu-on-demand"
    assert _env(on_demand)["GPU_PROVIDER_RESUME_FROM"] == second["resume_from"]
    assert _env(on_demand)["GPU_PROVIDER_ATTEMPT"] == "2"
    history = json.loads((out / "result.json").read_text())["history"]
    assert history[1]["start"] == int(second["resume_from"].rsplit("ckpt-", 1)[1]) > 0  # the step counter goes on
    assert "[job] resumed from step" in run.log


def test_spot_pod_unschedulable_past_its_deadline_is_deleted_and_recreated_on_demand(
    harness: Harness, kubernetes: KubernetesWorld
) -> None:
    kubernetes.emulator.set_shortage("spot")  # Karpenter finds no spot capacity
    dag = harness.write_dag(
        "k8s_spot_wait",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={BACKEND},
            image="trainer:1",
            command={harness.toy_command(str(harness.tmp / "out"), 2, 0.05)},
            capacity=SpotFallback(spot_wait_timeout=2.0, backoff=0),
            checkpoint="file://{harness.tmp / "ckpt"}",
            deferrable=True,
            poll_interval=0.3,
        )
        """,
    )
    run = harness.run(dag, "k8s_spot_wait")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    first, second = task["xcom"]["attempts"]
    assert (first["capacity"], first["state"], first["interruption"]) == ("spot", "CANCELLED", "capacity_timeout")
    assert (second["capacity"], second["state"]) == ("on-demand", "SUCCEEDED")
    assert "Unschedulable" in run.log or "no spot capacity" in run.log
    # deleted, with the reason on the pod and in an Event a later lookup reads
    (patch,) = [b for b in kubernetes.bodies("patch pods") if CANCEL_ANNOTATION in json.dumps(b)]
    assert patch["metadata"]["annotations"][CANCEL_ANNOTATION].startswith(CANCEL_PREFIX + CAPACITY_TIMEOUT_MARK)
    assert [r["body"]["path"].rsplit("/", 1)[1] for r in kubernetes.emulator.requests("delete pods")] == [
        first["job_id"]
    ]
    # the pod is gone; its Event still tells a later poll (a retry after a crash) it was a capacity timeout
    gone = JobHandle("kubernetes", first["job_id"], first["job_id"], 1, "spot", 0.0, {"kind": "Pod"})
    status = KubernetesBackend().poll([gone])[first["job_id"]]
    assert not isinstance(status, Exception) and status.interruption == "capacity_timeout", status


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


def test_worker_crash_then_retry_reattaches_without_a_second_create(
    harness: Harness, kubernetes: KubernetesWorld
) -> None:
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = harness.write_dag(
        "k8s_crash",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={BACKEND},
            image="trainer:1",
            command={harness.toy_command(str(out), 120, 0.15)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            checkpoint="file://{harness.tmp / "ckpt"}",
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    worker, _, _ = harness.start(dag, "k8s_crash")
    job_pid = wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the pod to start")
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies; the pod does not
    worker.wait(timeout=10)
    assert pid_alive(job_pid)
    assert kubernetes.count("create pods") == 1

    run = harness.run(dag, "k8s_crash")
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    # reattached while it runs or, on a loaded machine where the retry starts late, its result taken
    assert "Reattaching to kubernetes job" in run.log or "of an earlier try already succeeded" in run.log
    assert kubernetes.count("create pods") == 1, "the retry must not create a second pod"
    assert set(_pids(pid_dir)) == {"1-0"}


def test_killing_a_running_task_deletes_its_pod(harness: Harness, kubernetes: KubernetesWorld) -> None:
    out, pid_dir = harness.tmp / "out", harness.tmp / "pids"
    dag = harness.write_dag(
        "k8s_kill",
        f"""
        GpuJobOperator(
            task_id="job",
            backend={BACKEND},
            image="trainer:1",
            command={harness.toy_command(str(out), 300, 0.2)},
            env={{"PID_DIR": {str(pid_dir)!r}}},
            poll_interval=0.3,
            deferrable=False,
        )
        """,
    )
    worker, _, log = harness.start(dag, "k8s_kill")
    job_pid = wait_for(lambda: _pids(pid_dir).get("1-0"), 120, "the pod to start")
    worker.send_signal(signal.SIGTERM)  # what Airflow sends a task it kills
    (delete,) = wait_for(lambda: kubernetes.emulator.requests("delete pods"), 15, "the pod's deletion")
    assert delete["body"]["body"]["propagationPolicy"] == "Foreground"
    wait_for(lambda: not pid_alive(job_pid), 10, "the pod's process to stop")
    worker.wait(timeout=30)
    assert "Cancelled kubernetes job" in log.read_text()


def test_killing_a_deferred_task_deletes_its_job_pods_and_service(kubernetes: KubernetesWorld) -> None:
    """The triggerer runs the trigger's on_kill when a deferred task is killed."""
    backend = KubernetesBackend()
    identity = JobIdentity(TaskKey("k8s_deferred", "job", "manual__1"), try_number=1, attempt=1, capacity="spot")
    command = (sys.executable, "-c", "import time; time.sleep(60)")
    handle = backend.submit(JobRequest(identity, command, {}, GpuResources(nodes=2), "spot", image="x"))
    wait_for(lambda: len(kubernetes.emulator.objects("pods")) == 2, 10, "the job's two pods")
    trigger = GpuJobTrigger(
        backend=backend.spec(),
        handle=handle.to_dict(),
        poll_interval=0.3,
        task_label="Airflow task k8s_deferred.job of run manual__1",
    )

    async def wait_then_kill() -> None:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(1.0)
        assert not waiting.done()
        waiting.cancel()
        await trigger.on_kill()

    asyncio.run(wait_then_kill())
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
        await asyncio.sleep(interval * 0.5)  # let every trigger subscribe
        kubernetes.emulator.log.reset()
        await asyncio.sleep(interval * 5)
        pollers = [p for p in SharedPoller._pollers.values() if p.backend == backend]
        assert len(pollers) == 1, "one shared poller per event loop and backend"
        requests = kubernetes.emulator.requests()
        kubernetes.emulator.set_shortage("spot", False)
        lists = [r for r in requests if r["action"] == "list pods"]
        assert {r["action"] for r in requests} == {"list pods"}, {r["action"] for r in requests}
        assert 3 <= len(lists) <= 6, f"{len(lists)} LISTs in 5 ticks"
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(lists)]
        assert min(gaps) > interval / 2, gaps  # one LIST per tick, not one per attempt
        return list(await asyncio.wait_for(asyncio.gather(*waiting), 120))

    statuses = asyncio.run(wait_together())
    assert statuses == ["succeeded"] * 200
