"""What SageMaker's answers mean, and which instance runs a job. Pure functions, no client.

**States** (one table, :data:`STATE_TABLE`), keyed by ``TrainingJobStatus/SecondaryStatus``:

==============================================================  ===========  ======================================
DescribeTrainingJob                                             JobState     notes
==============================================================  ===========  ======================================
InProgress/Starting, Pending, LaunchingMLInstances              QUEUED       waiting for instances (the spot wait)
InProgress/Interrupted, Restarting                              QUEUED       managed spot reclaimed the instances:
                                                                             SageMaker restarts the job itself
                                                                             (``JobStatus.restarts`` + 1)
InProgress/PreparingTrainingStack, Downloading,                 STARTING
DownloadingTrainingImage
InProgress/Training, Uploading, Updating                        RUNNING
Stopping/Stopping (any secondary)                               RUNNING      still billing until Stopped
Completed/Completed                                             SUCCEEDED
Failed/Failed                                                   FAILED       ``FailureReason`` and the exit code
Stopped/Stopped                                                 CANCELLED    by this provider (its stop mark) or
                                                                             by someone else (said so)
Stopped/MaxRuntimeExceeded                                      FAILED       ran past ``max_runtime``
Stopped/MaxWaitTimeExceeded, Failed/MaxWaitTimeExceeded         CANCELLED    ``interruption="capacity_timeout"``:
                                                                             spot capacity never came in time
Stopped/Interrupted, Failed/Interrupted                         PREEMPTED    ended by a reclaim it could not
                                                                             restart from
==============================================================  ===========  ======================================

Any other pair is an error naming it (:func:`~gpu_provider.backends.base.map_state`).

**Failure reasons** (:data:`FAILURE_REASONS`): a ``Failed`` job's ``FailureReason`` prefix says whose
fault it was. ``CapacityError:`` (SageMaker could not provision the instances) is a capacity
problem, an interruption the capacity policy absorbs like a spot wait that ran out
(``capacity_timeout``), not the job's own error; ``InternalServerError:`` and the GPU hardware faults
of :data:`NODE_FAULT_REASONS` are node faults (``node_fault``, resubmitted on fresh instances); any
other reason is the job's failure, which goes to Airflow's retries. :data:`INTERRUPTIONS` names the
state pairs that are interruptions by themselves. Each row of the three tables is a test
(``tests/backends/faults/test_classification_sagemaker.py``).

A restart inside the job is counted from ``SecondaryStatusTransitions``: every ``Interrupted``
transition is one spot reclaim SageMaker absorbed (:func:`restarts`).

**Instances** (:data:`INSTANCE_TABLE`): ``gpu_type`` x GPUs per node -> one training instance type
(:func:`training_instance_for` picks a job's, ``instance_types=`` first).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gpu_provider import names
from gpu_provider.backends.base import JobState

if TYPE_CHECKING:
    from gpu_provider.job import GpuResources

_Q, _S, _R = JobState.QUEUED, JobState.STARTING, JobState.RUNNING

#: ``TrainingJobStatus/SecondaryStatus`` -> JobState (see the module doc for what each means)
STATE_TABLE: dict[str, JobState] = {
    "InProgress/Starting": _Q,
    "InProgress/Pending": _Q,
    "InProgress/LaunchingMLInstances": _Q,
    "InProgress/Interrupted": _Q,
    "InProgress/Restarting": _Q,
    "InProgress/PreparingTrainingStack": _S,
    "InProgress/Downloading": _S,
    "InProgress/DownloadingTrainingImage": _S,
    "InProgress/Training": _R,
    "InProgress/Uploading": _R,
    "InProgress/Updating": _R,
    "Stopping/Stopping": _R,
    "Stopping/Training": _R,
    "Stopping/Uploading": _R,
    "Stopping/Starting": _R,
    "Stopping/Downloading": _R,
    "Stopping/Interrupted": _R,
    "Completed/Completed": JobState.SUCCEEDED,
    "Failed/Failed": JobState.FAILED,
    "Stopped/Stopped": JobState.CANCELLED,
    "Stopped/MaxRuntimeExceeded": JobState.FAILED,
    "Stopped/MaxWaitTimeExceeded": JobState.CANCELLED,
    "Failed/MaxWaitTimeExceeded": JobState.CANCELLED,
    "Failed/MaxRuntimeExceeded": JobState.FAILED,
    "Stopped/Interrupted": JobState.PREEMPTED,
    "Failed/Interrupted": JobState.PREEMPTED,
}

#: state pairs that end an attempt without the job's fault, and which interruption each is
INTERRUPTIONS: dict[str, str] = {
    "Stopped/MaxWaitTimeExceeded": names.CAPACITY_TIMEOUT,
    "Failed/MaxWaitTimeExceeded": names.CAPACITY_TIMEOUT,
    "Stopped/Interrupted": names.PREEMPTED,
    "Failed/Interrupted": names.PREEMPTED,
}

#: ``FailureReason`` prefix of a ``Failed`` job -> (the interruption it is, ``None``: the job's own
#: error; an example of SageMaker's own words). The first matching prefix wins; no match: the job's error.
FAILURE_REASONS: dict[str, tuple[str | None, str]] = {
    "CapacityError:": (
        names.CAPACITY_TIMEOUT,
        "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML "
        "instance type.",
    ),
    "AlgorithmError:": (None, 'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage ""\n, exit code: 1'),
    "ClientError:": (
        None,
        "ClientError: Please ensure that the image is accessible and that the role has permission to pull it.",
    ),
    # SageMaker's own fault on its instances: a node fault, resubmitted on fresh instances (its own budget)
    "InternalServerError:": (
        names.NODE_FAULT,
        "InternalServerError: We encountered an internal error. Please try again.",
    ),
}

#: ``FailureReason`` words meaning the instance or its GPU failed, not the job: an interruption of kind
#: ``node_fault`` (SageMaker provisions fresh instances for every training job). ``AlgorithmError`` quotes
#: the end of the job's output, so the GPU messages of ``gpu_provider.runtime.faults`` are read there too,
#: and the runtime helper's fault exit codes (``names.NODE_FAULT_EXIT_CODES``). Each row is a test
#: (``tests/backends/faults/test_node_faults.py``): (fault kind, example of SageMaker's words).
NODE_FAULT_REASONS: dict[str, tuple[str, str]] = {
    "InternalServerError:": (
        names.FAULT_NODE_UNHEALTHY,
        "InternalServerError: We encountered an internal error. Please try again.",
    ),
}


def failure_fault(reason: str, *, nodes: int = 1) -> str | None:
    """The GPU hardware fault a ``Failed`` job's ``FailureReason`` reports (:data:`NODE_FAULT_REASONS`, the
    GPU messages it quotes from the job's output, the runtime helper's exit code), else ``None``."""
    from gpu_provider.runtime.faults import fault_in_line, fault_of_exit_code

    text = reason.lstrip()
    for prefix, (fault, _) in NODE_FAULT_REASONS.items():
        if text.startswith(prefix):
            return fault
    if text.startswith("AlgorithmError:"):
        return fault_in_line(text, nodes=nodes) or fault_of_exit_code(exit_code(text))
    return None


def failure_interruption(reason: str, *, nodes: int = 1) -> str | None:
    """The interruption a ``Failed`` job's ``FailureReason`` names (:data:`FAILURE_REASONS`, and a GPU
    hardware fault: :func:`failure_fault`); ``None``: the job's own error."""
    if failure_fault(reason, nodes=nodes) is not None:
        return names.NODE_FAULT
    text = reason.lstrip()
    for prefix, (kind, _) in FAILURE_REASONS.items():
        if text.startswith(prefix):
            return kind
    return None


