"""Operators. ``from gpu_provider.operators import GpuJobOperator``."""

from gpu_provider.operators.gpu_job import GpuJobOperator

__all__ = ["GpuJobOperator"]
