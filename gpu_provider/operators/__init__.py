"""Operators. ``from gpu_provider.operators import GpuJobOperator``."""

from gpu_provider.operators.gpu_job import GpuJobOperator
from gpu_provider.operators.reaper import GpuReaperOperator

__all__ = ["GpuJobOperator", "GpuReaperOperator"]
