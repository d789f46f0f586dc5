"""airflow-provider-gpu: GPU stages of ML pipelines from Airflow DAG tasks.

Public names for DAG authors (cheap to import: no boto3, no kubernetes)::

    from gpu_provider import GpuResources, Checkpoint, OnDemand, Spot, SpotFallback
    from gpu_provider.operators import GpuJobOperator
"""

from __future__ import annotations

from gpu_provider.job import Checkpoint, GpuResources
from gpu_provider.recovery import CapacityPolicy, OnDemand, Spot, SpotFallback

__version__ = "0.4.0"

__all__ = ["CapacityPolicy", "Checkpoint", "GpuResources", "OnDemand", "Spot", "SpotFallback", "__version__"]
