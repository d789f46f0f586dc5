"""Kubernetes failures classified with the service's real strings, both ways.

Every row of :data:`~gpu_provider.backends.kubernetes.mapping.TAKEN_TABLE` (the kubelet's and the
controllers' own words) is a test case; then the fake API server ends running pods with each eviction
shape (:data:`~gpu_provider.testing.emulators.kubernetes_pods.EVICTIONS`) and a poll must say what
the table says: a pod evicted for its own use (past its ephemeral-storage limit, past its request
while the node ran short) is the job's failure, not an interruption that would be resubmitted up to
``max_interruptions`` times; node pressure with the job inside its requests, preemption and
disruption are interruptions.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobIdentity, JobRequest, JobState, TaskKey, map_state
from gpu_provider.backends.kubernetes import STATE_TABLE, KubernetesBackend
from gpu_provider.backends.kubernetes.mapping import (
    TAKEN_TABLE,
    TakenRow,
    interruption_of,
    job_remote_state,
    pod_remote_state,
)
from gpu_provider.job import GpuResources
from gpu_provider.testing.emulators.kubernetes_pods import EVICTIONS
from tests.backends.contract.worlds import LONG_JOB, wait_ended, wait_state
from tests.kubernetes_world import KubernetesWorld

#: what each remote state of a taken pod means for the attempt
OWN = {"Failed:Evicted:OverLimit", "Failed:Evicted:OverRequest"}


def _failed_pod(row: TakenRow) -> dict[str, Any]:
    """A pod that ended ``Failed`` the way ``row`` describes, its words being the row's real example."""
    status: dict[str, Any] = {"phase": "Failed", "conditions": []}
    if row.source.startswith("DisruptionTarget:"):
        cause = row.source.partition(":")[2]
        reason = "SomeFutureReason" if cause == "*" else cause
        status["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": row.example}
        )
    else:
        status.update(reason=row.source, message=row.example)
    terminated = {"exitCode": 137, "reason": "Error"}
    status["containerStatuses"] = [{"name": "main", "state": {"terminated": terminated}}]
    return {"metadata": {"name": "p"}, "spec": {}, "status": status}


@pytest.mark.parametrize("row", TAKEN_TABLE, ids=[f"{r.source}->{r.remote}:{r.example[:40]}" for r in TAKEN_TABLE])
def test_each_row_of_the_table_classifies_the_service_s_words(row: TakenRow) -> None:
    remote, words = pod_remote_state(_failed_pod(row))
    assert remote == row.remote, (row, remote)
    state = map_state(STATE_TABLE, remote, backend="kubernetes")
    if remote in OWN:
        assert state is JobState.FAILED, (row, state)
        assert interruption_of(state, remote, words) is None  # the job's failure: Airflow's retries decide
    else:
        assert state is JobState.PREEMPTED, (row, state)
        assert interruption_of(state, remote, words) == names.PREEMPTED
    assert row.example.strip()[:30] in words, (words, row.example)  # the service's words reach the reason


def test_every_taken_state_of_the_table_is_in_the_state_table() -> None:
    assert {r.remote for r in TAKEN_TABLE} <= set(STATE_TABLE)
    assert {r.remote for r in TAKEN_TABLE} >= OWN


