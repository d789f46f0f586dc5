"""CheckpointSensor against real checkpoints written by the runtime helper."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_provider.runtime import save_checkpoint
from gpu_provider.sensors import CheckpointSensor


def test_waits_for_a_checkpoint_at_or_beyond_min_step(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'ckpt'}"
    sensor = CheckpointSensor(task_id="wait", uri=uri, min_step=10)
    assert sensor.poke({}) is False  # nothing yet
    with save_checkpoint(uri, 5) as folder:
        (folder / "w.bin").write_bytes(b"5")
    assert sensor.poke({}) is False  # too early a step
    with save_checkpoint(uri, 12) as folder:
        (folder / "w.bin").write_bytes(b"12")
    assert sensor.poke({}) is True
    assert sensor._found == {"checkpoint": f"{uri}/ckpt-0000000012", "step": 12}


def test_bad_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="uri='http://x'"):
        CheckpointSensor(task_id="a", uri="http://x")
    with pytest.raises(ValueError, match="min_step=-1"):
        CheckpointSensor(task_id="b", uri="file:///tmp/x", min_step=-1)
