"""What AWS Batch's answers mean: its job states, status reasons and job fields, read into a
:class:`~gpu_provider.backends.base.JobStatus`. Pure functions, no client.

States (one table, :data:`STATE_TABLE`): SUBMITTED, PENDING and RUNNABLE are ``QUEUED``; STARTING,
RUNNING, SUCCEEDED and FAILED map to themselves. A FAILED job is read further by :func:`refine_failure`:

* its status reason starts with :data:`~gpu_provider.names.CANCEL_PREFIX` (this provider terminated
  it): ``CANCELLED``, with ``interruption="capacity_timeout"`` when the reason goes on with
  :data:`~gpu_provider.names.CAPACITY_TIMEOUT_MARK` (it gave up waiting for capacity); a job the
  queue's own ``jobStateTimeLimitActions`` cancelled for ``CAPACITY:...`` reads the same way;
* its status reason, or its last attempt's, matches :data:`PREEMPTION_PATTERNS` (the host was
  terminated or reclaimed, e.g. ``Host EC2 (instance i-0abc) terminated.``): ``PREEMPTED``
  (``interruption="preempted"``);
* anything else (the container exited non-zero, the attempt timed out): ``FAILED``.

A RUNNABLE job is ``QUEUED`` with Batch's status reason (``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY
- ...``). Reading it never changes it: where the reason says the job can never start as submitted
(:data:`RUNNABLE_REASONS`, verdict :data:`FATAL`), the status carries ``never_starts`` and only the
task that owns the job acts on it (it terminates the job and fails); a reason an administrator can
fix (:data:`WAIT`) waits out the task's ``queue_timeout`` or spot wait like any queued job.

Batch has no structured "spot interruption" field; the status reason is what its own
``evaluateOnExit`` retry rules match on (``onStatusReason: "Host EC2*"``), and so do we.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpu_provider import names
from gpu_provider.backends.base import JobState

#: Batch job states and what they mean for the operator (FAILED is refined by :func:`refine_failure`)
STATE_TABLE: dict[str, JobState] = {
    "SUBMITTED": JobState.QUEUED,
    "PENDING": JobState.QUEUED,
    "RUNNABLE": JobState.QUEUED,
    "STARTING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
}

#: status reasons meaning the host went away under the job (spot reclaim, instance terminated):
#: the attempt is PREEMPTED and resumes from its checkpoint instead of failing the task
PREEMPTION_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^Host EC2 \(instance [^)]*\) terminated", re.IGNORECASE),
    re.compile(r"spot instance .*(interrupt|reclaim|terminat)", re.IGNORECASE),
    re.compile(r"^Task failed to start.*(instance|host).*(terminat|reclaim)", re.IGNORECASE),
)


@dataclass(frozen=True)
class NodeFaultRow:
    """One way AWS Batch (or the container runtime under it) says the host or its GPU failed.

    :param pattern: searched in the job's, the last attempt's and the container's status reason
    :param fault: the fault kind (:data:`gpu_provider.names.FAULT_KINDS`)
    :param example: the service's real words
    """

    pattern: re.Pattern[str]
    fault: str
    example: str


#: status and container reasons meaning the host or its GPU failed, not the job: an interruption of kind
#: ``node_fault`` (resubmitted; Batch places the new attempt on whichever instance is free, a fresh one
#: when the faulty host was taken out). Each row is a test (``tests/backends/faults/test_node_faults.py``);
#: the runtime helper's fault exit codes (``names.NODE_FAULT_EXIT_CODES``) count too.
NODE_FAULT_TABLE: tuple[NodeFaultRow, ...] = (
    NodeFaultRow(
        re.compile(r"nvidia-container-cli: (initialization|detection|device) error", re.IGNORECASE),
        names.FAULT_NODE_UNHEALTHY,
        "CannotStartContainerError: Error response from daemon: OCI runtime create failed: ... error running "
        "hook: exit status 1, stdout: , stderr: nvidia-container-cli: initialization error: nvml error: driver "
        "not loaded: unknown",
    ),
    NodeFaultRow(
        re.compile(r"^DockerTimeoutError:", re.IGNORECASE),
        names.FAULT_NODE_UNHEALTHY,
        "DockerTimeoutError: Could not transition to started; timed out after waiting 3m0s",
    ),
    NodeFaultRow(
        re.compile(r"^CannotInspectContainerError:", re.IGNORECASE),
        names.FAULT_NODE_UNHEALTHY,
        "CannotInspectContainerError: Could not transition to inspecting; timed out after waiting 30s",
    ),
)


def node_fault(job: Mapping[str, Any]) -> str | None:
    """The GPU hardware fault a FAILED job's reasons (:data:`NODE_FAULT_TABLE`) or the runtime helper's exit
    code report, else ``None``."""
    from gpu_provider.runtime.faults import fault_of_exit_code

    attempts = job.get("attempts") or []
    last = attempts[-1] if attempts else {}
    reasons = [
        str(job.get("statusReason") or ""),
        str(last.get("statusReason") or ""),
        str((last.get("container") or job.get("container") or {}).get("reason") or ""),
    ]
    for reason in reasons:
        for row in NODE_FAULT_TABLE:
            if reason and row.pattern.search(reason):
                return row.fault
    return fault_of_exit_code(exit_code(job))


#: the reason this provider gives TerminateJob starts with this; a job that ended with it is CANCELLED
CANCEL_PREFIX = names.CANCEL_PREFIX


#: how Batch words the status reason of a job its queue's ``jobStateTimeLimitActions`` cancelled
#: (``...due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY``)
QUEUE_ACTION_PREFIX = "Terminated by JobStateTimeLimit action due to reason: "


#: verdicts of :data:`RUNNABLE_REASONS`: the job as submitted can never start (its owner stops it
#: and fails), or it waits (the reason may clear by itself or by an administrator's fix)
FATAL = "fatal"
WAIT = "wait"

#: the reasons Batch gives a RUNNABLE job blocking its queue (``statusReason``, as in Batch's "Jobs
#: stuck in a RUNNABLE status"), by prefix, longest match first, and what each means for the job's
#: owner. Only a reason that this job can never start as submitted is fatal; a limit or permission an
#: administrator can change, and capacity, wait (the task's ``queue_timeout`` or spot wait applies).
#: A reason not listed waits too: nothing destructive on a guess.
RUNNABLE_REASONS: tuple[tuple[str, str], ...] = (
    # no instance type of the queue's compute environments is big enough for the job (vCPU/memory/GPU)
    ("MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT", FATAL),
    # the compute environments' maxvCpus is below the job's needs: an administrator can raise it
    ("MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE", WAIT),
    # the Batch service role lacks a permission: an administrator can grant it
    ("MISCONFIGURATION:SERVICE_ROLE_PERMISSIONS", WAIT),
    # no capacity of the instance types now (spot or on-demand): it may come
    ("CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY", WAIT),
    ("CAPACITY:", WAIT),
    # a misconfiguration Batch may name in a later version: not known to be permanent
    ("MISCONFIGURATION:", WAIT),
)

#: after :data:`CANCEL_PREFIX`: the owning task terminated a job that could never start; it reads FAILED
UNRUNNABLE_MARK = names.UNRUNNABLE_MARK


def runnable_verdict(status_reason: str) -> str:
    """:data:`FATAL` or :data:`WAIT` for a RUNNABLE job's status reason (:data:`RUNNABLE_REASONS`)."""
    for prefix, verdict in sorted(RUNNABLE_REASONS, key=lambda row: -len(row[0])):
        if status_reason.startswith(prefix):
            return verdict
    return WAIT


