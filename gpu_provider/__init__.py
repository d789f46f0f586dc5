"""airflow-provider-gpu: GPU stages of ML pipelines from Airflow DAG tasks.

The public names, all importable from here::

    from gpu_provider import GpuResources, Checkpoint, OnDemand, Spot, SpotFallback  # the job's spec
    from gpu_provider import InstanceFallback                                        # ordered instance types
    from gpu_provider import Ladder, LadderRung                                      # rungs across services
    from gpu_provider import SpotReturn                                              # back to spot when it returns
    from gpu_provider import GpuJobOperator, GpuReaperOperator                      # operators
    from gpu_provider import CheckpointSensor, GpuJobSensor, SpotCapacitySensor     # sensors
    from gpu_provider import JobIdentity, TaskKey, JobState                         # a job's identity, states
    from gpu_provider import path_segment, TEMPLATE_FILTERS                         # template filters
    from gpu_provider import GpuJobError, GpuJobFailedError, ...                    # the errors tasks raise

Importing the package stays cheap (no Airflow, boto3 or kubernetes): the spec classes are defined in small
modules, every other name is imported on first use. The subpackages (``gpu_provider.operators``,
``gpu_provider.sensors``, ``gpu_provider.backends.<name>``, ``gpu_provider.runtime``) stay importable too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpu_provider.capacity import (
    CapacityPolicy,
    InstanceFallback,
    Ladder,
    LadderRung,
    OnDemand,
    Spot,
    SpotFallback,
    SpotReturn,
)
from gpu_provider.job import Checkpoint, GpuResources

if TYPE_CHECKING:
    from gpu_provider.backends.base import JobIdentity, JobState, TaskKey
    from gpu_provider.exceptions import (
        GpuJobCancelledError,
        GpuJobDeadlineError,
        GpuJobError,
        GpuJobFailedError,
        GpuJobInterruptionBudgetError,
        GpuJobStoppedError,
    )
    from gpu_provider.operators import GpuJobOperator, GpuReaperOperator
    from gpu_provider.sensors import CheckpointSensor, GpuJobSensor, SpotCapacitySensor
    from gpu_provider.templates import TEMPLATE_FILTERS, path_segment

__version__ = "0.4.0"

#: the names imported on first use, and their modules
_LAZY = {
    "GpuJobOperator": "gpu_provider.operators",
    "GpuReaperOperator": "gpu_provider.operators",
    "CheckpointSensor": "gpu_provider.sensors",
    "GpuJobSensor": "gpu_provider.sensors",
    "SpotCapacitySensor": "gpu_provider.sensors",
    "JobIdentity": "gpu_provider.backends.base",
    "JobState": "gpu_provider.backends.base",
    "TaskKey": "gpu_provider.backends.base",
    "path_segment": "gpu_provider.templates",
    "TEMPLATE_FILTERS": "gpu_provider.templates",
    "GpuJobError": "gpu_provider.exceptions",
    "GpuJobFailedError": "gpu_provider.exceptions",
    "GpuJobStoppedError": "gpu_provider.exceptions",
    "GpuJobCancelledError": "gpu_provider.exceptions",
    "GpuJobInterruptionBudgetError": "gpu_provider.exceptions",
    "GpuJobDeadlineError": "gpu_provider.exceptions",
}

__all__ = [
    "TEMPLATE_FILTERS",
    "CapacityPolicy",
    "Checkpoint",
    "CheckpointSensor",
    "GpuJobCancelledError",
    "GpuJobDeadlineError",
    "GpuJobError",
    "GpuJobFailedError",
    "GpuJobInterruptionBudgetError",
    "GpuJobOperator",
    "GpuJobSensor",
    "GpuJobStoppedError",
    "GpuReaperOperator",
    "GpuResources",
    "InstanceFallback",
    "JobIdentity",
    "JobState",
    "Ladder",
    "LadderRung",
    "OnDemand",
    "Spot",
    "SpotCapacitySensor",
    "SpotFallback",
    "SpotReturn",
    "TaskKey",
    "__version__",
    "path_segment",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpu_provider' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
