"""What Kubernetes' answers mean: one table from a Pod's or a Job's condition to :class:`JobState`.

A pod's phase alone says too little (an unpullable image and a pod waiting for a Karpenter node are
both ``Pending``; a reclaimed spot pod and a crashed program are both ``Failed``), so the remote
state looked up in :data:`STATE_TABLE` is the phase refined by the container's waiting reason, the
pod's ``DisruptionTarget`` condition or its status reason; a Job's is its finished condition, refined
the same way, or the least advanced state of its pods while it runs. Objects are the API's JSON
(plain dicts), never client models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    # taken away from the program: spot reclaim, eviction under node pressure, node drained or gone
    # (which words mean which: :data:`TAKEN_TABLE`)
    "Failed:DisruptionTarget": JobState.PREEMPTED,
    "Failed:Evicted": JobState.PREEMPTED,
    # evicted for the job's own use: past its ephemeral-storage limit, or past its request while the
    # node ran short; a new attempt would do the same, so it is the job's failure, not an interruption
    "Failed:Evicted:OverLimit": JobState.FAILED,
    "Failed:Evicted:OverRequest": JobState.FAILED,
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


@dataclass(frozen=True)
class TakenRow:
    """One way Kubernetes says a pod was taken away, and what it means.

    :param source: where the words are: ``Evicted`` (the pod's ``status.reason``, ``pattern``
        searched in ``status.message``), ``DisruptionTarget:<reason>`` (the pod's condition,
        ``*`` for any reason) or another ``status.reason``
    :param pattern: a regular expression searched in the message (``""``: any message)
    :param remote: the remote state it gives (a key of :data:`STATE_TABLE`)
    :param example: the service's real words, as the kubelet or a controller writes them
    """

    source: str
    pattern: str
    remote: str
    example: str


#: the kubelet's own-usage words (``pkg/kubelet/eviction/helpers.go``): a container past its request
#: under node pressure (``which exceeds its request of``; before Kubernetes 1.2x ``request is ... has
#: larger consumption of``)
_OVER_REQUEST = r"Container \S+ was using \S+?, (?:which exceeds its request of|request is) "

#: every service string this backend maps, first match wins (each row is a test:
#: ``tests/backends/faults/test_classification_kubernetes.py``)
TAKEN_TABLE: tuple[TakenRow, ...] = (
    # the kubelet's limit evictions (no node pressure; no DisruptionTarget condition): the job's own use
    TakenRow(
        "Evicted",
        r"Pod ephemeral local storage usage exceeds the total limit of containers",
        "Failed:Evicted:OverLimit",
        "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
    ),
    TakenRow(
        "Evicted",
        r"Container \S+ exceeded its local ephemeral storage limit",
        "Failed:Evicted:OverLimit",
        'Container main exceeded its local ephemeral storage limit "1Gi". ',
    ),
    TakenRow(
        "Evicted",
        r"Usage of EmptyDir volume \S+ exceeds the limit",
        "Failed:Evicted:OverLimit",
        'Usage of EmptyDir volume "scratch" exceeds the limit "256Mi". ',
    ),
    # node pressure: the kubelet names the containers past their request (the job used more than it asked)
    TakenRow(
        "Evicted",
        _OVER_REQUEST,
        "Failed:Evicted:OverRequest",
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. Container main was "
        "using 30Gi, which exceeds its request of 16Gi. ",
    ),
    TakenRow(
        "Evicted",
        _OVER_REQUEST,
        "Failed:Evicted:OverRequest",
        "The node was low on resource: memory. Container main was using 30Gi, request is 16Gi, has larger "
        "consumption of memory. ",
    ),
    # node pressure with the job inside its requests: the node's problem, an interruption
    TakenRow(
        "Evicted",
        r"The node was low on resource",
        "Failed:Evicted",
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. ",
    ),
    TakenRow(
        "Evicted",
        r"The node had condition",
        "Failed:Evicted",
        "The node had condition: [DiskPressure]. ",
    ),
    TakenRow("Evicted", "", "Failed:Evicted", "Pod was evicted"),
    # DisruptionTarget (Kubernetes >= 1.26): someone else ended the pod
    TakenRow(
        "DisruptionTarget:TerminationByKubelet",
        _OVER_REQUEST,
        "Failed:Evicted:OverRequest",
        "The node was low on resource: memory. Container main was using 30Gi, which exceeds its request of 16Gi. ",
    ),
    TakenRow(
        "DisruptionTarget:TerminationByKubelet",
        "",
        "Failed:DisruptionTarget",
        "Pod was terminated in response to imminent node shutdown.",
    ),
    TakenRow(
        "DisruptionTarget:PreemptionByScheduler",
        "",
        "Failed:DisruptionTarget",
        "default-scheduler: preempting to accommodate a higher priority pod",
    ),
    TakenRow(
        "DisruptionTarget:EvictionByEvictionAPI",
        "",
        "Failed:DisruptionTarget",
        "Eviction API: evicting",  # a drain; Karpenter's disruption (spot interruption, consolidation, expiry)
    ),
    TakenRow(
        "DisruptionTarget:DeletionByTaintManager",
        "",
        "Failed:DisruptionTarget",
        "Taint manager: deleting due to NoExecute taint",
    ),
    TakenRow("DisruptionTarget:DeletionByPodGC", "", "Failed:DisruptionTarget", "PodGC: node no longer exists"),
    TakenRow("DisruptionTarget:*", "", "Failed:DisruptionTarget", "any other disruption"),
    # older kubelets and controllers: a status reason only
    TakenRow("NodeLost", "", "Failed:NodeLost", "Node ip-10-0-1-2 which was running pod p is unresponsive"),
    TakenRow("NodeShutdown", "", "Failed:NodeShutdown", "Pod was rejected as the node is shutting down."),
    TakenRow("Terminated", "", "Failed:Terminated", "Pod was terminated in response to imminent node shutdown."),
)


@dataclass(frozen=True)
class NodeFaultRow:
    """One way Kubernetes says a failed pod's node or GPU was at fault, not the program.

    :param reason: the pod's ``status.reason``
    :param pattern: a regular expression searched in the pod's ``status.message``
    :param fault: the fault kind (:data:`gpu_provider.names.FAULT_KINDS`)
    :param example: the service's real words (the kubelet's device manager)
    """

    reason: str
    pattern: str
    fault: str
    example: str


#: failed pods whose node or GPU device was unhealthy: an interruption of kind ``node_fault``, resubmitted with
#: node anti-affinity to the node it ran on. The main container's termination message (the end of its log
#: with ``terminationMessagePolicy: FallbackToLogsOnError``) is read for the GPU messages of
#: ``gpu_provider.runtime.faults``, and its exit code for the runtime helper's fault exit codes. Each row is a
#: test (``tests/backends/faults/test_node_faults.py``).
NODE_FAULT_TABLE: tuple[NodeFaultRow, ...] = (
    NodeFaultRow(
        "UnexpectedAdmissionError",
        r"unhealthy devices nvidia\.com/gpu",
        names.FAULT_NODE_UNHEALTHY,
        "Allocate failed due to can't allocate unhealthy devices nvidia.com/gpu, which is unexpected",
    ),
    NodeFaultRow(
        "UnexpectedAdmissionError",
        r"devices unavailable for nvidia\.com/gpu",
        names.FAULT_NODE_UNHEALTHY,
        "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, "
        "Available: 0, which is unexpected",
    ),
)


def node_fault(pods: Sequence[Mapping[str, Any]], *, nodes: int = 1) -> tuple[str, str | None] | None:
    """The GPU hardware fault of a failed attempt's pods and the node it happened on (``spec.nodeName``), else
    ``None``: :data:`NODE_FAULT_TABLE`, then the GPU messages in a container's termination message, then
    the runtime helper's fault exit codes."""
    from gpu_provider.runtime.faults import fault_in_line, fault_of_exit_code

    for pod in pods:
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
        for row in NODE_FAULT_TABLE:
            if reason == row.reason and re.search(row.pattern, message):
                return row.fault, node
        terminated = (main_container(pod).get("state") or {}).get("terminated") or {}
        fault = fault_in_line(str(terminated.get("message") or ""), nodes=nodes) or fault_of_exit_code(exit_code(pod))
        if fault is not None:
            return fault, node
    return None


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


