"""What Kubernetes' answers mean: one table from a Pod's or a Job's condition to :class:`JobState`.

A pod's phase alone says too little (an unpullable image and a pod waiting for a Karpenter node are
both ``Pending``; a reclaimed spot pod and a crashed program are both ``Failed``), so the remote
state looked up in :data:`STATE_TABLE` is the phase refined by the container's waiting reason, the
pod's ``DisruptionTarget`` condition or its status reason; a Job's is its finished condition, refined
the same way, or the least advanced state of its pods while it runs. Objects are the API's JSON
(plain dicts), never client models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import JobState
from gpu_provider.backends.kubernetes.manifests import (
    COMPLETION_INDEX,
    CONTAINER,
    DISRUPTION_RULE_INDEX,
)

#: the remote states (``<phase>[:<refinement>]``, ``Job:<condition>[:<refinement>]``) and what they mean
STATE_TABLE: dict[str, JobState] = {
    # Pending: waiting for a node (Karpenter launches one for an unschedulable pod), then for the container
    "Pending": JobState.QUEUED,
    "Pending:Unschedulable": JobState.QUEUED,
    "Pending:ContainerCreating": JobState.STARTING,
    "Pending:PodInitializing": JobState.STARTING,
    # can never start: the attempt fails with the reason instead of waiting forever
    "Pending:ErrImagePull": JobState.FAILED,
    "Pending:ImagePullBackOff": JobState.FAILED,
    "Pending:InvalidImageName": JobState.FAILED,
    "Pending:CreateContainerConfigError": JobState.FAILED,
    "Pending:CreateContainerError": JobState.FAILED,
    "Running": JobState.RUNNING,
    # the node stopped reporting; the pod still holds its GPU until the node is declared gone
    "Unknown": JobState.RUNNING,
    "Succeeded": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "Failed:DeadlineExceeded": JobState.FAILED,
    # taken away from the program: spot reclaim, eviction, node drained or gone
    "Failed:DisruptionTarget": JobState.PREEMPTED,
    "Failed:Evicted": JobState.PREEMPTED,
    "Failed:NodeLost": JobState.PREEMPTED,
    "Failed:NodeShutdown": JobState.PREEMPTED,
    "Failed:Terminated": JobState.PREEMPTED,
    # deleted by this provider (the object carries the reason until it is gone; then an Event does)
    "Deleted": JobState.CANCELLED,
    "Job:Suspended": JobState.QUEUED,
    "Job:Complete": JobState.SUCCEEDED,
    "Job:SuccessCriteriaMet": JobState.SUCCEEDED,
    "Job:Failed": JobState.FAILED,
    "Job:Failed:DeadlineExceeded": JobState.FAILED,
    "Job:Failed:DisruptionTarget": JobState.PREEMPTED,
    "Job:FailureTarget": JobState.FAILED,
    "Job:FailureTarget:DisruptionTarget": JobState.PREEMPTED,
}

#: pod status reasons that mean the node or the pod was taken away (not the program's fault)
_TAKEN_REASONS = ("Evicted", "NodeLost", "NodeShutdown", "Terminated")
#: annotation set by :meth:`KubernetesBackend.cancel` before it deletes an object
CANCEL_ANNOTATION = names.TAG_PREFIX + "cancel-reason"
#: Event reasons of this provider's tombstones: what a poll reads once the object is gone
EVENT_CANCELLED = "GpuProviderCancelled"
EVENT_FAILED = "GpuProviderFailed"

_ORDER = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)


def parse_time(text: Any) -> float | None:
    """An RFC 3339 time of the API (``2026-12-04T02:00:00Z``) as Unix time."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and str(cond.get("status")) == "True":
            return cond  # type: ignore[no-any-return]
    return None


def main_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == CONTAINER:
            return status  # type: ignore[no-any-return]
    return statuses[0] if statuses else {}


