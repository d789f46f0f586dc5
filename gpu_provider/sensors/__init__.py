"""Sensors. ``from gpu_provider.sensors import CheckpointSensor``."""

from gpu_provider.sensors.checkpoint import CheckpointSensor

__all__ = ["CheckpointSensor"]