def taken_state(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The remote state of a failed pod that was taken away (:data:`TAKEN_TABLE`), with the service's
    words; ``None`` when nothing says so (the program ended by itself)."""
    status = pod.get("status") or {}
    reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
    disrupted = condition(pod, "DisruptionTarget")
    if reason == "Evicted":
        sources = ["Evicted"]
    elif disrupted is not None:
        cause = str(disrupted.get("reason") or "")
        sources = [f"DisruptionTarget:{cause}", "DisruptionTarget:*"]
        message = _words(disrupted.get("message"), message if message != disrupted.get("message") else "")
        reason = "DisruptionTarget"
        if cause:
            reason = f"DisruptionTarget: {cause}"
    else:
        sources = [reason] if reason else []
    for source in sources:
        for row in TAKEN_TABLE:
            if row.source == source and (not row.pattern or re.search(row.pattern, message)):
                return row.remote, _words(reason, message.strip())
    return None


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
        terminated = state.get("terminated") or {}
        taken = taken_state(pod)
        if taken is not None:
            return taken
        reason = str(status.get("reason") or "")
        if reason == "DeadlineExceeded":
            return f"Failed:{reason}", _words(reason, status.get("message"))
        return "Failed", _words(terminated.get("reason"), terminated.get("message"))
    if phase == "Running" and (disrupted := condition(pod, "DisruptionTarget")) is not None:
        return "Running", "being stopped: " + _words(
            "DisruptionTarget", disrupted.get("reason"), disrupted.get("message")
        )
    return phase, str(status.get("reason") or "")


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Failed"


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
            taken = [t for t in (taken_state(p) for p in pods if condition(p, "DisruptionTarget") or _ended(p)) if t]
            own = [t for t in taken if STATE_TABLE.get(t[0]) is JobState.FAILED]
            if own:  # a rank evicted for its own use (past a limit or its request): the job's failure
                return f"Job:{kind}", _words(reason, message, own[0][1])
            disrupted = any(condition(p, "DisruptionTarget") is not None for p in pods)
            if reason == "PodFailurePolicy" and f"rule at index {DISRUPTION_RULE_INDEX}" in message:
                disrupted = True
            if any(STATE_TABLE.get(t[0]) is JobState.PREEMPTED for t in taken):
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
    # a rank that finished its work counts as created (its pod ended Succeeded before the others)
    finished = {rank_of(p) for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"}
    created = len(active) + len(finished - {rank_of(p) for p in active})
    if created < nodes:
        return "Pending", f"{created} of {nodes} pods created"
    if worst is None:  # every rank ended well; the Job controller has not marked it complete yet
        return "Running", f"{len(finished)} of {nodes} ranks finished"
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
