"""GPU hardware faults are the node's, not the job's: every row of each backend's node-fault table, with the
service's (or the driver's) own words, classified as an interruption of kind ``node_fault``; the engine's
rules for them (their own budget, the same fault twice on fresh hardware is the job's error); Kubernetes'
anti-affinity to the faulty node."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, JobState, TaskKey
from gpu_provider.backends.batch import mapping as batch_mapping
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.kubernetes import mapping as k8s_mapping
from gpu_provider.backends.kubernetes.manifests import HOSTNAME
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.backends.sagemaker import mapping as sm_mapping
from gpu_provider.engine.attempts import AttemptEngine, Fail, Submit
from gpu_provider.exceptions import GpuJobFailedError, GpuJobInterruptionBudgetError
from gpu_provider.job import GpuResources
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import OnDemand, SpotFallback
from gpu_provider.runtime.faults import OUTPUT_FAULTS, fault_in_line, fault_of_exit_code
from gpu_provider.testing.dagrun import wait_for
from gpu_provider.testing.worlds import SageMakerWorld
from tests.backends.contract.worlds import LONG_JOB, BatchBackendWorld, SageMakerBackendWorld, wait_ended, wait_state
from tests.backends.test_kubernetes_manifests import request as k8s_request
from tests.batch_world import BatchWorld
from tests.kubernetes_world import KubernetesWorld

# --- the job's own output (the runtime helper's table) ----------------------------------------------

#: one real line per row of OUTPUT_FAULTS, in the table's order
OUTPUT_EXAMPLES = (
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=2811, GPU has fallen off the bus.", names.FAULT_GPU_LOST),
    (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system",
        names.FAULT_GPU_LOST,
    ),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", names.FAULT_ECC),
    (
        "NVRM: Xid (PCI:0000:00:1e): 48, pid=2811, An uncorrectable double bit error (DBE) has been detected on GPU",
        names.FAULT_ECC,
    ),
    ("NVRM: Xid (PCI:0000:00:1e): 13, pid=2811, Graphics Exception: ESR 0x404600=0x80000002", names.FAULT_XID),
    (
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600093 milliseconds before timing out.",
        names.FAULT_NCCL_TIMEOUT,
    ),
)


def test_every_row_of_the_output_table_has_an_example() -> None:
    assert len(OUTPUT_EXAMPLES) == len(OUTPUT_FAULTS)
    for (line, kind), row in zip(OUTPUT_EXAMPLES, OUTPUT_FAULTS, strict=True):
        assert row.kind == kind and row.pattern.search(line), (line, row)


@pytest.mark.parametrize(("line", "kind"), OUTPUT_EXAMPLES, ids=[k for _, k in OUTPUT_EXAMPLES])
def test_each_output_row_is_recognised_on_a_multi_node_job(line: str, kind: str) -> None:
    assert fault_in_line(line, nodes=2) == kind
    assert fault_in_line(f"[node 1] {line}\nmore output", nodes=2) == kind


def test_application_errors_are_not_node_faults() -> None:
    for line in (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: CUDA error: unspecified launch failure",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error",
        "Traceback (most recent call last):",
    ):
        assert fault_in_line(line, nodes=2) is None, line
    # an NCCL timeout on one node is as likely the job's own deadlock
    assert fault_in_line(OUTPUT_EXAMPLES[-1][0], nodes=1) is None


def test_the_runtime_helper_s_exit_codes_name_each_fault() -> None:
    for kind, code in names.NODE_FAULT_EXIT_CODES.items():
        assert fault_of_exit_code(code) == kind
    assert fault_of_exit_code(1) is None and fault_of_exit_code(None) is None


# --- AWS Batch ---------------------------------------------------------------------------------------


def _batch_job(reason: str = "", container_reason: str = "", code: int | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"reason": container_reason} if container_reason else {}
    if code is not None:
        container["exitCode"] = code
    return {
        "status": "FAILED",
        "statusReason": reason,
        "attempts": [{"container": container, "statusReason": reason}],
    }


@pytest.mark.parametrize(
    "row", batch_mapping.NODE_FAULT_TABLE, ids=[r.example[:40] for r in batch_mapping.NODE_FAULT_TABLE]
)
def test_each_batch_row_is_a_node_fault(row: batch_mapping.NodeFaultRow) -> None:
    for job in (_batch_job(reason=row.example), _batch_job(container_reason=row.example)):
        state, reason, interruption = batch_mapping.refine_failure(job)
        assert (state, interruption) == (JobState.FAILED, names.NODE_FAULT), reason
        assert batch_mapping.node_fault(job) == row.fault
        assert f"GPU hardware fault: {row.fault}" in reason


@pytest.mark.parametrize(("kind", "code"), sorted(names.NODE_FAULT_EXIT_CODES.items()))
def test_a_batch_exit_code_of_the_runtime_helper_is_a_node_fault(kind: str, code: int) -> None:
    job = _batch_job("Essential container in task exited", code=code)
    assert batch_mapping.refine_failure(job)[2] == names.NODE_FAULT
    assert batch_mapping.node_fault(job) == kind


def test_a_batch_job_s_own_failures_stay_its_own() -> None:
    for job in (
        _batch_job("Essential container in task exited", code=1),
        _batch_job(container_reason='CannotStartContainerError: exec: "train": executable file not found in $PATH'),
        _batch_job(container_reason="OutOfMemoryError: Container killed due to memory usage", code=137),
    ):
        assert batch_mapping.refine_failure(job)[2] is None, job
        assert batch_mapping.node_fault(job) is None


# --- SageMaker ---------------------------------------------------------------------------------------


def _sm_status(failure: str, nodes: int = 1) -> Any:
    backend = SageMakerBackend(
        role_arn="arn:aws:iam::123456789012:role/gpu-sagemaker-job",
        output_path="s3://bucket/models",
        region_name="us-east-1",
    )
    name = "gp-d-t-0123456789-t1-a1"
    handle = JobHandle("sagemaker", name, name, 1, names.ON_DEMAND, time.time(), extra={"region": "us-east-1"})
    job = {
        "TrainingJobName": name,
        "TrainingJobStatus": "Failed",
        "SecondaryStatus": "Failed",
        "FailureReason": failure,
        "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": nodes},
        "SecondaryStatusTransitions": [{"Status": "Failed", "StartTime": time.time(), "StatusMessage": "Failed"}],
    }
    return backend.status_of(job, handle, {})


@pytest.mark.parametrize(("prefix", "row"), sorted(sm_mapping.NODE_FAULT_REASONS.items()))
def test_each_sagemaker_reason_is_a_node_fault(prefix: str, row: tuple[str, str]) -> None:
    fault, words = row
    status = _sm_status(words)
    assert (status.state, status.interruption, status.fault) == (JobState.FAILED, names.NODE_FAULT, fault)
    assert words in status.reason and "not the job's own error" in status.reason


@pytest.mark.parametrize(("line", "kind"), OUTPUT_EXAMPLES, ids=[k for _, k in OUTPUT_EXAMPLES])
def test_a_gpu_message_quoted_in_a_sagemaker_algorithm_error_is_a_node_fault(line: str, kind: str) -> None:
    status = _sm_status(f'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "{line}"\n', nodes=2)
    assert (status.interruption, status.fault) == (names.NODE_FAULT, kind)


def test_sagemaker_exit_codes_of_the_runtime_helper_and_the_job_s_own_errors() -> None:
    code = names.NODE_FAULT_EXIT_CODES[names.FAULT_ECC]
    assert _sm_status(f"AlgorithmError: , exit code: {code}").fault == names.FAULT_ECC
    own = _sm_status("AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage \"KeyError: 'x'\"\n")
    assert own.interruption is None and own.fault is None


# --- Kubernetes --------------------------------------------------------------------------------------


def _k8s_pod(reason: str = "", message: str = "", terminated: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Failed", "conditions": [], "reason": reason, "message": message}
    status["containerStatuses"] = [{"name": "main", "state": {"terminated": terminated or {"exitCode": 1}}}]
    return {
        "metadata": {"name": "gp-pod-a1", "creationTimestamp": "2026-12-05T09:00:00Z"},
        "spec": {"nodeName": "ip-10-0-1-2.ec2.internal"},
        "status": status,
    }


def _k8s_status(pod: dict[str, Any]) -> Any:
    handle = JobHandle("kubernetes", "gp-pod-a1", "gp-pod-a1", 1, names.ON_DEMAND, time.time(), extra={"kind": "Pod"})
    return KubernetesBackend()._status(handle, {"gp-pod-a1": [pod]}, {})


@pytest.mark.parametrize(
    "row", k8s_mapping.NODE_FAULT_TABLE, ids=[r.example[:50] for r in k8s_mapping.NODE_FAULT_TABLE]
)
def test_each_kubernetes_row_is_a_node_fault_on_its_node(row: k8s_mapping.NodeFaultRow) -> None:
    status = _k8s_status(_k8s_pod(row.reason, row.example))
    assert (status.state, status.interruption, status.fault) == (JobState.FAILED, names.NODE_FAULT, row.fault)
    assert status.node == "ip-10-0-1-2.ec2.internal"
    assert "GPU hardware fault on node ip-10-0-1-2.ec2.internal" in status.reason


@pytest.mark.parametrize(("line", "kind"), OUTPUT_EXAMPLES[:-1], ids=[k for _, k in OUTPUT_EXAMPLES[:-1]])
def test_a_gpu_message_in_a_pod_s_termination_message_is_a_node_fault(line: str, kind: str) -> None:
    status = _k8s_status(_k8s_pod(terminated={"exitCode": 1, "reason": "Error", "message": f"step 12\n{line}\n"}))
    assert (status.interruption, status.fault, status.node) == (names.NODE_FAULT, kind, "ip-10-0-1-2.ec2.internal")


def test_a_kubernetes_exit_code_of_the_runtime_helper_is_a_node_fault_and_a_plain_error_is_the_job_s() -> None:
    code = names.NODE_FAULT_EXIT_CODES[names.FAULT_XID]
    assert _k8s_status(_k8s_pod(terminated={"exitCode": code})).fault == names.FAULT_XID
    own = _k8s_status(_k8s_pod(terminated={"exitCode": 1, "message": "KeyError: 'x'"}))
    assert own.state is JobState.FAILED and own.interruption is None and own.fault is None


def test_kubernetes_keeps_the_next_attempt_away_from_the_faulty_node() -> None:
    request = dataclasses.replace(k8s_request(nodes=1, instance_types=("g5.2xlarge",)), avoid_nodes=("ip-10-0-1-2",))
    pod = KubernetesBackend().manifests(request)[0]
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": HOSTNAME, "operator": "NotIn", "values": ["ip-10-0-1-2"]} in term["matchExpressions"]
    assert pod["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


# --- the engine's rules ------------------------------------------------------------------------------


def _faulted(attempt: int, fault: str, node: str | None = None, capacity: str = names.ON_DEMAND) -> AttemptRecord:
    handle = JobHandle("local", f"j{attempt}", f"j{attempt}", attempt, capacity, time.time())
    record = AttemptRecord.new(handle, try_number=1)
    record.update(
        dataclasses.replace(
            _k8s_status(_k8s_pod(terminated={"exitCode": names.NODE_FAULT_EXIT_CODES[fault]})),
            node=node,
        )
    )
    assert record.interruption == names.NODE_FAULT and record.fault == fault
    return record


def test_a_node_fault_resubmits_on_the_same_capacity_without_touching_the_interruption_budget() -> None:
    first = _faulted(1, names.FAULT_XID, node="ip-1")
    engine = AttemptEngine(OnDemand(backoff=0, max_interruptions=0), [first], try_number=1, backend_name="local")
    assert engine.ended(first) == Submit(attempt=2, capacity=names.ON_DEMAND)
    assert "away from node ip-1" in (engine.note or "") and "node fault 1 of at most 2" in (engine.note or "")
    assert engine.interruptions() == []  # max_interruptions=0 was not spent
    spot = _faulted(1, names.FAULT_XID, capacity=names.SPOT)
    fallback = AttemptEngine(SpotFallback(backoff=0), [spot], try_number=1, backend_name="local")
    assert fallback.ended(spot) == Submit(attempt=2, capacity=names.SPOT), "a node fault is not a spot reclaim"


def test_the_same_fault_twice_on_fresh_hardware_is_the_job_s_own_error() -> None:
    records = [_faulted(1, names.FAULT_ECC), _faulted(2, names.FAULT_ECC)]
    engine = AttemptEngine(OnDemand(backoff=0), records, try_number=1, retries=1, backend_name="local")
    step = engine.ended(records[1])
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobFailedError)
    assert not isinstance(step.error, GpuJobInterruptionBudgetError)
    assert "The same GPU hardware fault (ecc) ended attempt 1 too" in str(step.error)
    assert "Airflow will retry it" in str(step.error)
    # two different faults in a row are two node faults
    mixed = [_faulted(1, names.FAULT_ECC), _faulted(2, names.FAULT_XID)]
    engine = AttemptEngine(OnDemand(backoff=0), mixed, try_number=1, backend_name="local")
    assert isinstance(engine.ended(mixed[1]), Submit)


def test_the_node_fault_budget_is_its_own() -> None:
    faults = (names.FAULT_ECC, names.FAULT_XID, names.FAULT_ECC)
    records = [_faulted(i + 1, f) for i, f in enumerate(faults)]
    engine = AttemptEngine(OnDemand(backoff=0, max_node_faults=2), records, try_number=1, backend_name="local")
    step = engine.ended(records[-1])
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobInterruptionBudgetError)
    assert "max_node_faults=2" in str(step.error)


@pytest.mark.parametrize("bad", [-1, 101, 1.5, True, "2"])
def test_max_node_faults_is_validated_like_max_interruptions(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=r"capacity\.max_node_faults=.* must be an integer from 0 to 100"):
        OnDemand(max_node_faults=bad)


# --- the emulators report the service's own node faults ---------------------------------------------


def _ended(backend: Any, handle: JobHandle) -> Any:
    def read() -> Any:
        status = backend.poll([handle])[handle.job_id]
        assert not isinstance(status, Exception), status
        return status if status.state.terminal else None

    return wait_for(read, 60, f"job {handle.job_id} to end")


@pytest.mark.parametrize(
    "row", batch_mapping.NODE_FAULT_TABLE, ids=[r.example[:30] for r in batch_mapping.NODE_FAULT_TABLE]
)
def test_the_batch_emulator_fails_a_host_and_the_backend_reads_a_node_fault(
    batch: BatchWorld, row: batch_mapping.NodeFaultRow
) -> None:
    world = BatchBackendWorld(batch)
    backend = world.backend()
    handle = backend.submit(world.request("host-fault", LONG_JOB))
    wait_for(lambda: backend.poll([handle])[handle.job_id].state is JobState.RUNNING, 60, "the job to run")
    batch.emulator.fail_host(handle.job_id, row.example)
    status = _ended(backend, handle)
    assert (status.state, status.interruption, status.fault) == (JobState.FAILED, names.NODE_FAULT, row.fault)


def test_the_sagemaker_emulator_s_internal_error_is_a_node_fault(sagemaker: SageMakerWorld) -> None:
    world = SageMakerBackendWorld(sagemaker)
    backend = world.backend()
    handle = backend.submit(world.request("internal", LONG_JOB))
    sagemaker.emulator.fail(handle.job_id, sm_mapping.NODE_FAULT_REASONS["InternalServerError:"][1])
    status = _ended(backend, handle)
    assert (status.state, status.interruption, status.fault) == (
        JobState.FAILED,
        names.NODE_FAULT,
        names.FAULT_NODE_UNHEALTHY,
    )


def test_the_kubernetes_emulator_s_unhealthy_gpu_is_a_node_fault_on_its_node(kubernetes: KubernetesWorld) -> None:
    backend = KubernetesBackend()
    identity = JobIdentity(TaskKey("k8s_gpu_fault", "job", "manual__1"), try_number=1, attempt=1, capacity="spot")
    handle = backend.submit(JobRequest(identity, LONG_JOB, {}, GpuResources(), "spot", image="x"))
    wait_state(backend, handle, JobState.RUNNING)
    node = kubernetes.emulator.get("pods", handle.name)["spec"]["nodeName"]  # type: ignore[index]
    kubernetes.emulator.fail_gpu(handle.name)
    status = wait_ended(backend, handle)
    assert (status.state, status.interruption, status.fault) == (
        JobState.FAILED,
        names.NODE_FAULT,
        names.FAULT_NODE_UNHEALTHY,
    )
    assert status.node == node and f"on node {node}" in status.reason


def test_a_batch_job_run_through_the_runtime_helper_reports_the_gpu_fault_in_its_output(batch: BatchWorld) -> None:
    world = BatchBackendWorld(batch)
    backend = world.backend()
    code = "import sys; print('RuntimeError: CUDA error: uncorrectable ECC error encountered', flush=True); sys.exit(1)"
    command = [sys.executable, "-m", "gpu_provider.runtime.launch", "--", sys.executable, "-c", code]
    handle = backend.submit(world.request("ecc", command))
    status = _ended(backend, handle)
    assert (status.state, status.interruption, status.fault) == (JobState.FAILED, names.NODE_FAULT, names.FAULT_ECC)
    assert status.exit_code == names.NODE_FAULT_EXIT_CODES[names.FAULT_ECC]
