"""SageMaker's batched poll: an interruption is seen within a bound even when ``LastModifiedTime``
does not move, and what the poll keeps stays bounded however long its process lives.

The batched poll finds changed jobs with ``ListTrainingJobs(LastModifiedTimeAfter=...)``. Whether AWS
moves ``LastModifiedTime`` when only ``SecondaryStatus`` changes (a managed-spot ``Interrupted``)
is not documented: the emulator's ``modified_with_status_only`` mode says it does not, and the
backend must still see the interruption within ``full_describe_every`` ticks.
"""

from __future__ import annotations

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobStatus
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.backends.sagemaker.backend import DESCRIBE_EACH_UP_TO
from gpu_provider.backends.sagemaker.cache import KEEP_TICKS, JobCache
from gpu_provider.testing.dagrun import wait_for
from gpu_provider.testing.worlds import SageMakerWorld
from tests.backends.contract.worlds import LONG_JOB, SageMakerBackendWorld

#: the bound under test (ticks)
EVERY = 4


def _statuses(backend: SageMakerBackend, handles: list[JobHandle]) -> dict[str, JobStatus]:
    result = backend.poll(handles)
    out = {}
    for handle in handles:
        status = result[handle.job_id]
        assert isinstance(status, JobStatus), status
        out[handle.job_id] = status
    return out


def _spot_jobs(world: SageMakerBackendWorld, backend: SageMakerBackend, count: int) -> list[JobHandle]:
    return [backend.submit(world.request(f"bound{i}", LONG_JOB, capacity=names.SPOT)) for i in range(count)]


def test_an_interruption_is_seen_within_the_full_describe_bound(sagemaker: SageMakerWorld) -> None:
    """Issue 24.8: with LastModifiedTime moving only with TrainingJobStatus, ``Interrupted`` is seen
    within ``full_describe_every`` ticks; a poll that trusted the list alone never sees it."""
    world = SageMakerBackendWorld(sagemaker)
    emulator = sagemaker.emulator
    emulator.modified_with_status_only()
    emulator.hold(names.SPOT)  # the jobs wait in Starting: no host processes
    bounded = SageMakerBackend(**sagemaker.options, full_describe_every=EVERY)
    trusting = SageMakerBackend(**sagemaker.options, full_describe_every=10**9)  # the list alone decides
    handles = _spot_jobs(world, bounded, DESCRIBE_EACH_UP_TO + 1)  # more than described one by one: batched
    for backend in (bounded, trusting):
        assert all(s.restarts == 0 for s in _statuses(backend, handles).values())
        _statuses(backend, handles)  # the list said nothing changed: nothing described

    victim = handles[0]
    emulator.interrupt(victim.job_id)  # reclaimed; SageMaker restarts it inside the job, InProgress throughout
    wait_for(
        lambda: "Interrupted" in [t["Status"] for t in sagemaker.describe(victim.job_id)["SecondaryStatusTransitions"]],
        30,
        "the emulator to interrupt the job",
    )
    assert sagemaker.describe(victim.job_id)["TrainingJobStatus"] == "InProgress"

    seen_at = None
    for tick in range(1, 2 * EVERY + 1):
        if _statuses(bounded, handles)[victim.job_id].restarts >= 1 and seen_at is None:
            seen_at = tick
        assert _statuses(trusting, handles)[victim.job_id].restarts == 0, "the list listed the change after all"
    assert seen_at is not None and seen_at <= EVERY, f"the interruption was seen at tick {seen_at}, bound {EVERY}"


def test_the_full_describe_bound_comes_from_config(sagemaker: SageMakerWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__SAGEMAKER_FULL_DESCRIBE_EVERY", "3")
    assert SageMakerBackend(**sagemaker.options).full_describe_every == 3
    assert SageMakerBackend(**sagemaker.options, full_describe_every="7").full_describe_every == 7
    with pytest.raises(ValueError, match="full_describe_every=0"):
        SageMakerBackend(**sagemaker.options, full_describe_every=0)


def test_the_poll_cache_stays_bounded_over_10000_ticks_of_new_jobs() -> None:
    """Issue 24.12: 3 new jobs each tick, each watched for 4 ticks: the cache holds what is watched, not history."""
    cache = JobCache(full_describe_every=10)
    watched: list[list[str]] = []
    most = 0
    for tick in range(10_000):
        cache.next_tick()
        watched = [*watched[-3:], [f"job-{tick}-{i}" for i in range(3)]]
        for name in (n for batch in watched for n in batch):
            if name in cache:
                cache.ask(name)
            else:
                cache.put(name, float(tick), {"TrainingJobStatus": "InProgress"}, {})
        most = max(most, len(cache))
    assert most <= 3 * (4 + KEEP_TICKS), most
    assert len(cache) <= 3 * (4 + KEEP_TICKS)


def test_the_backend_forgets_jobs_no_poll_asks_about(sagemaker: SageMakerWorld) -> None:
    """Issue 24.12, through the backend: the triggerer's poller stops asking about ended jobs; they go."""
    world = SageMakerBackendWorld(sagemaker)
    sagemaker.emulator.hold(names.SPOT)
    backend = SageMakerBackend(**sagemaker.options)
    first, second = _spot_jobs(world, backend, 3), _spot_jobs(world, backend, 3)
    _statuses(backend, first)
    assert all(h.job_id in backend._seen for h in first)
    for _ in range(KEEP_TICKS + 1):
        _statuses(backend, second)
    assert not any(h.job_id in backend._seen for h in first), "jobs no poll asked about are still kept"
    assert all(h.job_id in backend._seen for h in second)
    assert len(backend._seen) == len(second)
    # lookups and the reaper's listing keep nothing
    for handle in first:
        backend.task_of(handle)
    backend.list_owned()
    assert len(backend._seen) == len(second)