#: the secondary status of a managed-spot reclaim that SageMaker restarts from (counted as a restart)
INTERRUPTED = "Interrupted"
MAX_WAIT_EXCEEDED = "MaxWaitTimeExceeded"
MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
#: secondary statuses during which the attempt waits for capacity again after a restart
_REQUEUE = frozenset({"Interrupted", "Restarting", "Starting", "Pending", "LaunchingMLInstances"})

#: the training instance of each GPU model and GPU count per node (``instance_types=`` overrides)
INSTANCE_TABLE: dict[str, dict[int, str]] = {
    "t4": {1: "ml.g4dn.xlarge", 4: "ml.g4dn.12xlarge"},
    "a10g": {1: "ml.g5.xlarge", 4: "ml.g5.12xlarge", 8: "ml.g5.48xlarge"},
    "l4": {1: "ml.g6.xlarge", 4: "ml.g6.12xlarge", 8: "ml.g6.48xlarge"},
    "l40s": {1: "ml.g6e.xlarge", 4: "ml.g6e.12xlarge", 8: "ml.g6e.48xlarge"},
    "v100": {1: "ml.p3.2xlarge", 4: "ml.p3.8xlarge", 8: "ml.p3.16xlarge"},
    "a100": {8: "ml.p4d.24xlarge"},
    "a100-80gb": {8: "ml.p4de.24xlarge"},
    "h100": {8: "ml.p5.48xlarge"},
    "h200": {8: "ml.p5e.48xlarge"},
    "b200": {8: "ml.p6-b200.48xlarge"},
    "trn1": {1: "ml.trn1.2xlarge", 16: "ml.trn1.32xlarge"},
}
#: the GPU model of a job that names none (the most available training GPU)
DEFAULT_GPU_TYPE = "a10g"