def unrunnable(job: Mapping[str, Any]) -> str | None:
    """The status reason of a RUNNABLE job that can never start as submitted (verdict :data:`FATAL`), else
    ``None``. Other reasons (``CAPACITY:...``, a limit an administrator can raise) keep the job waiting,
    with the reason shown, until the task's queue timeout or spot wait runs out."""
    reason = str(job.get("statusReason") or "")
    return reason if job.get("status") == "RUNNABLE" and runnable_verdict(reason) == FATAL else None


def unrunnable_reason(status_reason: str) -> str:
    """What a person reads about a job its owner terminated because it could never start."""
    return (
        f"AWS Batch cannot run this job: {status_reason}. Fix the job's resources (gpus, cpu, memory) or the "
        "compute environments behind its job queue; the task that owned the job terminated it instead of "
        "letting it wait in the queue forever."
    )


def is_preemption(reason: str) -> bool:
    """Whether a Batch status reason says the host was terminated or reclaimed under the job."""
    return any(p.search(reason) for p in PREEMPTION_PATTERNS)


def refine_failure(job: Mapping[str, Any]) -> tuple[JobState, str, str | None]:
    """FAILED -> CANCELLED (we terminated it), PREEMPTED (host reclaimed) or FAILED.

    :return: the state, the reason, and the interruption kind (:data:`gpu_provider.names.INTERRUPTION_KINDS`)
        for an attempt that ended without the job's own fault, else ``None``
    """
    reason = str(job.get("statusReason") or "")
    if reason.startswith(CANCEL_PREFIX):
        ours = reason[len(CANCEL_PREFIX) :]
        if ours.startswith(UNRUNNABLE_MARK):
            return JobState.FAILED, unrunnable_reason(ours[len(UNRUNNABLE_MARK) :]), None
        # a cancel that gave up waiting for capacity is an interruption (charged to the policy's budget),
        # also when only a later lookup finds it (the worker crashed before it saved the outcome)
        interruption = names.CAPACITY_TIMEOUT if ours.startswith(names.CAPACITY_TIMEOUT_MARK) else None
        return JobState.CANCELLED, ours, interruption
    if reason.startswith(QUEUE_ACTION_PREFIX) and reason[len(QUEUE_ACTION_PREFIX) :].startswith("CAPACITY:"):
        # the queue's own jobStateTimeLimitActions gave up waiting for capacity
        return JobState.CANCELLED, reason, names.CAPACITY_TIMEOUT
    attempts = job.get("attempts") or []
    last = attempts[-1] if attempts else {}
    candidates = [reason, str(last.get("statusReason") or ""), str((last.get("container") or {}).get("reason") or "")]
    for candidate in candidates:
        if candidate and is_preemption(candidate):
            return JobState.PREEMPTED, candidate, names.PREEMPTED
    container_reason = str((last.get("container") or job.get("container") or {}).get("reason") or "")
    details = [r for r in (reason, container_reason) if r]
    if "attempt duration exceeded timeout" in reason.lower():
        details.append("the attempt ran past max_runtime (timeout.attemptDurationSeconds)")
    said = "; ".join(dict.fromkeys(details)) or "no reason given"
    fault = node_fault(job)
    if fault is not None:  # the host or its GPU failed, not the job
        return JobState.FAILED, f"{said} (GPU hardware fault: {fault})", names.NODE_FAULT
    # the exit code is reported separately (JobStatus.exit_code)
    return JobState.FAILED, said, None


