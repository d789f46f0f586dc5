"""GpuJobTrigger and the shared poller, against the real local backend."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, JobStatus, TaskKey, register_backend
from gpu_provider.backends.local import LocalBackend
from gpu_provider.job import GpuResources
from gpu_provider.triggers.gpu_job import GpuJobTrigger, SharedPoller
from tests.harness import pid_alive, wait_for


class CountingLocalBackend(LocalBackend):
    """The real local backend, counting how many status calls reach it and how many jobs each carried."""

    name = "counting_local"
    calls: list[int] = []

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        CountingLocalBackend.calls.append(len(handles))
        return super().poll(handles)


@pytest.fixture
def counting_backend_registered() -> Iterator[None]:
    from gpu_provider.backends import base

    register_backend("counting_local", f"{__name__}.CountingLocalBackend")
    yield
    del base._REGISTRY["counting_local"]


def _request(n: int, command: list[str], capacity: str = "on-demand", gpus: float = 1) -> JobRequest:
    identity = JobIdentity(TaskKey("dag", f"task{n}", "run1"), try_number=1, attempt=1, capacity=capacity)
    return JobRequest(
        identity=identity,
        command=tuple(command),
        env={},
        resources=GpuResources(gpus=gpus),
        capacity=capacity,
    )


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    be = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    yield be
    for handle in be.list_jobs():
        be.cancel(handle, "test teardown")


def _cleanup(backend: LocalBackend, handles: list[JobHandle]) -> None:
    for handle in handles:
        backend.cancel(handle, "test teardown")


async def _first_event(trigger: GpuJobTrigger, timeout: float = 30) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)


def test_serialise_round_trip(tmp_path: Path) -> None:
    be = LocalBackend(state_dir=str(tmp_path), simulate_preemptions=[4, 2], grace_period=1.5)
    handle = JobHandle("local", "job-1", "gp-x", 2, "spot", 1700000000.5, {"job_dir": "/x"})
    trigger = GpuJobTrigger(backend=be.spec(), handle=handle.to_dict(), poll_interval=3, spot_wait_timeout=60)
    classpath, kwargs = trigger.serialize()
    assert classpath == "gpu_provider.triggers.gpu_job.GpuJobTrigger"
    import json

    rebuilt_kwargs = json.loads(json.dumps(kwargs))  # what the triggerer stores is JSON
    rebuilt = GpuJobTrigger(**rebuilt_kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert JobHandle.from_dict(rebuilt.handle) == handle
    from gpu_provider.backends.base import resolve_backend

    assert resolve_backend(rebuilt.backend) == be


def test_trigger_fires_succeeded_and_failed(backend: LocalBackend) -> None:
    ok = backend.submit(_request(1, [sys.executable, "-c", "print('hello')"]))
    bad = backend.submit(_request(2, [sys.executable, "-c", "import sys; sys.exit(3)"]))
    try:

        async def both() -> list[dict[str, Any]]:
            return list(
                await asyncio.gather(
                    _first_event(GpuJobTrigger(backend=backend.spec(), handle=ok.to_dict(), poll_interval=0.2)),
                    _first_event(GpuJobTrigger(backend=backend.spec(), handle=bad.to_dict(), poll_interval=0.2)),
                )
            )

        good, failed = asyncio.run(both())
        assert good["status"] == "succeeded"
        assert good["job_status"]["state"] == "SUCCEEDED"
        assert failed["status"] == "failed"
        assert failed["job_status"]["exit_code"] == 3
        assert "exited with code 3" in failed["job_status"]["reason"]
    finally:
        _cleanup(backend, [ok, bad])


@pytest.mark.usefixtures("counting_backend_registered")
def test_shared_poller_batches_all_waiting_jobs_in_one_call(tmp_path: Path) -> None:
    be = CountingLocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    handles = [be.submit(_request(i, [sys.executable, "-c", "import time; time.sleep(1.5)"])) for i in range(12)]
    CountingLocalBackend.calls = []
    try:

        async def all_of_them() -> list[dict[str, Any]]:
            triggers = [GpuJobTrigger(backend=be.spec(), handle=h.to_dict(), poll_interval=0.3) for h in handles]
            return list(await asyncio.gather(*(_first_event(t, timeout=60) for t in triggers)))

        events = asyncio.run(all_of_them())
    finally:
        _cleanup(be, handles)
    assert [e["status"] for e in events] == ["succeeded"] * 12
    # one call per tick carried every job still waiting: the first tick saw all 12 jobs at once
    assert CountingLocalBackend.calls[0] == 12
    per_trigger_calls = len(CountingLocalBackend.calls)
    assert per_trigger_calls < 12 * 2, CountingLocalBackend.calls
    assert SharedPoller._pollers == {}, "the poller must go away when nobody waits"


def test_trigger_on_kill_cancels_the_job(backend: LocalBackend) -> None:
    handle = backend.submit(_request(3, [sys.executable, "-c", "import time; time.sleep(60)"]))
    try:
        trigger = GpuJobTrigger(backend=backend.spec(), handle=handle.to_dict(), poll_interval=0.2)

        wait_for(lambda: backend.poll([handle])[handle.job_id].state.value == "RUNNING", 20, "the job to run")

        async def kill_then_wait() -> dict[str, Any]:
            await trigger.on_kill()
            return await _first_event(
                GpuJobTrigger(backend=backend.spec(), handle=handle.to_dict(), poll_interval=0.2), timeout=20
            )

        event = asyncio.run(kill_then_wait())
        assert event["status"] == "cancelled"
        assert "killed while deferred" in event["job_status"]["reason"]
        pids = backend.job_pids(handle)
        assert pids, "the job's node pids are recorded"
        for pid in pids:
            assert not pid_alive(pid)
    finally:
        _cleanup(backend, [handle])


def test_capacity_timeout_for_spot_job_that_never_starts(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 0\n")
    fake.chmod(0o755)
    be = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5, nvidia_smi=str(fake))
    hog = be.submit(_request(4, [sys.executable, "-c", "import time; time.sleep(30)"]))
    wait_for(lambda: be.poll([hog])[hog.job_id].state.value == "RUNNING", 20, "the GPU hog to run")
    spot = be.submit(_request(5, [sys.executable, "-c", "print('never')"], capacity="spot"))
    try:
        trigger = GpuJobTrigger(backend=be.spec(), handle=spot.to_dict(), poll_interval=0.2, spot_wait_timeout=1.0)
        event = asyncio.run(_first_event(trigger))
        assert event["status"] == "capacity_timeout"
        assert event["job_status"]["state"] == "QUEUED"
        assert "(capacity_timeout)" in event["message"]
    finally:
        _cleanup(be, [hog, spot])
