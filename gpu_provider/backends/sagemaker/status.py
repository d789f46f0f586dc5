"""What one DescribeTrainingJob answer (and the job's tags) says: its JobStatus, its JobHandle, an OwnedJob.

What SageMaker's states, secondary statuses and failure reasons mean is in
:mod:`~gpu_provider.backends.sagemaker.mapping`; this module turns them into the contract's objects,
with the words a reader needs (whose fault, which limit, who stopped it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gpu_provider import names
from gpu_provider.backends.aws import status as aws_status
from gpu_provider.backends.base import JobHandle, JobState, JobStatus, OwnedJob, map_state, task_from_tags
from gpu_provider.backends.common import attempt_in_name
from gpu_provider.backends.sagemaker import mapping
from gpu_provider.backends.sagemaker.ownership import owner_try, stop_reason
from gpu_provider.backends.sagemaker.service import SERVICE
from gpu_provider.exceptions import GpuJobStatusError


def status_of(
    job: Mapping[str, Any], handle: JobHandle, tags: Mapping[str, str], *, backend: str, region: str
) -> JobStatus:
    """Map one DescribeTrainingJob answer (and the job's tags) onto a :class:`JobStatus`.

    :param backend: the backend's name (in the error of an unknown state)
    :param region: the job's region (of the logs link)
    """
    state = map_state(mapping.STATE_TABLE, mapping.state_key(job), backend=backend)
    secondary = str(job.get("SecondaryStatus") or "")
    seen = mapping.transitions(job)
    last_message = str(seen[-1].get("StatusMessage") or "") if seen else ""
    failure = str(job.get("FailureReason") or "")
    reason, interruption, code, fault = "", None, None, None
    if state is JobState.FAILED:
        code = mapping.exit_code(failure)
        reason = failure or last_message or "no reason given"
        nodes = int((job.get("ResourceConfig") or {}).get("InstanceCount") or 1)
        interruption = mapping.failure_interruption(failure, nodes=nodes)
        fault = mapping.failure_fault(failure, nodes=nodes) if interruption == names.NODE_FAULT else None
        if fault is not None:
            reason = f"SageMaker reports a GPU hardware or instance fault ({fault}), not the job's own error: {reason}"
        if interruption == names.CAPACITY_TIMEOUT:
            instance = (job.get("ResourceConfig") or {}).get("InstanceType")
            reason = (
                f"SageMaker could not provision {handle.capacity} {instance} capacity ({failure}): a capacity "
                "problem, not the job's own error"
            )
        if secondary == mapping.MAX_RUNTIME_EXCEEDED:
            limit = (job.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
            reason = f"{last_message or secondary}: the job ran past max_runtime (MaxRuntimeInSeconds={limit})"
    elif state is JobState.CANCELLED:
        ours = stop_reason(tags)
        if secondary == mapping.MAX_WAIT_EXCEEDED:
            wait = (job.get("StoppingCondition") or {}).get("MaxWaitTimeInSeconds")
            reason = (
                f"SageMaker: {failure or last_message or secondary} (MaxWaitTimeInSeconds={wait}): managed spot "
                "capacity did not come in time"
            )
            interruption = names.CAPACITY_TIMEOUT
        elif ours:
            reason = ours
            if ours.startswith(names.CAPACITY_TIMEOUT_MARK):
                interruption = names.CAPACITY_TIMEOUT
            elif ours.startswith(names.RESTART_LIMIT_MARK):
                interruption = names.PREEMPTED  # restarted too often on spot: the policy's next attempt runs
        else:
            reason = (
                f"stopped outside Airflow (StopTrainingJob by someone else, e.g. in the console): "
                f"{last_message or 'no reason given'}"
            )
    elif state is JobState.PREEMPTED:
        reason, interruption = f"SageMaker: {failure or last_message}", names.PREEMPTED
    elif state.active and secondary in mapping._REQUEUE:
        reason = last_message
    # a stop this provider asked for, being taken (Stopping): the reason its stop tag carries
    stopping = (stop_reason(tags) or None) if state.active and job.get("TrainingJobStatus") == "Stopping" else None
    restarts = mapping.restarts(job)
    if restarts and state.active and (secondary == mapping.INTERRUPTED or mapping.queued_since(job) is not None):
        words = mapping.interruption_messages(job)[-1] or "spot capacity reclaimed"
        reason = f"managed spot interruption {restarts} (SageMaker restarts the job itself): {words}"
    started = mapping.seconds(job.get("TrainingStartTime"))
    ended = mapping.seconds(job.get("TrainingEndTime")) if state.terminal else None
    gpus = float(handle.extra.get("gpus") or 0) or float(tags.get(names.TAG_GPUS) or 0)
    trained = job.get("TrainingTimeInSeconds")
    if trained:  # whole seconds: a job shorter than one second reads its start and end instead
        gpu_seconds = gpus * float(trained)
    elif started:
        gpu_seconds = gpus * max(0.0, (ended or time.time()) - started)
    else:
        gpu_seconds = 0.0
    billable = job.get("BillableTimeInSeconds")
    owner = str(tags.get(names.TAG_OWNER_TRY) or "")
    output = (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts") if state is JobState.SUCCEEDED else None
    return JobStatus(
        state=state,
        reason=reason,
        exit_code=0 if state is JobState.SUCCEEDED else code,
        started_at=started,
        ended_at=ended,
        gpu_seconds=gpu_seconds,
        output_uri=str(output) if output else None,
        log_url=mapping.logs_console_url(region, handle.name),
        interruption=interruption,
        fault=fault,
        restarts=restarts,
        queued_since=mapping.queued_since(job) if state is JobState.QUEUED else None,
        billable_seconds=float(billable) if billable is not None else None,
        training_seconds=float(trained) if trained is not None else None,
        instance_type=str((job.get("ResourceConfig") or {}).get("InstanceType") or "") or None,
        capacity=names.SPOT if job.get("EnableManagedSpotTraining") else names.ON_DEMAND,
        owner_try=int(owner) if owner.isdigit() else None,
        collected=str(tags.get(names.TAG_COLLECTED) or "").lower() == "true",
        stopping=stopping,
    )


def missing(handle: JobHandle, now: float) -> JobStatus | GpuJobStatusError:
    """What a job DescribeTrainingJob does not know means: not visible yet, or gone for good
    (:func:`gpu_provider.backends.aws.status.missing`)."""
    return aws_status.missing(
        handle,
        now,
        unseen=f"{SERVICE} does not describe training job {handle.name}",
        gone=f"{SERVICE} no longer knows training job {handle.name} (deleted): how it ended cannot be known.",
    )


def handle_of(job: Mapping[str, Any], tags: Mapping[str, str], *, backend: str, region: str) -> JobHandle:
    """The handle of a job found by a lookup or a listing (or adopted by a re-sent submit)."""
    name = str(job["TrainingJobName"])
    attempt = attempt_in_name(name)
    resources = job.get("ResourceConfig") or {}
    nodes = int(resources.get("InstanceCount") or 1)
    try:
        gpus = float(tags.get(names.TAG_GPUS) or 0)
    except ValueError:
        gpus = 0.0
    return JobHandle(
        backend=backend,
        job_id=name,
        name=name,
        attempt=attempt if attempt is not None else int(tags.get(names.TAG_ATTEMPT) or 1),
        capacity=names.SPOT if job.get("EnableManagedSpotTraining") else names.ON_DEMAND,
        submitted_at=mapping.seconds(job.get("CreationTime")) or time.time(),
        extra={
            "region": region,
            "job_arn": str(job.get("TrainingJobArn") or ""),
            "gpus": gpus,
            "nodes": nodes,
        },
    )


def owned_job(job: Mapping[str, Any], tags: Mapping[str, str], handle: JobHandle, state: JobState) -> OwnedJob:
    """An active job of this provider as the reaper and the GPU page list it."""
    resources = job.get("ResourceConfig") or {}
    nodes = int(resources.get("InstanceCount") or 1)
    total = float(handle.extra.get("gpus") or 0)
    return OwnedJob(
        handle=handle,
        task=task_from_tags(tags),
        state=state,
        try_number=owner_try(tags),
        team=tags.get(names.TAG_TEAM) or None,
        started_at=mapping.seconds(job.get("TrainingStartTime")),
        instance_type=str(resources.get("InstanceType") or "") or None,
        nodes=nodes,
        gpus=total / nodes if nodes else total,
        max_runtime_s=(job.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds"),
        # managed spot: MaxRuntime counts training time only, MaxWait the wall time since creation
        max_wait_s=(job.get("StoppingCondition") or {}).get("MaxWaitTimeInSeconds"),
        training_seconds=mapping.training_seconds(job, time.time()),
    )
