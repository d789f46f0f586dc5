"""Sensors. ``from gpu_provider.sensors import CheckpointSensor``."""

from gpu_provider.sensors.checkpoint import CheckpointSensor
from gpu_provider.sensors.gpu_job import GpuJobSensor
from gpu_provider.sensors.spot_capacity import SpotCapacitySensor

__all__ = ["CheckpointSensor", "GpuJobSensor", "SpotCapacitySensor"]