def pod_remote_state(pod: Mapping[str, Any]) -> tuple[str, str]:
    """The pod's remote state (a key of :data:`STATE_TABLE`) and the service's words about it."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    meta = pod.get("metadata") or {}
    cancel = (meta.get("annotations") or {}).get(CANCEL_ANNOTATION)
    container = main_container(pod)
    state = container.get("state") or {}
    if cancel and phase not in ("Succeeded", "Failed"):
        return "Deleted", str(cancel)
    if phase == "Pending":
        waiting = state.get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason:
            return f"Pending:{reason}", str(waiting.get("message") or reason)
        scheduled = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"),
            None,
        )
        if scheduled and str(scheduled.get("status")) == "False":
            return "Pending:Unschedulable", _words(scheduled.get("reason") or "Unschedulable", scheduled.get("message"))
        if (pod.get("spec") or {}).get("nodeName"):
            return "Pending:ContainerCreating", "ContainerCreating"
        return "Pending", "waiting to be scheduled"
    if phase == "Failed":
        disrupted = condition(pod, "DisruptionTarget")
        terminated = state.get("terminated") or {}
        if disrupted is not None:
            return "Failed:DisruptionTarget", _words(
                "DisruptionTarget", disrupted.get("reason"), disrupted.get("message")
            )
        reason = str(status.get("reason") or "")
        if reason in _TAKEN_REASONS or reason == "DeadlineExceeded":
            return f"Failed:{reason}", _words(reason, status.get("message"))
        return "Failed", _words(terminated.get("reason"), terminated.get("message"))
    if phase == "Running" and (disrupted := condition(pod, "DisruptionTarget")) is not None:
        return "Running", "being stopped: " + _words(
            "DisruptionTarget", disrupted.get("reason"), disrupted.get("message")
        )
    return phase, str(status.get("reason") or "")


def _words(*parts: Any) -> str:
    return ": ".join(str(p) for p in parts if p)


def exit_code(pod: Mapping[str, Any]) -> int | None:
    terminated = (main_container(pod).get("state") or {}).get("terminated") or {}
    code = terminated.get("exitCode")
    return int(code) if code is not None else None


def pod_times(pod: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """When the main container started running and when it ended."""
    state = main_container(pod).get("state") or {}
    running = state.get("running") or {}
    terminated = state.get("terminated") or {}
    started = parse_time(running.get("startedAt") or terminated.get("startedAt"))
    return started, parse_time(terminated.get("finishedAt"))


def rank_of(pod: Mapping[str, Any]) -> int:
    meta = pod.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)
    return int(str(text)) if str(text or "").isdigit() else 0


def job_remote_state(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """A Job's remote state from its conditions, else (while it runs) from its pods."""
    meta = job.get("metadata") or {}
    cancel = (meta.get("annotations") or {}).get(CANCEL_ANNOTATION)
    for kind in ("Failed", "FailureTarget"):
        cond = condition(job, kind)
        if cond is not None:
            reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
            disrupted = any(condition(p, "DisruptionTarget") is not None for p in pods)
            if reason == "PodFailurePolicy" and f"rule at index {DISRUPTION_RULE_INDEX}" in message:
                disrupted = True
            if disrupted:
                return f"Job:{kind}:DisruptionTarget", _words(reason, message)
            if reason == "DeadlineExceeded":
                return f"Job:{kind}:DeadlineExceeded", _words(reason, message)
            if cancel:
                return "Deleted", str(cancel)
            return f"Job:{kind}", _words(reason, message)
    for kind in ("Complete", "SuccessCriteriaMet"):
        if condition(job, kind) is not None:
            return f"Job:{kind}", ""
    if cancel:
        return "Deleted", str(cancel)
    if (job.get("spec") or {}).get("suspend"):
        return "Job:Suspended", "suspended"
    # running: the least advanced of its pods (a gang runs once every rank runs)
    nodes = int((job.get("spec") or {}).get("completions") or 1)
    worst: tuple[int, str, str] | None = None
    active = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running", "Unknown", None)]
    for pod in active:
        remote, why = pod_remote_state(pod)
        state = STATE_TABLE.get(remote, JobState.QUEUED)
        if state is JobState.FAILED:  # a rank that can never start: the whole job cannot
            return remote, f"rank {rank_of(pod)}: {why}"
        order = _ORDER.index(state) if state in _ORDER else 0
        if worst is None or order < worst[0]:
            worst = (order, remote, f"rank {rank_of(pod)}: {why}" if why else "")
    if worst is None or len(active) < nodes:
        return "Pending", f"{len(active)} of {nodes} pods created"
    return worst[1], worst[2]


def interruption_of(state: JobState, remote: str, reason: str) -> str | None:
    """The interruption kind of an ended attempt (``None``: the job's own outcome)."""
    if state is JobState.PREEMPTED:
        return names.PREEMPTED
    if state is JobState.CANCELLED and reason.startswith(names.CAPACITY_TIMEOUT_MARK):
        return names.CAPACITY_TIMEOUT
    if state is JobState.CANCELLED and reason.startswith(names.CANCEL_PREFIX + names.CAPACITY_TIMEOUT_MARK):
        return names.CAPACITY_TIMEOUT
    return None
