"""What a ``GpuJobOperator`` does for a capacity :class:`~gpu_provider.capacity.Ladder`: the task's backend is the
first rung's, every rung is checked by its own backend, and each attempt is priced on its rung's service."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from gpu_provider.capacity import Ladder

if TYPE_CHECKING:
    from gpu_provider.backends.base import Backend
    from gpu_provider.engine.runner import AttemptRunner
    from gpu_provider.job import GpuResources
    from gpu_provider.operators.gpu_job import GpuJobOperator
    from gpu_provider.records import AttemptRecord


def ladder_backend(capacity: Any, backend: Any) -> Any:
    """``backend=`` as the operator keeps it: under a ladder, the first rung's (``backend=`` must be left out)."""
    if not isinstance(capacity, Ladder):
        return backend
    if backend is not None:
        raise ValueError(
            f"backend={backend!r} with capacity=Ladder(...): a ladder names the backend of each of its rungs "
            "(LadderRung('batch', 'spot', ...)); leave backend= out"
        )
    return capacity.rungs[0].backend_spec()


def validate_rungs(
    operator: GpuJobOperator, image: str | None, checkpoint_uri: str | None, *, image_known: bool = True
) -> list[Backend]:
    """Check every rung with its own backend (resources, capacity, image, priority, runtime), and the one
    checkpoint all of them read (``checkpoint_uri`` ``None``: not known yet). Returns the rungs' backends."""
    ladder = operator.capacity
    assert isinstance(ladder, Ladder)
    backends = ladder.validate_rungs(
        operator.gpu_resources,
        image=image,
        image_known=image_known,
        priority=operator.job_priority,
        max_runtime_s=operator._runtime_limit(operator.max_runtime_s),
    )
    ladder.check_checkpoint(checkpoint_uri)
    return backends


def rung_places(operator: GpuJobOperator, backends: tuple[Backend, ...]) -> list[tuple[Backend, GpuResources, str]]:
    """Each rung's backend, resources (with its instance types) and capacity, in order (for prices)."""
    ladder = operator.capacity
    assert isinstance(ladder, Ladder)
    places = []
    for backend, rung in zip(backends, ladder.rungs, strict=True):
        resources = operator.gpu_resources
        if rung.instance_types is not None:
            resources = dataclasses.replace(resources, instance_types=rung.instance_types)
        places.append((backend, resources, rung.capacity))
    return places


def rung_place(
    operator: GpuJobOperator, runner: AttemptRunner, record: AttemptRecord
) -> tuple[Backend, GpuResources] | None:
    """The backend and resources ``record``'s attempt is priced with: its ladder rung's (``None``: the task's)."""
    if record.rung is None and not record.backend_spec:
        return None
    resources = operator.gpu_resources
    rung = operator.capacity.rung(record.rung) if isinstance(operator.capacity, Ladder) else None
    if rung is not None and rung.instance_types is not None:
        resources = dataclasses.replace(resources, instance_types=rung.instance_types)
    return runner.backend_for(record), resources
