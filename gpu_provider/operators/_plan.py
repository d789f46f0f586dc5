"""What one try of a ``GpuJobOperator`` runs: its rendered, validated fields, and the request of each attempt."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    rungs: tuple[Backend, ...] = ()
    """A capacity ladder's backends, by rung index (empty: every attempt runs on ``backend``)."""


def rung_of(operator: Any, index: int | None) -> Any:
    """The :class:`~gpu_provider.capacity.LadderRung` at ``index`` of the operator's capacity ladder (``None``
    without a ladder, or for an index that is not one of its rungs)."""
    from gpu_provider.capacity import Ladder

    return operator.capacity.rung(index) if isinstance(operator.capacity, Ladder) else None


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
    resources, image = operator.gpu_resources, plan.image
    rung = rung_of(operator, step.rung)
    if rung is not None:  # a capacity ladder's rung: its own image and instance types, where it gives them
        image = rung.image or image
        if rung.instance_types is not None:
            resources = dataclasses.replace(resources, instance_types=rung.instance_types)
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
        resources=resources,
        capacity=step.capacity,
        image=image,
        max_runtime_s=plan.max_runtime_s,
        checkpoint_uri=plan.checkpoint_uri,
        resume_from=resume_from,
        priority=operator.job_priority,
        capacity_wait_s=operator.capacity.spot_wait_timeout_s if step.capacity == names.SPOT else None,
        instance_type=step.instance_type,
        # node faults: keep away from the nodes where this run's GPUs failed (where the backend can)
        avoid_nodes=tuple(r.node for r in runner.engine.current if r.interruption == names.NODE_FAULT and r.node),
    )
