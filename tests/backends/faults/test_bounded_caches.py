"""No cache of a long-lived process grows without end (issue 24.12).

A triggerer's shared poller, and the backend object it polls through, live as long as the
triggerer; the jobs they watch come and go. The SageMaker poll cache has its own tests
(``test_sagemaker_polling.py``); here: the shared poller's tables, and the Batch backend's job
definitions. The Kubernetes backend keeps nothing between reads, and the local backend's only
module-level memory is a fixed set of once-only warnings and the supervisors still running.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus, resolve_backend
from gpu_provider.backends.batch import backend as batch_backend
from gpu_provider.backends.common import keep_bounded
from gpu_provider.testing.worlds import BatchWorld
from gpu_provider.triggers.gpu_job import SharedPoller
from tests.backends.contract.worlds import BatchBackendWorld, py
from tests.scripted import ScriptedBackend, scripted  # noqa: F401 (fixture)

TICKS = 10_000
#: ticks a job is watched before it ends
LIFETIME = 3


def _handle(job_id: str) -> JobHandle:
    return JobHandle("scripted", job_id, f"gp-{job_id}", 1, names.ON_DEMAND, time.time())


@pytest.mark.usefixtures("scripted")
def test_the_shared_poller_keeps_only_the_jobs_still_watched() -> None:
    """10,000 ticks, a new job each tick, each ending 3 ticks later: the poller's tables stay small."""
    running = JobStatus(state=JobState.RUNNING)
    ended = JobStatus(state=JobState.SUCCEEDED)

    async def scenario() -> int:
        backend = resolve_backend({"name": "scripted"})
        poller = SharedPoller.for_backend(backend, 0)
        keeper = _handle("keeper")  # keeps the poller alive between the jobs
        ScriptedBackend.table[keeper.job_id] = running
        keeper_queue = poller.subscribe(keeper)
        watching: dict[str, tuple[JobHandle, asyncio.Queue[JobStatus | BaseException]]] = {}
        most = 0
        for tick in range(TICKS):
            handle = _handle(f"job-{tick}")
            ScriptedBackend.table[handle.job_id] = running
            watching[handle.job_id] = (handle, poller.subscribe(handle))
            if tick >= LIFETIME:
                ScriptedBackend.table[f"job-{tick - LIFETIME}"] = ended
            before = poller.ticks
            while poller.ticks == before:
                await asyncio.sleep(0)
            for job_id, (h, queue) in list(watching.items()):
                while not queue.empty():
                    item = queue.get_nowait()
                    if isinstance(item, JobStatus) and item.state.terminal:
                        poller.unsubscribe(h, queue)  # its trigger fired and left
                        watching.pop(job_id, None)
                        ScriptedBackend.table.pop(job_id, None)  # the service's memory is not ours to bound
                        break
            most = max(most, len(poller._subscribers), len(poller._ended))
        for h, queue in watching.values():
            poller.unsubscribe(h, queue)
        poller.unsubscribe(keeper, keeper_queue)
        return most

    most = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert most <= LIFETIME + 3, most
    # the poller counts a tick when it starts it: the last tick's poll may still be in flight when the loop ends
    assert len(ScriptedBackend.polls) >= TICKS - 1


def test_keep_bounded_forgets_the_oldest() -> None:
    cache: dict[str, int] = {}
    for n in range(TICKS):
        keep_bounded(cache, f"definition-{n}", n, limit=64)
        assert len(cache) <= 64
    assert list(cache) == [f"definition-{n}" for n in range(TICKS - 64, TICKS)]
    keep_bounded(cache, f"definition-{TICKS - 64}", -1, limit=64)  # used again: newest now
    assert list(cache)[-1] == f"definition-{TICKS - 64}" and len(cache) == 64


def test_the_batch_backend_remembers_a_bounded_number_of_job_definitions(
    batch: BatchWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each task (and each content: a templated command) has its own job definition: the ARNs kept are bounded."""
    monkeypatch.setattr(batch_backend, "DEFINITIONS_KEPT", 2)
    world = BatchBackendWorld(batch)
    world.hold_capacity()
    try:
        backend = world.backend()
        handles = [backend.submit(world.request(f"def{n}", py(f"print({n})"))) for n in range(3)]
        assert len(backend._known_definitions()) == 2  # type: ignore[attr-defined]
        assert len(batch.bodies("RegisterJobDefinition")) == 3
        for handle in handles:
            backend.cancel(handle, "bounded caches test teardown")
    finally:
        world.release_capacity()