def test_a_plain_failure_and_an_oom_kill_are_the_job_s_own() -> None:
    for terminated in ({"exitCode": 1, "reason": "Error"}, {"exitCode": 137, "reason": "OOMKilled"}):
        pod = {
            "metadata": {"name": "p"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": terminated}}]},
        }
        remote, words = pod_remote_state(pod)
        assert (remote, words) == ("Failed", terminated["reason"])
        assert STATE_TABLE[remote] is JobState.FAILED


def test_a_job_whose_rank_was_evicted_for_its_own_use_failed_and_one_under_pressure_was_preempted() -> None:
    over_limit = _failed_pod(next(r for r in TAKEN_TABLE if r.remote == "Failed:Evicted:OverLimit"))
    over_request = _failed_pod(
        next(r for r in TAKEN_TABLE if r.remote == "Failed:Evicted:OverRequest" and "DisruptionTarget" in r.source)
    )
    pressure = _failed_pod(
        next(r for r in TAKEN_TABLE if r.source == "DisruptionTarget:TerminationByKubelet" and not r.pattern)
    )
    rule = "Pod default/j-1-abcde has condition DisruptionTarget matching FailJob rule at index 0"
    job = {
        "metadata": {"name": "j"},
        "spec": {"completions": 2},
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": rule}]},
    }
    assert STATE_TABLE[job_remote_state(job, [over_limit])[0]] is JobState.FAILED
    remote, words = job_remote_state(job, [over_request])
    assert STATE_TABLE[remote] is JobState.FAILED and "exceeds its request" in words, (remote, words)
    assert STATE_TABLE[job_remote_state(job, [pressure])[0]] is JobState.PREEMPTED


#: eviction shape of the emulator -> (state, interruption) a poll must report
EXPECTED = {
    "pod-storage-limit": (JobState.FAILED, None),
    "container-storage-limit": (JobState.FAILED, None),
    "emptydir-limit": (JobState.FAILED, None),
    "memory-over-request": (JobState.FAILED, None),
    "memory-pressure": (JobState.PREEMPTED, names.PREEMPTED),
    "disk-pressure": (JobState.PREEMPTED, names.PREEMPTED),
    "node-shutdown": (JobState.PREEMPTED, names.PREEMPTED),
    "preemption": (JobState.PREEMPTED, names.PREEMPTED),
    "taint-manager": (JobState.PREEMPTED, names.PREEMPTED),
    "eviction-api": (JobState.PREEMPTED, names.PREEMPTED),
}


def test_every_eviction_shape_of_the_emulator_has_an_expectation() -> None:
    assert set(EXPECTED) == set(EVICTIONS)


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_a_pod_evicted_by_the_service_is_classified_from_its_words(kubernetes: KubernetesWorld, shape: str) -> None:
    backend = KubernetesBackend()
    identity = JobIdentity(TaskKey("k8s_evict", shape, "manual__1"), try_number=1, attempt=1, capacity="spot")
    handle = backend.submit(JobRequest(identity, LONG_JOB, {}, GpuResources(), "spot", image="x"))
    wait_state(backend, handle, JobState.RUNNING)
    kubernetes.emulator.evict(handle.name, shape)
    status = wait_ended(backend, handle)
    state, interruption = EXPECTED[shape]
    assert (status.state, status.interruption) == (state, interruption), status
    _reason, message, _cause = EVICTIONS[shape]
    assert message.strip()[:30] in status.reason, status.reason


@pytest.mark.parametrize(
    ("shape", "state"),
    [
        ("pod-storage-limit", JobState.FAILED),
        ("memory-over-request", JobState.FAILED),  # before: PREEMPTED (its DisruptionTarget matched rule 0)
        ("memory-pressure", JobState.PREEMPTED),
    ],
)
def test_a_gang_with_an_evicted_rank_fails_or_is_preempted_by_the_eviction_s_words(
    kubernetes: KubernetesWorld, shape: str, state: JobState
) -> None:
    backend = KubernetesBackend()
    identity = JobIdentity(TaskKey("k8s_evict_gang", shape, "manual__1"), try_number=1, attempt=1, capacity="spot")
    handle = backend.submit(JobRequest(identity, LONG_JOB, {}, GpuResources(nodes=2), "spot", image="x"))
    wait_state(backend, handle, JobState.RUNNING)
    (rank_1,) = [
        p["metadata"]["name"]
        for p in kubernetes.emulator.objects("pods")
        if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "1"
    ]
    kubernetes.emulator.evict(rank_1, shape)
    status = wait_ended(backend, handle)
    assert status.state is state, status
    assert status.interruption == (names.PREEMPTED if state is JobState.PREEMPTED else None), status