def instance_type_for(gpu_type: str | None, gpus: int, *, default_gpu_type: str = DEFAULT_GPU_TYPE) -> str:
    """The training instance of ``gpus`` GPUs of ``gpu_type`` per node; ``ValueError`` naming the nearest ones."""
    model = gpu_type or default_gpu_type
    row = INSTANCE_TABLE.get(model)
    if row is None:
        raise ValueError(
            f"resources.gpu_type={model!r}: SageMaker has no training instance with that GPU; GPU types it "
            f"trains on: {', '.join(INSTANCE_TABLE)} (or name the instance with resources.instance_types)"
        )
    if gpus in row:
        return row[gpus]
    nearest = sorted(row.items(), key=lambda item: (abs(item[0] - gpus), item[0]))
    offers = ", ".join(f"{name} ({count} GPU{'s' if count > 1 else ''})" for count, name in nearest)
    raise ValueError(
        f"resources.gpus={gpus} with gpu_type={model!r}: no SageMaker training instance has {gpus} {model} "
        f"GPU(s) per node; nearest: {offers}. Use one of those GPU counts per node (and more nodes), or name "
        "the instance with resources.instance_types"
    )


def training_instance(name: str) -> str:
    """An instance type name as SageMaker writes it (``g5.2xlarge`` -> ``ml.g5.2xlarge``)."""
    return name if name.startswith("ml.") else f"ml.{name}"


def training_instance_for(resources: GpuResources, default_instance: str | None = None) -> str:
    """The training instance of a job: ``instance_types=``, else ``default_instance`` (the backend's
    ``instance_type=``) for a job that names no ``gpu_type``, else the table (``gpu_type`` x GPUs per node)."""
    if resources.instance_types:
        if len(resources.instance_types) > 1:
            raise ValueError(
                f"resources.instance_types={list(resources.instance_types)!r}: a SageMaker training job runs on "
                "one instance type; give one"
            )
        return training_instance(resources.instance_types[0])
    gpus = math.ceil(resources.gpus)
    if default_instance and not resources.gpu_type:
        return default_instance
    return instance_type_for(resources.gpu_type, gpus)


