"""What one try of a ``GpuJobOperator`` runs: its rendered, validated fields, and the request of each attempt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_provider import names
from gpu_provider.backends.base import Backend, JobIdentity, JobRequest, TaskKey

if TYPE_CHECKING:
    from gpu_provider.engine.attempts import Submit
    from gpu_provider.engine.runner import AttemptRunner
    from gpu_provider.operators.gpu_job import GpuJobOperator


@dataclass(frozen=True)
class Plan:
    """The rendered, validated fields of this try (the untemplated spec stays on the operator)."""

    backend: Backend
    command: list[str]
    env: dict[str, str]
    image: str | None
    checkpoint_uri: str | None
    max_runtime_s: float | None
    poll_interval: float
    try_number: int
    retry: str | None = None
    """The Airflow retry that follows if this try fails ("try 2 of 3"), ``None`` when none is left."""


def attempt_request(
    operator: GpuJobOperator, task: TaskKey, plan: Plan, runner: AttemptRunner, step: Submit, resume_from: str | None
) -> JobRequest:
    """The backend-neutral request for the attempt ``step`` submits: identity, the job's environment contract
    and its resources, from the operator's spec and this try's plan."""
    identity = JobIdentity(
        task=task,
        try_number=plan.try_number,
        attempt=step.attempt,
        capacity=step.capacity,
        team=operator.team,
    )
    env = {
        **plan.env,
        names.ENV_CHECKPOINT_URI: plan.checkpoint_uri or "",
        names.ENV_CHECKPOINT_KEEP: str(operator.checkpoint_keep or ""),
        names.ENV_RESUME_FROM: resume_from or "",
        names.ENV_ATTEMPT: str(step.attempt),
        names.ENV_CAPACITY: step.capacity,
    }
    return JobRequest(
        identity=identity,
        command=tuple(plan.command),
        env=env,
        resources=operator.gpu_resources,
        capacity=step.capacity,
        image=plan.image,
        max_runtime_s=plan.max_runtime_s,
        checkpoint_uri=plan.checkpoint_uri,
        resume_from=resume_from,
        priority=operator.job_priority,
        capacity_wait_s=operator.capacity.spot_wait_timeout_s if step.capacity == names.SPOT else None,
        instance_type=step.instance_type,
        # node faults: keep away from the nodes where this run's GPUs failed (where the backend can)
        avoid_nodes=tuple(r.node for r in runner.engine.current if r.interruption == names.NODE_FAULT and r.node),
    )
