"""CheckpointSensor and CheckpointTrigger against real checkpoints written by the runtime helper (and a real job)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.runtime import latest_checkpoint, save_checkpoint
from gpu_provider.runtime.checkpoint import published_checkpoint
from gpu_provider.sensors import CheckpointSensor
from gpu_provider.triggers.checkpoint import CheckpointTrigger

REPO = Path(__file__).resolve().parents[2]

#: a job that publishes checkpoints through the runtime helper: one step per line it reads from a FIFO-like file
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gpu_provider.runtime import save_checkpoint
    uri, go, steps, delay = sys.argv[1], Path(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")], float(sys.argv[4])
    while not go.exists():  # the test says when to start, so it can look before any checkpoint exists
        time.sleep(0.02)
    for step in steps:
        with save_checkpoint(uri, step, keep=None) as folder:
            (folder / "w.bin").write_bytes(str(step).encode())
            time.sleep(delay)  # the save takes a while: a reader looking now sees only a .tmp- folder
        print(f"published {step} at {time.time()!r}", flush=True)
    """
)


def _save(uri: str, step: int) -> None:
    with save_checkpoint(uri, step, keep=None) as folder:
        (folder / "w.bin").write_bytes(str(step).encode())


def _poke(sensor: CheckpointSensor) -> Any:
    value = sensor.poke({})  # type: ignore[arg-type]
    return value.xcom_value if value else None


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Any]:
    """Starts the checkpoint-writing job as a real process; kills it at the end of the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(uri: str, steps: list[int], delay: float = 0.3) -> tuple[subprocess.Popen[str], Path]:
        go = tmp_path / f"go-{len(procs)}"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, uri, str(go), ",".join(map(str, steps)), str(delay)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(proc)
        return proc, go

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


# ----------------------------------------------------------------------------------------- poke mode


def test_waits_for_a_checkpoint_at_or_beyond_min_step(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'ckpt'}"
    sensor = CheckpointSensor(task_id="wait", uri=uri, min_step=10, deferrable=False)
    assert _poke(sensor) is None  # nothing yet
    _save(uri, 5)
    assert _poke(sensor) is None  # too early a step
    _save(uri, 12)
    assert _poke(sensor) == {"checkpoint": f"{uri}/ckpt-0000000012", "step": 12}


def test_newer_than_a_step_wants_a_later_one(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'ckpt'}"
    _save(uri, 10)
    sensor = CheckpointSensor(task_id="wait", uri=uri, newer_than=10, deferrable=False)
    assert _poke(sensor) is None, "step 10 is not newer than 10"
    _save(uri, 11)
    assert _poke(sensor) == {"checkpoint": f"{uri}/ckpt-0000000011", "step": 11}
    # with min_step too, both must hold
    both = CheckpointSensor(task_id="both", uri=uri, min_step=15, newer_than=3, deferrable=False)
    assert _poke(both) is None
    # a template renders to a string of digits
    templated = CheckpointSensor(task_id="t", uri=uri, newer_than="{{ 5 + 6 }}", deferrable=False)
    templated.newer_than = "11"  # what rendering gives
    assert _poke(templated) is None


def test_a_partially_written_checkpoint_does_not_count(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    uri = root.as_uri()
    sensor = CheckpointSensor(task_id="wait", uri=uri, deferrable=False)
    # a save in progress: the runtime writes into a .tmp- folder and renames it when complete
    (root / ".tmp-ckpt-0000000050-host-1-2-3").mkdir(parents=True)
    (root / ".tmp-ckpt-0000000050-host-1-2-3" / "w.bin").write_bytes(b"half")
    assert _poke(sensor) is None
    # a ckpt- folder that LATEST does not name yet (on S3: still uploading; LATEST is written last)
    (root / "ckpt-0000000060").mkdir()
    (root / "ckpt-0000000060" / "w.bin").write_bytes(b"60")
    assert latest_checkpoint(uri) == f"{uri}/ckpt-0000000060", "a job resuming would take it (fallback)"
    assert published_checkpoint(uri) is None
    assert _poke(sensor) is None
    # LATEST naming a folder that is not there, or holding no checkpoint name
    (root / "LATEST").write_text("ckpt-0000000070\n")
    assert _poke(sensor) is None
    (root / "LATEST").write_text("garbage\n")
    assert _poke(sensor) is None
    # a real save publishes: LATEST names it
    _save(uri, 80)
    assert _poke(sensor) == {"checkpoint": f"{uri}/ckpt-0000000080", "step": 80}


def test_fires_on_a_checkpoint_a_running_job_writes_and_not_before(tmp_path: Path, writer: Any) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    proc, go = writer(uri, [20, 40], 0.4)
    sensor = CheckpointSensor(task_id="wait", uri=uri, min_step=40, deferrable=False)
    assert _poke(sensor) is None  # the job runs, nothing written yet
    go.touch()
    seen: list[Any] = []
    deadline = time.monotonic() + 30
    while (found := _poke(sensor)) is None:
        seen.append(sorted(p.name for p in (tmp_path / "ckpt").glob("*")) if (tmp_path / "ckpt").exists() else [])
        assert time.monotonic() < deadline, "no checkpoint at step 40 within 30 s"
        time.sleep(0.05)
    assert found == {"checkpoint": f"{uri}/ckpt-0000000040", "step": 40}
    # it looked while the job was writing (a .tmp- folder or step 20 only) and did not fire then
    assert any(any(n.startswith(".tmp-") for n in names) for names in seen), seen
    assert any("ckpt-0000000020" in names for names in seen), seen
    assert proc.wait(30) == 0


# ------------------------------------------------------------------------------------------ the trigger


def _run(trigger: CheckpointTrigger, timeout: float = 30) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout))


def test_trigger_round_trips_through_json() -> None:
    trigger = CheckpointTrigger(
        uri="s3://bucket/run/ckpt", min_step=5, newer_than=12, aws_conn_id="aws_ml", poll_interval=7.5, end_time=1.5e9
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "gpu_provider.triggers.checkpoint.CheckpointTrigger"
    again = CheckpointTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs == {
        "uri": "s3://bucket/run/ckpt",
        "min_step": 5,
        "newer_than": 12,
        "aws_conn_id": "aws_ml",
        "poll_interval": 7.5,
        "end_time": 1.5e9,
    }
    # a triggerer of a newer version may pass arguments this one does not know
    CheckpointTrigger(**kwargs, added_later=1)


def test_trigger_fires_when_a_running_job_publishes_the_step(tmp_path: Path, writer: Any) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    _save(uri, 10)
    proc, go = writer(uri, [20, 30], 0.2)
    go.touch()
    event = _run(CheckpointTrigger(uri=uri, newer_than=25, poll_interval=0.05))
    assert event == {
        "status": "success",
        "checkpoint": f"{uri}/ckpt-0000000030",
        "step": 30,
        "message": f"Found checkpoint {uri}/ckpt-0000000030 (step 30).",
    }
    published_at = float(proc.communicate(timeout=30)[0].splitlines()[-1].split(" at ")[1])
    assert time.time() >= published_at


def test_trigger_times_out_with_what_it_saw(tmp_path: Path) -> None:
    uri = (tmp_path / "ckpt").as_uri()
    _save(uri, 3)
    event = _run(CheckpointTrigger(uri=uri, min_step=4, poll_interval=0.05, end_time=time.time() + 0.3))
    assert event["status"] == "timeout"
    assert (event["checkpoint"], event["step"]) == (f"{uri}/ckpt-0000000003", 3)
    assert "at step 4 or later" in event["message"] and "step 3" in event["message"]


def test_trigger_gives_up_after_repeated_read_errors(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    event = _run(CheckpointTrigger(uri=not_a_folder.as_uri(), poll_interval=0.01))
    assert event["status"] == "error"
    assert "3 time(s) in a row" in event["message"] and str(not_a_folder) in event["message"]


# ------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"uri": "http://x"}, ValueError, "uri='http://x'"),
        ({"min_step": -1}, ValueError, "min_step=-1 must be an integer step >= 0"),
        ({"min_step": 1.5}, TypeError, "min_step=1.5"),
        ({"min_step": True}, TypeError, "min_step=True"),
        ({"newer_than": -2}, ValueError, "newer_than=-2"),
        ({"newer_than": "last_run"}, ValueError, "newer_than='last_run' is not a step; allowed: .*'previous_run'"),
        ({"newer_than": 2.0}, TypeError, "newer_than=2.0 has type float"),
        ({"newer_than": False}, TypeError, "newer_than=False"),
        ({"poll_interval": 0}, ValueError, "poll_interval=0 must be more than 0 and at most 3600"),
        ({"poll_interval": 3601}, ValueError, "poll_interval=3601"),
        ({"poll_interval": "5"}, TypeError, "poll_interval='5' must be seconds"),
        ({"poke_interval": 5}, TypeError, "pass poll_interval="),
        ({"mode": "reschedule"}, ValueError, "mode='reschedule' applies only with deferrable=False"),
        ({"deferrable": "yes"}, TypeError, "deferrable='yes'"),
        ({"aws_conn_id": 3}, TypeError, "aws_conn_id=3 must be an Airflow connection id"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        CheckpointSensor(task_id="bad", **{"uri": "file:///tmp/x", **kwargs})


def test_good_arguments() -> None:
    sensor = CheckpointSensor(
        task_id="ok", uri="{{ var.value.ckpt }}", newer_than="previous_run", poll_interval=timedelta(seconds=90)
    )
    assert (sensor.deferrable, sensor.poke_interval, sensor.newer_than) == (True, 90.0, "previous_run")
    reschedule = CheckpointSensor(task_id="r", uri="file:///tmp/x", deferrable=False, mode="reschedule")
    assert reschedule.mode == "reschedule"


def test_a_templated_newer_than_that_renders_to_no_step_is_refused(tmp_path: Path) -> None:
    sensor = CheckpointSensor(task_id="t", uri=tmp_path.as_uri(), newer_than="{{ params.x }}", deferrable=False)
    sensor.newer_than = "twelve"  # what rendering gave
    with pytest.raises(ValueError, match="newer_than='twelve' is not a step"):
        sensor.poke({})  # type: ignore[arg-type]