def exit_code(job: Mapping[str, Any]) -> int | None:
    """The container's exit code (of the last attempt, else of the job), if Batch reported one."""
    attempts = job.get("attempts") or []
    for source in ((attempts[-1].get("container") if attempts else None), job.get("container")):
        if source and source.get("exitCode") is not None:
            return int(source["exitCode"])
    return None


def seconds_from_ms(value: Any) -> float | None:
    """Batch's epoch milliseconds as Unix seconds (``None`` for absent or zero)."""
    return float(value) / 1000.0 if value else None


def job_gpus(job: Mapping[str, Any]) -> float:
    """Total GPUs of a described job (all nodes)."""

    def gpus_of(container: Mapping[str, Any] | None) -> float:
        for req in (container or {}).get("resourceRequirements") or []:
            if req.get("type") == "GPU":
                return float(req.get("value") or 0)
        return 0.0

    if job.get("nodeProperties"):
        ranges = job["nodeProperties"].get("nodeRangeProperties") or []
        per_node = gpus_of(ranges[0].get("container")) if ranges else 0.0
        return per_node * job_nodes(job)
    return gpus_of(job.get("container"))


def tag_number(tags: Mapping[str, Any], key: str) -> float | None:
    """A numeric tag value, ``None`` when absent or not a number."""
    try:
        return float(tags[key])
    except (KeyError, TypeError, ValueError):
        return None


def job_nodes(job: Mapping[str, Any]) -> int:
    """Number of nodes of a described job (1 for a single-node job)."""
    props = job.get("nodeProperties") or {}
    return int(props.get("numNodes") or 1)


def definition_name(job: Mapping[str, Any]) -> str | None:
    """The job definition's name (without revision) of a described job."""
    arn = str(job.get("jobDefinition") or "")
    # arn:aws:batch:<region>:<account>:job-definition/<name>:<revision>
    return arn.rpartition("/")[2].rpartition(":")[0] or None


def console_log_url(region: str, group: str, stream: str | None = None, *, stream_prefix: str | None = None) -> str:
    """A CloudWatch console link to a log stream (or to a log group filtered by stream prefix)."""

    def enc(text: str) -> str:
        # the console's fragment encoding: URL-encode twice, then '%' -> '$'
        return quote(quote(text, safe=""), safe="").replace("%", "$")

    base = f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
    if stream:
        return f"{base}{enc(group)}/log-events/{enc(stream)}"
    suffix = "$3FlogStreamNameFilter$3D" + enc(stream_prefix) if stream_prefix else ""
    return f"{base}{enc(group)}{suffix}"
