"""What a poll reads and answers: the LISTs that fetch the attempts' pods and Jobs, and an attempt's
Pod or Job with its pods as a :class:`JobStatus` (times, GPU-seconds, exit code, node faults, the
startup timeout's verdict), or the tombstone of one that is gone."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus, map_state
from gpu_provider.backends.kubernetes.manifests import (
    CONTAINER,
    JOB,
    LABEL_ATTEMPT_NAME,
    MANAGED_BY,
    MANAGER,
    POD,
    kind_of,
)
from gpu_provider.backends.kubernetes.mapping import (
    EVENT_CANCELLED,
    EVENT_FAILED,
    STATE_TABLE,
    condition,
    exit_code,
    interruption_of,
    job_remote_state,
    node_fault,
    parse_time,
    pod_remote_state,
    pod_times,
)
from gpu_provider.backends.kubernetes.objects import ACTIVE_PODS
from gpu_provider.backends.kubernetes.ownership import tombstones

if TYPE_CHECKING:
    from gpu_provider.backends.kubernetes.objects import Objects

#: a poll of at most this many attempts selects their pods by label; more share one LIST of active pods
FEW_ATTEMPTS = 20


def fetch(
    objects: Objects, handles: Sequence[JobHandle]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """The pods of ``handles`` by attempt name, and the Jobs of the multi-node ones by name.

    Up to :data:`FEW_ATTEMPTS` attempts: one LIST of their pods by the attempt's label. More: one LIST
    of this provider's active pods in the namespace, however many, plus one LIST by label of the
    attempts not among them (those that ended since the last tick). Multi-node attempts add one LIST
    of their Jobs and of their pods (a rank that finished is no longer active)."""
    wanted = sorted({h.name for h in handles})
    multi = sorted({h.name for h in handles if h.extra.get("kind") == JOB})
    by_attempt: dict[str, dict[str, dict[str, Any]]] = {}

    def keep(pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            meta = pod.get("metadata") or {}
            label = (meta.get("labels") or {}).get(LABEL_ATTEMPT_NAME)
            if label:
                by_attempt.setdefault(str(label), {})[str(meta.get("name"))] = pod

    if len(wanted) <= FEW_ATTEMPTS:
        keep(objects.by_attempt(POD, wanted))
    else:
        keep(objects.select(POD, f"{MANAGED_BY}={MANAGER}", fields=ACTIVE_PODS))
        missing = [n for n in wanted if n not in by_attempt or n in multi]
        keep(objects.by_attempt(POD, missing))
    jobs = {str(j["metadata"]["name"]): j for j in objects.by_attempt(JOB, multi)} if multi else {}
    grouped = {name: list(pods.values()) for name, pods in by_attempt.items()}
    return grouped, jobs


def attempt_status(
    handle: JobHandle,
    by_attempt: Mapping[str, list[dict[str, Any]]],
    jobs: Mapping[str, dict[str, Any]],
    *,
    objects: Objects,
    startup_timeout: float,
    log_url: str | None,
    backend: str,
) -> JobStatus:
    """The status of ``handle`` from what :func:`fetch` read (a gone object: from its tombstone).

    A read changes nothing: a pod that can never start, or one past ``startup_timeout``, is reported
    with ``never_starts`` set, and the task that owns the attempt deletes it."""
    kind = kind_of(handle)
    pods = by_attempt.get(handle.name, [])
    if kind == JOB:
        job = jobs.get(handle.name)
        if job is None:
            return gone(objects, handle)
        obj: Mapping[str, Any] = job
        remote, reason = job_remote_state(job, pods)
    else:
        bare = [p for p in pods if p["metadata"]["name"] == handle.name]
        if not bare:
            return gone(objects, handle)
        obj = bare[0]
        remote, reason = pod_remote_state(obj)
    state = map_state(STATE_TABLE, remote, backend=backend)
    interruption = interruption_of(state, remote, reason)
    created = parse_time((obj.get("metadata") or {}).get("creationTimestamp")) or handle.submitted_at
    waited = time.time() - created
    stop: str | None = None
    if state is JobState.FAILED and remote.startswith("Pending:"):
        stop = (
            f"its container can never start ({remote.partition(':')[2]}: {reason}); the attempt fails "
            "instead of waiting (check the image name, the pull secrets and the Secrets it refers to)"
        )
        reason = stop
    elif state is JobState.QUEUED and waited > startup_timeout:
        stop = names.CAPACITY_TIMEOUT_MARK + (
            f"no node for {waited:.0f}s, past startup_timeout={startup_timeout:g}s ({reason})"
        )
        state, reason, interruption = JobState.CANCELLED, stop, names.CAPACITY_TIMEOUT
    elif state is JobState.STARTING and waited > startup_timeout:
        stop = f"not running {waited:.0f}s after creation, past startup_timeout={startup_timeout:g}s ({reason})"
        state, reason = JobState.FAILED, stop
    status = status_of(handle, obj, pods, state, reason, interruption, remote, log_url=log_url)
    if state is JobState.FAILED and interruption is None and stop is None:
        members = pods if kind == JOB else [obj]
        found = node_fault(members, nodes=int(handle.extra.get("nodes") or 1))
        if found is not None:  # the node or its GPU failed, not the program
            fault, node = found
            on = f" on node {node}" if node else ""
            status = replace(
                status,
                reason=f"{reason} (GPU hardware fault{on}: {fault})",
                interruption=names.NODE_FAULT,
                fault=fault,
                node=node,
            )
    if stop is not None and not (obj.get("metadata") or {}).get("deletionTimestamp"):
        # a read changes nothing: the verdict is reported, and the task that owns the attempt deletes it
        status = replace(status, never_starts=stop)
    return status


def status_of(
    handle: JobHandle,
    obj: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    state: JobState,
    reason: str,
    interruption: str | None,
    remote: str,
    *,
    log_url: str | None,
) -> JobStatus:
    """The :class:`JobStatus` of the Pod or Job ``obj`` (and ``pods``, a Job's) in ``state``: start and end
    times from the pods (a Job's from its finished condition), GPU-seconds, exit code, owner labels."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    members = pods if handle.extra.get("kind") == JOB else [obj]
    starts = [t for t in (pod_times(p)[0] for p in members) if t is not None]
    ends = [t for t in (pod_times(p)[1] for p in members) if t is not None]
    started = min(starts) if starts else None
    ended = (max(ends) if ends else None) if state.terminal else None
    if state.terminal and handle.extra.get("kind") == JOB:
        for kind in ("Complete", "Failed"):
            cond = condition(obj, kind)
            if cond is not None:
                ended = parse_time(cond.get("lastTransitionTime")) or ended
    if state.terminal and ended is None and started is not None:
        ended = time.time()
    if started is not None and ended is not None and ended < started:
        ended = started
    gpus = float(handle.extra.get("gpus") or 1) * int(handle.extra.get("nodes") or 1)
    gpu_seconds = gpus * max(0.0, (ended or time.time()) - started) if started else 0.0
    code = None
    failed = [p for p in members if exit_code(p) not in (None, 0)]
    if state is JobState.SUCCEEDED:
        code = 0
    elif failed:
        code = exit_code(failed[0])
    elif state is JobState.FAILED and members:
        code = exit_code(members[0])
    if state is JobState.FAILED and remote == "Failed" and not reason:
        reason = f"container {CONTAINER} ended"  # the exit code is reported apart (JobStatus.exit_code)
    owner = str(labels.get(names.TAG_OWNER_TRY) or "")
    node_capacity = None
    for pod in members:
        node_capacity = ((pod.get("spec") or {}).get("nodeSelector") or {}).get("karpenter.sh/capacity-type")
    return JobStatus(
        state=state,
        reason=reason,
        exit_code=code,
        started_at=started,
        ended_at=ended,
        gpu_seconds=gpu_seconds,
        interruption=interruption,
        capacity=str(node_capacity or handle.capacity),
        owner_try=int(owner) if owner.isdigit() else None,
        collected=str(labels.get(names.TAG_COLLECTED) or "").lower() == "true",
        log_url=log_url,
    )


def gone(objects: Objects, handle: JobHandle) -> JobStatus:
    """A Pod or Job that no longer exists: deleted by this provider (an Event says why), else lost."""
    kind = kind_of(handle)
    for event in tombstones(objects, handle.name):
        message = str(event.get("message") or "")
        if event.get("reason") == EVENT_CANCELLED:
            text = message.removeprefix(names.CANCEL_PREFIX)
            if text.startswith(names.UNRUNNABLE_MARK):  # its owner deleted it because it could never start
                return JobStatus(
                    state=JobState.FAILED, reason=text[len(names.UNRUNNABLE_MARK) :], capacity=handle.capacity
                )
            return JobStatus(
                state=JobState.CANCELLED,
                reason=text,
                interruption=interruption_of(JobState.CANCELLED, "Deleted", text),
                capacity=handle.capacity,
            )
        if event.get("reason") == EVENT_FAILED:
            return JobStatus(state=JobState.FAILED, reason=message, capacity=handle.capacity)
    return JobStatus(
        state=JobState.FAILED,
        reason=(
            f"Kubernetes no longer knows {kind} {objects.namespace}/{handle.name} (deleted by someone else, its "
            "node's removal or garbage collection): how it ended cannot be known. Treated as lost: the capacity "
            "policy decides whether a new attempt runs, resuming from the latest checkpoint."
        ),
        interruption=names.LOST,
        capacity=handle.capacity,
    )
