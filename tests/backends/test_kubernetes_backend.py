"""Kubernetes backend: its state table fed every remote state, its options, and what the contract
suite does not cover (indexed-job disruption, the startup budget, Secrets by reference, list_owned,
throttling), against the fake API server."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, JobState, JobStatus, TaskKey, resolve_backend
from gpu_provider.backends.kubernetes import STATE_TABLE, KubernetesBackend
from gpu_provider.backends.kubernetes.mapping import job_remote_state, pod_remote_state
from gpu_provider.job import GpuResources
from tests.backends.contract.worlds import LONG_JOB, poll_one, py, wait_ended, wait_state, wait_status
from tests.harness import wait_for
from tests.kubernetes_world import KubernetesWorld

HEAVY = ("boto3", "botocore", "kubernetes", "kubernetes_asyncio", "numpy", "torch")


def _pod(
    phase: str, *, waiting: str | None = None, conditions: list[dict[str, Any]] | None = None, **status: Any
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": "p"},
        "spec": {},
        "status": {"phase": phase, "conditions": conditions or [], **status},
    }
    if waiting:
        pod["spec"]["nodeName"] = "n"
        pod["status"]["containerStatuses"] = [
            {"name": "main", "state": {"waiting": {"reason": waiting, "message": "m"}}}
        ]
    return pod


def _job(condition: str | None, reason: str = "", message: str = "", **spec: Any) -> dict[str, Any]:
    conds = [{"type": condition, "status": "True", "reason": reason, "message": message}] if condition else []
    return {"metadata": {"name": "j"}, "spec": {"completions": 1, **spec}, "status": {"conditions": conds}}


UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}]
CANCELLED_POD = {**_pod("Running"), "metadata": {"name": "p", "annotations": {"gpu-provider/cancel-reason": "x"}}}
RULE_0 = "Pod default/j-0 has condition DisruptionTarget matching FailJob rule at index 0"
RULE_1 = "Container main for pod default/j-0 failed with exit code 3 matching FailJob rule at index 1"
DISRUPTED = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "spot"}]
RUNNING_POD = _pod("Running")
EVICTED_OVER_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. "
EVICTED_OVER_REQUEST = (
    "The node was low on resource: memory. Container main was using 9Gi, which exceeds its request of 8Gi. "
)
#: one object per remote state of the table, as the API would answer it
EXAMPLES: dict[str, tuple[str, dict[str, Any], list[dict[str, Any]]]] = {
    "Pending": ("pod", _pod("Pending"), []),
    "Pending:Unschedulable": (
        "pod",
        _pod("Pending", conditions=UNSCHEDULABLE),
        [],
    ),
    "Pending:ContainerCreating": ("pod", _pod("Pending", waiting="ContainerCreating"), []),
    "Pending:PodInitializing": ("pod", _pod("Pending", waiting="PodInitializing"), []),
    "Pending:ErrImagePull": ("pod", _pod("Pending", waiting="ErrImagePull"), []),
    "Pending:ImagePullBackOff": ("pod", _pod("Pending", waiting="ImagePullBackOff"), []),
    "Pending:InvalidImageName": ("pod", _pod("Pending", waiting="InvalidImageName"), []),
    "Pending:CreateContainerConfigError": ("pod", _pod("Pending", waiting="CreateContainerConfigError"), []),
    "Pending:CreateContainerError": ("pod", _pod("Pending", waiting="CreateContainerError"), []),
    "Running": ("pod", RUNNING_POD, []),
    "Unknown": ("pod", _pod("Unknown"), []),
    "Succeeded": ("pod", _pod("Succeeded"), []),
    "Failed": ("pod", _pod("Failed"), []),
    "Failed:DeadlineExceeded": ("pod", _pod("Failed", reason="DeadlineExceeded"), []),
    "Failed:DisruptionTarget": ("pod", _pod("Failed", conditions=DISRUPTED), []),
    "Failed:Evicted": ("pod", _pod("Failed", reason="Evicted"), []),
    "Failed:Evicted:OverLimit": (
        "pod",
        _pod("Failed", reason="Evicted", message=EVICTED_OVER_LIMIT),
        [],
    ),
    "Failed:Evicted:OverRequest": (
        "pod",
        _pod("Failed", reason="Evicted", message=EVICTED_OVER_REQUEST),
        [],
    ),
    "Failed:NodeLost": ("pod", _pod("Failed", reason="NodeLost"), []),
    "Failed:NodeShutdown": ("pod", _pod("Failed", reason="NodeShutdown"), []),
    "Failed:Terminated": ("pod", _pod("Failed", reason="Terminated"), []),
    "Deleted": ("pod", CANCELLED_POD, []),
    "Job:Suspended": ("job", _job(None, suspend=True), []),
    "Job:Complete": ("job", _job("Complete"), []),
    "Job:SuccessCriteriaMet": ("job", _job("SuccessCriteriaMet"), []),
    "Job:Failed": ("job", _job("Failed", "BackoffLimitExceeded"), []),
    "Job:Failed:DeadlineExceeded": ("job", _job("Failed", "DeadlineExceeded"), []),
    "Job:Failed:DisruptionTarget": (
        "job",
        _job("Failed", "PodFailurePolicy", RULE_0),
        [],
    ),
    "Job:FailureTarget": ("job", _job("FailureTarget", "PodFailurePolicy", RULE_1), []),
    "Job:FailureTarget:DisruptionTarget": (
        "job",
        _job("FailureTarget", "PodFailurePolicy"),
        [_pod("Failed", conditions=DISRUPTED)],
    ),
}  # fmt: skip


def test_the_state_table_is_fed_every_remote_state() -> None:
    assert set(EXAMPLES) == set(STATE_TABLE), set(STATE_TABLE) ^ set(EXAMPLES)
    for remote, (kind, obj, pods) in EXAMPLES.items():
        found, _ = pod_remote_state(obj) if kind == "pod" else job_remote_state(obj, pods)
        assert found == remote, (remote, found)
    # a running job is as far as its least advanced pod
    job = _job(None, completions=2)
    assert (
        job_remote_state(job, [RUNNING_POD, _pod("Pending", waiting="ContainerCreating")])[0]
        == "Pending:ContainerCreating"
    )
    assert job_remote_state(job, [RUNNING_POD, RUNNING_POD])[0] == "Running"
    assert job_remote_state(job, [RUNNING_POD])[0] == "Pending"  # one rank not created yet
    finished = {
        **_pod("Succeeded"),
        "metadata": {"name": "j-0", "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
    }
    running = {
        **RUNNING_POD,
        "metadata": {"name": "j-1", "annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
    }
    assert job_remote_state(job, [finished, running])[0] == "Running"  # a rank that finished was created
    # a phase no Kubernetes has today is an error naming it, never a guess
    from gpu_provider.backends.base import map_state

    with pytest.raises(ValueError, match="'Archived'"):
        map_state(STATE_TABLE, pod_remote_state(_pod("Archived"))[0], backend="kubernetes")


def test_a_kubernetes_task_is_validated_at_parse_time_without_importing_kubernetes() -> None:
    code = (
        "import sys, json\n"
        "from gpu_provider import GpuResources\n"
        "from gpu_provider.operators import GpuJobOperator\n"
        "GpuJobOperator(task_id='t', command=['true'], image='img', capacity='spot_fallback', backend='kubernetes',\n"
        "               resources=GpuResources(gpus=1, nodes=2))\n"
        "try:\n"
        "    GpuJobOperator(task_id='u', command=['true'], image='img', backend='kubernetes',\n"
        "                   resources=GpuResources(gpus=0.5))\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused: resources.gpus=0.5: the kubernetes backend shares a GPU" in out
    assert "fractional_gpu_resource" in out
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_options_are_checked_with_messages_naming_the_field_and_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = [
        ({"namespace": "Bad_Namespace"}, "namespace='Bad_Namespace'"),
        ({"secrets": {"HF_TOKEN": "hf_abc123secret"}}, r"secrets\['HF_TOKEN'\] must name a Kubernetes Secret"),
        ({"priority_classes": {"gpu-high": "high"}}, r"priority_classes\['gpu-high'\]='high'"),
        ({"tolerations": [{"key": "a", "operator": "Equals"}]}, r"tolerations\[0\].operator='Equals'"),
        ({"node_selector": "{not json"}, "node_selector must be"),
        ({"master_port": 70000}, "master_port=70000"),
        ({"startup_timeout": "-3"}, "startup_timeout='-3'"),
        ({"image_pull_secrets": "ok, Not_OK"}, "'Not_OK' is not a Secret name"),
        ({"fractional_gpu_resource": "nvidia.com/"}, "fractional_gpu_resource='nvidia.com/'"),
    ]
    for options, message in bad:
        with pytest.raises((ValueError, TypeError), match=message):
            KubernetesBackend(**options)
    with pytest.raises(ValueError) as refused:
        KubernetesBackend(secrets={"HF_TOKEN": "hf_abc123secret"})
    assert "hf_abc123secret" not in str(refused.value), "a secret passed by mistake is never echoed"

    backend = KubernetesBackend(
        namespace="gpu-jobs",
        secrets='{"HF_TOKEN": "hf/token"}',
        priority_classes={"batch": -10, "prod": 50},
        tolerations=[{"key": "a", "operator": "Exists"}],
        spot_node_pool="-",
    )
    assert KubernetesBackend.from_options(**backend.options()) == backend
    assert resolve_backend(backend.spec()) == backend
    assert [backend.priority_class(p) for p in (None, -100, -10, 49, 50, 10**6)] == [
        "batch",
        "batch",
        "batch",
        "batch",
        "prod",
        "prod",
    ]
    assert backend.spot_node_pool == ""  # '-': placed by capacity type only
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__KUBERNETES_NAMESPACE", "from-config")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__KUBERNETES_STARTUP_TIMEOUT", "120")
    configured = KubernetesBackend()
    assert (configured.namespace, configured.startup_timeout) == ("from-config", 120.0)


def _request(suffix: str, command: tuple[str, ...], *, nodes: int = 1, capacity: str = names.SPOT) -> JobRequest:
    task = TaskKey(f"k8s_backend_{suffix}", "job", "manual__1")
    identity = JobIdentity(task, try_number=1, attempt=1, capacity=capacity, team="vision")
    return JobRequest(
        identity, command, {}, GpuResources(gpus=1, nodes=nodes), capacity, image="trainer:1", max_runtime_s=600
    )


def test_a_disrupted_rank_of_an_indexed_job_preempts_the_whole_attempt(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    handle = backend.submit(_request("gang", LONG_JOB, nodes=2))
    wait_state(backend, handle, JobState.RUNNING)
    pods = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
        for p in kubernetes.emulator.objects("pods")
    }
    kubernetes.emulator.reclaim(pods["1"]["metadata"]["name"])

    status = wait_ended(backend, handle, timeout=20)
    assert status.state is JobState.PREEMPTED and status.interruption == names.PREEMPTED, status
    assert "DisruptionTarget" in status.reason, status
    # the podFailurePolicy failed the job at once: rank 0 is stopped too, nothing keeps running
    wait_for(
        lambda: all(p["status"]["phase"] != "Running" for p in kubernetes.emulator.objects("pods")),
        15,
        "rank 0 to stop",
    )


def test_a_gang_whose_rank_0_finished_first_is_running_not_queued(kubernetes: KubernetesWorld) -> None:
    """Before: "queued: 1 of 2 pods created" once rank 0 had finished and rank 1 still ran."""
    backend = KubernetesBackend()
    job = py(
        """
        import os, time
        time.sleep(0.2 if os.environ['NODE_RANK'] == '0' else 4)
        """
    )
    handle = backend.submit(_request("rank0first", job, nodes=2))

    def rank_0_done() -> bool:
        phases = {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["status"]["phase"]
            for p in kubernetes.emulator.objects("pods")
        }
        return phases.get("0") == "Succeeded" and phases.get("1") == "Running"

    wait_for(rank_0_done, 20, "rank 0 to finish while rank 1 runs")
    status = poll_one(backend, handle)
    assert status.state is JobState.RUNNING and "pods created" not in status.reason, status
    assert wait_ended(backend, handle).state is JobState.SUCCEEDED


def test_the_end_of_a_gang_s_output_comes_from_every_rank_merged_by_time(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    job = py(
        """
        import os, sys, time
        rank = os.environ['NODE_RANK']
        for i in range(15):
            print(f'step {i} of rank {rank}', flush=True)
            time.sleep(0.01)
        if rank == '1':  # rank 0 ended well (its pod stays); rank 1 fails after it
            time.sleep(0.5)
            print('rank 1 failed: CUDA error', flush=True)
            sys.exit(2)
        """
    )
    handle = backend.submit(_request("gangtail", job, nodes=2))
    assert wait_ended(backend, handle).state is JobState.FAILED
    tail = backend.output_tail(handle, 20)
    assert len(tail) == 20 and tail[-1] == "rank 1: rank 1 failed: CUDA error", tail
    assert {line.split(":")[0] for line in tail} == {"rank 0", "rank 1"}, tail


def test_a_failed_pod_s_reason_does_not_repeat_its_exit_code(kubernetes: KubernetesWorld) -> None:
    """The exit code is reported apart (``JobStatus.exit_code``) and added once by the engine's message;
    before: "exit code 1 (Error) (exit code 1)"."""
    backend = KubernetesBackend()
    handle = backend.submit(_request("exit1", py("import sys; sys.exit(1)")))
    status = wait_ended(backend, handle)
    assert (status.state, status.exit_code, status.reason) == (JobState.FAILED, 1, "Error"), status


#: the verbs of the fake API server's request log that change nothing
READS = ("get", "list", "watch")


def test_a_pod_waiting_for_a_node_past_the_startup_budget_is_a_capacity_timeout(kubernetes: KubernetesWorld) -> None:
    kubernetes.emulator.set_shortage("on-demand")
    backend = KubernetesBackend(startup_timeout=4)
    handle = backend.submit(_request("startup", py("print('x')"), capacity=names.ON_DEMAND))
    seen = len(kubernetes.emulator.requests())  # from here on, only reads
    queued = wait_status(backend, handle, lambda s: "Unschedulable" in s.reason or s.state.terminal, "unschedulable")
    assert queued.state is JobState.QUEUED and "no on-demand capacity" in queued.reason, queued
    status = wait_ended(backend, handle, timeout=15)
    assert status.state is JobState.CANCELLED and status.interruption == names.CAPACITY_TIMEOUT, status
    assert "startup_timeout=4s" in status.reason, status
    # a read only reports the verdict: the pod is still there, for the task that owns it to delete
    assert status.never_starts and "startup_timeout=4s" in status.never_starts, status
    assert kubernetes.emulator.objects("pods"), "a status read deleted the pod"
    mutating = [r["action"] for r in kubernetes.emulator.requests(since=seen) if r["action"].split()[0] not in READS]
    assert mutating == [], f"a status read changed something: {mutating}"
    backend.cancel(handle, status.never_starts)  # what the owning task's wait does
    wait_for(lambda: not kubernetes.emulator.objects("pods"), 10, "the pod's deletion")
    again = poll_one(KubernetesBackend(), handle)  # gone: its Event still says why
    assert again.state is JobState.CANCELLED and again.interruption == names.CAPACITY_TIMEOUT, again


def test_secrets_reach_the_job_by_reference_only(kubernetes: KubernetesWorld) -> None:
    kubernetes.emulator.secrets[("default", "hf")] = {"token": "hf_very_secret_value"}
    backend = KubernetesBackend(secrets={"HF_TOKEN": "hf/token"})
    code = "import os; print('token length', len(os.environ['HF_TOKEN']))"
    handle = backend.submit(_request("secret", py(code), capacity=names.ON_DEMAND))
    assert wait_ended(backend, handle).state is JobState.SUCCEEDED
    lines = backend.logs(handle).lines
    assert "token length 20" in lines, lines
    sent = json.dumps([r["body"] for r in kubernetes.emulator.requests()])
    assert "hf_very_secret_value" not in sent, "the value never passes through the provider"


def test_list_owned_reports_the_active_pods_and_jobs_of_this_provider(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    pod = backend.submit(_request("owned_pod", LONG_JOB))
    job = backend.submit(_request("owned_job", LONG_JOB, nodes=2, capacity=names.ON_DEMAND))
    done = backend.submit(_request("owned_done", py("print('done')"), capacity=names.ON_DEMAND))
    wait_state(backend, pod, JobState.RUNNING)
    assert wait_ended(backend, done).state is JobState.SUCCEEDED

    owned = {o.handle.job_id: o for o in KubernetesBackend().list_owned()}
    assert set(owned) == {pod.job_id, job.job_id}, owned
    assert owned[pod.job_id].task == TaskKey("k8s_backend_owned_pod", "job", "manual__1")
    assert (owned[pod.job_id].team, owned[pod.job_id].max_runtime_s, owned[pod.job_id].try_number) == (
        "vision",
        600.0,
        1,
    )
    assert owned[pod.job_id].started_at is not None
    assert (owned[job.job_id].nodes, owned[job.job_id].gpus, owned[job.job_id].handle.extra["kind"]) == (2, 1.0, "Job")
    backend.cancel(pod, "reaped")
    assert pod.job_id not in {o.handle.job_id for o in KubernetesBackend().list_owned()}


def test_polls_go_on_while_the_api_server_throttles(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    handle = backend.submit(_request("throttled", py("print('ok')"), capacity=names.ON_DEMAND))
    kubernetes.emulator.faults.throttle("list pods", 2)  # every second LIST answered 429
    status = wait_ended(backend, handle)
    assert status.state is JobState.SUCCEEDED, status
    assert any(r["throttled"] for r in kubernetes.emulator.requests("list pods"))


def test_the_emulator_streams_watches_for_the_official_client(kubernetes: KubernetesWorld) -> None:
    from kubernetes import client, config, watch

    api = client.CoreV1Api(config.new_client_from_config(str(kubernetes.kubeconfig)))
    backend = KubernetesBackend()
    handle = backend.submit(_request("watched", py("print('watched')"), capacity=names.ON_DEMAND))
    phases = []
    for event in watch.Watch().stream(
        api.list_namespaced_pod, "default", label_selector=f"gpu-provider/job={handle.name}", timeout_seconds=10
    ):
        phases.append((event["type"], event["object"].status.phase))
        if event["object"].status.phase == "Succeeded":
            break
    assert phases[0] == ("ADDED", "Pending") and ("MODIFIED", "Running") in phases, phases
    assert isinstance(poll_one(backend, handle), JobStatus)


def test_each_request_records_the_token_of_its_kubeconfig(kubernetes: KubernetesWorld, tmp_path: Any) -> None:
    """Clients with their own kubeconfigs are told apart in the request log (the polling benchmark counts
    each side's calls this way while both watch at once); the world's own kubeconfig has the default token."""
    from kubernetes import client, config

    before = len(kubernetes.emulator.requests())
    for token in ("team-a", "team-b"):
        path = kubernetes.emulator.kubeconfig(tmp_path / f"kubeconfig-{token}", token=token)
        api = client.CoreV1Api(config.new_client_from_config(str(path)))
        api.list_namespaced_pod("default", label_selector=f"gpu-provider/team={token}")
    api = client.CoreV1Api(config.new_client_from_config(str(kubernetes.kubeconfig)))
    api.list_namespaced_pod("default", label_selector="gpu-provider/team=none")
    lists = [r for r in kubernetes.emulator.requests("list pods")[before:] if "team" in str(r["body"]["query"])]
    assert [r["client"] for r in lists] == ["team-a", "team-b", "emulator-token"], lists


def test_the_attempt_lookup_sends_its_pod_and_job_lists_together(kubernetes: KubernetesWorld) -> None:
    """A submit's attempt lookup waits for one round trip, not two: the Job LIST is on the wire while the
    pod LIST is (each is held at the API server until the other has arrived, 5 s at most)."""
    import threading

    backend = KubernetesBackend()
    requests = {
        "pod": _request("lookup-pod", py("print('ok')"), capacity=names.ON_DEMAND),
        "job": _request("lookup-job", py("print('ok')"), capacity=names.ON_DEMAND, nodes=2),
    }
    handles = {kind: backend.submit(request) for kind, request in requests.items()}
    both = threading.Barrier(2, timeout=5)
    met: list[str] = []
    log = kubernetes.emulator.log
    record = log.record

    def held(action: str, request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if action in ("list pods", "list jobs") and "lookup" in str(request["query"].get("labelSelector")):
            both.wait()  # BrokenBarrierError (the request fails) when the other LIST does not come meanwhile
            met.append(action)
        return record(action, request, **kwargs)

    for kind, request in requests.items():
        log.record = held  # type: ignore[method-assign]
        try:
            found = backend.find_existing(request.identity.task)
        finally:
            del log.record
            both.reset()
        assert [h.job_id for h in found] == [handles[kind].job_id]
    assert sorted(met) == ["list jobs", "list jobs", "list pods", "list pods"]