def check_instance_fallback(instance_types: Sequence[str]) -> None:
    """Each type of an ordered preference must be a training instance SageMaker prices (``ml.`` added
    where missing)."""
    from gpu_provider.capacity.instances import known_instance_types

    known = known_instance_types()
    for instance_type in instance_types:
        if training_instance(instance_type) not in known:
            allowed = ", ".join(sorted(t for t in known if t.startswith("ml.")))
            raise ValueError(
                f"resources.instance_types: {instance_type!r} is not a SageMaker training instance of the "
                f"price table; allowed: {allowed}"
            )


def state_key(job: Mapping[str, Any]) -> str:
    return f"{job.get('TrainingJobStatus')}/{job.get('SecondaryStatus')}"


def transitions(job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(job.get("SecondaryStatusTransitions") or [])


def restarts(job: Mapping[str, Any]) -> int:
    """Spot reclaims SageMaker absorbed inside the job: its ``Interrupted`` transitions."""
    return sum(1 for t in transitions(job) if t.get("Status") == INTERRUPTED)


def interruption_messages(job: Mapping[str, Any]) -> list[str]:
    """SageMaker's own words for each ``Interrupted`` transition (for the attempt record and the log)."""
    return [str(t.get("StatusMessage") or "") for t in transitions(job) if t.get("Status") == INTERRUPTED]


def queued_since(job: Mapping[str, Any]) -> float | None:
    """When the job last went back to waiting for instances (a restart's ``Interrupted``), else ``None``."""
    seen = transitions(job)
    if not seen or not any(t.get("Status") == INTERRUPTED for t in seen):
        return None
    since: float | None = None
    for t in reversed(seen):
        if t.get("Status") not in _REQUEUE:
            break
        since = seconds(t.get("StartTime"))
    return since


#: secondary statuses whose time SageMaker counts against ``MaxRuntimeInSeconds`` (the instances are the job's)
_COUNTED = frozenset({"Downloading", "Training", "Uploading"})


def training_seconds(job: Mapping[str, Any], now: float) -> float:
    """The run time SageMaker counts against ``MaxRuntimeInSeconds`` so far: ``TrainingTimeInSeconds``
    once it reports it, else the time spent in Downloading, Training and Uploading per
    ``SecondaryStatusTransitions`` (an open transition counted up to ``now``). Waiting for spot
    capacity (Starting, after an ``Interrupted``) is not counted: that is ``MaxWaitTimeInSeconds``'s."""
    reported = job.get("TrainingTimeInSeconds")
    if isinstance(reported, (int, float)) and not isinstance(reported, bool):
        return float(reported)
    seen = transitions(job)
    total = 0.0
    for i, t in enumerate(seen):
        if t.get("Status") not in _COUNTED:
            continue
        start = seconds(t.get("StartTime"))
        end = seconds(t.get("EndTime"))
        if end is None:
            end = seconds(seen[i + 1].get("StartTime")) if i + 1 < len(seen) else now
        if start is not None and end is not None:
            total += max(0.0, end - start)
    return total


_EXIT_CODE = re.compile(r"exit\s*code:?\s*(-?\d+)", re.IGNORECASE)


def exit_code(reason: str) -> int | None:
    """The container's exit code in a ``FailureReason`` (``AlgorithmError: ..., exit code: 1``)."""
    match = _EXIT_CODE.search(reason)
    return int(match.group(1)) if match else None


def seconds(value: Any) -> float | None:
    """A timestamp of botocore (datetime) or of JSON (epoch seconds) as Unix seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def hosts(count: int) -> list[str]:
    """SageMaker's host names of a job of ``count`` instances (``algo-1`` ...)."""
    return [f"algo-{i}" for i in range(1, count + 1)]


def tag_map(tags: Sequence[Mapping[str, Any]] | None) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value", "")) for t in tags or ()}


def console_url(region: str, name: str) -> str:
    return f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}#/jobs/{name}"


def logs_console_url(region: str, name: str) -> str:
    def enc(text: str) -> str:
        return quote(quote(text, safe=""), safe="").replace("%", "$")

    group = "/aws/sagemaker/TrainingJobs"
    base = f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
    return f"{base}{enc(group)}$3FlogStreamNameFilter$3D{enc(name + '/')}"
