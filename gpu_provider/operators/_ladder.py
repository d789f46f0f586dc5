"""What a ``GpuJobOperator`` does for a capacity :class:`~gpu_provider.capacity.Ladder`: the task's backend is the
first rung's, every rung is checked by its own backend, and each attempt is priced on its rung's service."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpu_provider.capacity import Ladder

if TYPE_CHECKING:
    from gpu_provider.backends.base import Backend
    from gpu_provider.engine.runner import AttemptRunner
    from gpu_provider.job import GpuResources
    from gpu_provider.operators.gpu_job import GpuJobOperator
    from gpu_provider.records import AttemptRecord

log = logging.getLogger(__name__)


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
    operator: GpuJobOperator,
    image: str | None,
    checkpoint_uri: str | None,
    *,
    image_known: bool = True,
    parse: bool = False,
) -> list[Backend]:
    """Check every rung with its own backend (resources, capacity, image, priority, runtime), and the one
    checkpoint all of them read (``checkpoint_uri`` ``None``: not known yet). Returns the rungs' backends.

    :param parse: the DAG is being parsed: also warn about rungs no configured reaper sweeps"""
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
    if parse:
        warn_unswept_rungs(operator.task_id, ladder, backends)
    return backends


def unswept_rungs(ladder: Ladder, backends: Sequence[Backend]) -> list[str]:
    """One line per rung of ``ladder`` (its ``backends``) outside every configured reaper's scope."""
    from gpu_provider.spend.scope import configured_reapers, describe, scope_text, unswept

    try:
        reapers = configured_reapers()
    except (TypeError, ValueError) as err:  # a bad reaper_backends fails the reaper's own DAG: say so here
        return [f"the reaper's scope cannot be read ({err}): its rungs may not be swept"]
    lines = [
        f"capacity.rungs[{i}] ({ladder.rungs[i].backend_name}, {ladder.rungs[i].capacity}) runs on "
        f"{describe(backends[i])}, outside the reaper's scope ({scope_text(reapers)})"
        for i in unswept(backends, reapers)
    ]
    return lines


def warn_unswept_rungs(task_id: str, ladder: Ladder, backends: Sequence[Backend]) -> None:
    """Warn (when the DAG is parsed) about rungs whose jobs no reaper pass would see: such a job, left behind by
    a task that is gone, keeps billing until someone stops it by hand."""
    for line in unswept_rungs(ladder, backends):
        log.warning(
            "Task %r: %s. A job of this rung that outlives its task is not stopped by the reaper: add the rung's "
            "backend (the mapping with its connection, region and queues) to [gpu_provider] reaper_backends "
            "(or GpuReaperOperator(backends=...)).",
            task_id,
            line,
        )


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
