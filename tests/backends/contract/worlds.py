"""Backend worlds: one small class per backend that the contract suite runs against.

A world knows how to build its backend (short poll and job times), how to build requests with a
task key no other test uses, and how to make its service misbehave (the fault knobs). The tests in
this folder talk to the backend only through :class:`~gpu_provider.backends.base.Backend`; what a
service does differently lives here, once per backend.

Adding a backend (SageMaker, Kubernetes): write a ``BackendWorld`` subclass over its emulator,
add it to :data:`WORLDS`, and every contract test runs against it. A world whose backend declares
``capabilities.restarts_inside_job`` must implement :meth:`BackendWorld.restart_inside`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from gpu_provider import names
from gpu_provider.backends.base import (
    Backend,
    Capabilities,
    JobHandle,
    JobIdentity,
    JobRequest,
    JobState,
    JobStatus,
    LogChunk,
    TaskKey,
)
from gpu_provider.backends.base import backend_class as registered_backend_class
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.local import common as local_common
from gpu_provider.backends.local import gpus as local_gpus
from gpu_provider.exceptions import GpuJobStatusError
from gpu_provider.job import GpuResources
from tests.batch_world import BatchWorld
from tests.harness import wait_for
from tests.kubernetes_world import KubernetesWorld
from tests.sagemaker_world import SageMakerWorld

#: seconds between two status reads while a test waits (each read may be an HTTP call)
POLL_S = 0.2
#: the longest a test waits for a job to reach a state
WAIT_S = 30.0
#: an image name for backends that need one (the emulators run the command on this host)
IMAGE = "contract-test:1"
#: how long after its submission a service forgets a job in :meth:`BackendWorld.forget` (Batch keeps
#: ended jobs for about a day at least)
FORGOTTEN_AFTER_S = 86_400.0


def py(code: str) -> tuple[str, ...]:
    """A job command: ``code`` run by this interpreter (which every emulator can start)."""
    return (sys.executable, "-c", textwrap.dedent(code))


#: a job that runs about 60 s unless stopped (tests stop it long before; on a loaded machine a test's own
#: waits can take tens of seconds, and a 10 s job then ended under a test that needed it running)
LONG_JOB = py(
    """
    import time
    for i in range(600):
        print('tick', i, flush=True)
        time.sleep(0.1)
    """
)


class BackendWorld(ABC):
    """One backend and its emulator, as the contract suite sees them."""

    #: the world's name, also the pytest id of its tests: the registered name of its backend
    name: ClassVar[str]
    #: a piece of ``JobStatus.reason`` while a job waits for held capacity; ``None``: the service
    #: gives no reason then (the test asserts only that the job stays queued)
    held_reason: ClassVar[str | None] = None

    @classmethod
    def backend_class(cls) -> type[Backend]:
        """The backend class under test, from the registry (its ``capabilities`` decide which tests run)."""
        return registered_backend_class(cls.name)

    @classmethod
    @abstractmethod
    def create(cls, request: pytest.FixtureRequest, tmp_path: Path) -> BackendWorld:
        """Build the world, asking pytest only for the fixtures (emulators) this world needs."""

    @abstractmethod
    def backend(self) -> Backend:
        """A backend configured for this world; every call builds a new object with the same options
        (as another worker process would), so tests can show that the service holds the state."""

    def task(self, name_suffix: str, *, map_index: int = -1) -> TaskKey:
        """A task instance key no other test uses (its run id is unique)."""
        return TaskKey(f"contract_{name_suffix}", "job", f"manual__{uuid.uuid4().hex[:12]}", map_index)

    def request(
        self,
        name_suffix: str,
        command: Sequence[str],
        *,
        task: TaskKey | None = None,
        capacity: str = names.ON_DEMAND,
        nodes: int = 1,
        try_number: int = 1,
        attempt: int = 1,
        env: Mapping[str, str] | None = None,
    ) -> JobRequest:
        """A request for one attempt of ``task`` (default: a new task named after ``name_suffix``)."""
        identity = JobIdentity(
            task if task is not None else self.task(name_suffix),
            try_number=try_number,
            attempt=attempt,
            capacity=capacity,
        )
        return JobRequest(
            identity=identity,
            command=tuple(command),
            env={names.ENV_ATTEMPT: str(attempt), names.ENV_CAPACITY: capacity, **(env or {})},
            resources=GpuResources(gpus=1, nodes=nodes),
            capacity=capacity,
            image=IMAGE,
        )

    # --- fault knobs ---------------------------------------------------------------------------

    @abstractmethod
    def preempt(self, handle: JobHandle) -> None:
        """Reclaim the running job's spot capacity now."""

    @abstractmethod
    def hold_capacity(self) -> None:
        """From now on, jobs wait for capacity (stay ``QUEUED``) until :meth:`release_capacity`."""

    @abstractmethod
    def release_capacity(self) -> None:
        """Let waiting jobs start."""

    def forget(self, handle: JobHandle) -> JobHandle:
        """Make the service forget an ended job, as when its retention ran out; returns the handle as
        its holder has it by then, submitted :data:`FORGOTTEN_AFTER_S` ago (a backend may take a job
        missing soon after its submission for one the service does not show yet)."""
        self._forget(handle)
        return replace(handle, submitted_at=handle.submitted_at - FORGOTTEN_AFTER_S)

    @abstractmethod
    def _forget(self, handle: JobHandle) -> None:
        """The service's side of :meth:`forget`."""

    @abstractmethod
    def break_state(self, handle: JobHandle) -> str:
        """Make the service report, for this ended job only, a state the backend's table does not
        know; returns that state (the backend's error should name it)."""

    def restart_inside(self, handle: JobHandle) -> None:
        """Interrupt the running job so that the service restarts it inside the same attempt.

        Only for worlds whose backend declares ``capabilities.restarts_inside_job``; the suite
        never calls it on the others.
        """
        raise AssertionError(
            f"{self.name} world: {self.backend_class().__name__} does not restart jobs inside an attempt "
            "(capabilities.restarts_inside_job is False); no test should ask for it"
        )

    @abstractmethod
    def cleanup(self) -> None:
        """Stop whatever the test left running (called by the ``world`` fixture, also on failure)."""


class LocalBackendWorld(BackendWorld):
    """The local backend: jobs are processes; the state directory is the service.

    Capacity is the GPU ledger of the state directory: the world declares eight devices (CPU-only
    jobs are never held) and holds them all under a ledger entry owned by the test process.
    """

    name = "local"
    held_reason = "GPU"
    #: devices the backend is told it has (no nvidia-smi asked; the jobs only print)
    devices = tuple(range(8))
    _HOLD_ID = "contract-capacity-hold"

    def __init__(self, tmp_path: Path) -> None:
        self.state_dir = tmp_path / "local-state"

    @classmethod
    def create(cls, request: pytest.FixtureRequest, tmp_path: Path) -> LocalBackendWorld:
        return cls(tmp_path)

    def backend(self) -> LocalBackend:
        return LocalBackend(state_dir=str(self.state_dir), grace_period=0.5, gpus=list(self.devices))

    def _job_dir(self, handle: JobHandle) -> Path:
        job_dir = handle.extra.get("job_dir")
        return Path(job_dir) if job_dir else self.state_dir / local_common.JOBS_DIR / handle.job_id

    def preempt(self, handle: JobHandle) -> None:
        self.backend().simulate_preemption(handle)

    def hold_capacity(self) -> None:
        pid = os.getpid()
        held = local_gpus.allocate(
            self.state_dir,
            self._HOLD_ID,
            owner_pid=pid,
            owner_start=local_common.process_start_time(pid),
            devices=self.devices,
            gpus=len(self.devices),
            nodes=1,
        )
        assert isinstance(held, local_gpus.Allocation), f"could not hold every GPU of the ledger: {held}"

    def release_capacity(self) -> None:
        local_gpus.release(self.state_dir, self._HOLD_ID)

    def _forget(self, handle: JobHandle) -> None:
        # the local service's memory of a job is its folder (what retention_days prunes)
        shutil.rmtree(self._job_dir(handle))

    def break_state(self, handle: JobHandle) -> str:
        status_file = self._job_dir(handle) / local_common.STATUS_FILE
        status = json.loads(status_file.read_text())
        assert status.get("state") in local_common.TERMINAL_STATES, f"break_state wants an ended job: {status}"
        unknown = "state-from-a-newer-version"
        local_common.write_json_atomic(status_file, {**status, "state": unknown})
        return unknown

    def cleanup(self) -> None:
        self.release_capacity()
        backend = self.backend()
        for handle in backend.list_jobs():
            backend.cancel(handle, "contract test teardown")


class BatchBackendWorld(BackendWorld):
    """AWS Batch on the Batch emulator (moto server, jobs run as local processes).

    The session's emulator steps a job from SUBMITTED to RUNNING in about 1.2 s; the ``batch``
    fixture resets its faults and terminates the jobs a test left active.
    """

    name = "batch"
    held_reason = None

    def __init__(self, batch: BatchWorld) -> None:
        self.batch = batch
        self.emulator = batch.emulator

    @classmethod
    def create(cls, request: pytest.FixtureRequest, tmp_path: Path) -> BatchBackendWorld:
        return cls(request.getfixturevalue("batch"))

    def backend(self) -> Backend:
        return self.backend_class().from_options(**self.batch.queues)

    def _queues(self) -> list[str]:
        return [self.batch.setup.spot_queue, self.batch.setup.on_demand_queue]

    def preempt(self, handle: JobHandle) -> None:
        self.emulator.preempt(handle.job_id)

    def hold_capacity(self) -> None:
        for queue in self._queues():
            self.emulator.hold(queue)

    def release_capacity(self) -> None:
        for queue in self._queues():
            self.emulator.release(queue)

    def _forget(self, handle: JobHandle) -> None:
        self.emulator.forget(handle.job_id)

    def break_state(self, handle: JobHandle) -> str:
        unknown = "ARCHIVED"  # not a Batch state today; the shape of one a newer Batch could add
        self.emulator.report_status(handle.job_id, unknown)
        return unknown

    def cleanup(self) -> None:
        self.release_capacity()


class KubernetesBackendWorld(BackendWorld):
    """Kubernetes on the fake API server (``gpu_provider/testing/emulators/kubernetes.py``): pods run as local
    processes on emulated Karpenter nodes that come up 0.3 s after a pod asks; a held capacity is a shortage of
    both capacity types (pods stay ``Pending``, ``Unschedulable``); a preemption reclaims the spot
    node under the pod. The ``kubernetes`` fixture deletes whatever a test left.
    """

    name = "kubernetes"
    held_reason = "capacity"

    def __init__(self, kubernetes: KubernetesWorld) -> None:
        self.kubernetes = kubernetes
        self.emulator = kubernetes.emulator

    @classmethod
    def create(cls, request: pytest.FixtureRequest, tmp_path: Path) -> KubernetesBackendWorld:
        return cls(request.getfixturevalue("kubernetes"))

    def backend(self) -> Backend:
        return self.backend_class().from_options()

    def _pod(self, handle: JobHandle) -> str:
        if handle.extra.get("kind") == "Job":
            pods = [p for p in self.emulator.objects("pods") if p["metadata"]["labels"].get("job-name") == handle.name]
            assert pods, f"job {handle.name} has no pods"
            return str(pods[0]["metadata"]["name"])
        return handle.name

    def preempt(self, handle: JobHandle) -> None:
        self.emulator.reclaim(self._pod(handle))

    def hold_capacity(self) -> None:
        for capacity in names.CAPACITY_TYPES:
            self.emulator.set_shortage(capacity)

    def release_capacity(self) -> None:
        for capacity in names.CAPACITY_TYPES:
            self.emulator.set_shortage(capacity, False)

    def _forget(self, handle: JobHandle) -> None:
        self.emulator.forget("jobs" if handle.extra.get("kind") == "Job" else "pods", handle.name)

    def break_state(self, handle: JobHandle) -> str:
        unknown = "Archived"  # not a pod phase today; the shape of one a newer Kubernetes could add
        self.emulator.report_phase(self._pod(handle), unknown)
        return unknown

    def cleanup(self) -> None:
        self.release_capacity()


class SageMakerBackendWorld(BackendWorld):
    """SageMaker training jobs on the SageMaker emulator (hosts run as local processes).

    Capacity is held in the emulator (jobs wait in Starting); a preemption is a managed-spot reclaim the
    job does not come back from (Stopped/Interrupted), and :meth:`restart_inside` is the usual reclaim,
    which SageMaker restarts inside the same training job.
    """

    name = "sagemaker"
    held_reason = None

    def __init__(self, sagemaker: SageMakerWorld) -> None:
        self.sagemaker = sagemaker
        self.emulator = sagemaker.emulator

    @classmethod
    def create(cls, request: pytest.FixtureRequest, tmp_path: Path) -> SageMakerBackendWorld:
        return cls(request.getfixturevalue("sagemaker"))

    def backend(self) -> Backend:
        return self.backend_class().from_options(**self.sagemaker.options)

    def preempt(self, handle: JobHandle) -> None:
        self.emulator.interrupt(handle.job_id, restart=False)

    def restart_inside(self, handle: JobHandle) -> None:
        self.emulator.interrupt(handle.job_id)

    def hold_capacity(self) -> None:
        self.emulator.hold(names.SPOT)
        self.emulator.hold(names.ON_DEMAND)

    def release_capacity(self) -> None:
        self.emulator.release()

    def _forget(self, handle: JobHandle) -> None:
        self.emulator.forget(handle.job_id)

    def break_state(self, handle: JobHandle) -> str:
        self.emulator.report_status(handle.job_id, "Archived", "Archived")  # the shape of a state SageMaker could add
        return "Archived/Archived"

    def cleanup(self) -> None:
        self.release_capacity()


#: every world the suite runs against, by name (the ``world`` fixture's parameters)
WORLDS: dict[str, type[BackendWorld]] = {
    "local": LocalBackendWorld,
    "batch": BatchBackendWorld,
    "kubernetes": KubernetesBackendWorld,
    "sagemaker": SageMakerBackendWorld,
}


def worlds_where(capable: Callable[[Capabilities], bool]) -> list[str]:
    """Names of the worlds whose backend declares what ``capable`` asks (read from the class, no service started)."""
    return [name for name, world in WORLDS.items() if capable(world.backend_class().capabilities)]


# --- reading through the contract -----------------------------------------------------------------


def poll_one(backend: Backend, handle: JobHandle) -> JobStatus:
    """The status of one job; a per-job error fails the test with the backend's message."""
    result = backend.poll([handle])
    assert handle.job_id in result, f"poll answered {sorted(result)} without an entry for {handle.job_id}"
    entry = result[handle.job_id]
    if isinstance(entry, GpuJobStatusError):
        raise AssertionError(f"poll could not read job {handle.job_id}: {entry}")
    assert isinstance(entry, JobStatus), f"poll entry for {handle.job_id} is a {type(entry).__name__}"
    return entry


def wait_status(
    backend: Backend,
    handle: JobHandle,
    accept: Callable[[JobStatus], bool],
    what: str,
    *,
    timeout: float = WAIT_S,
) -> JobStatus:
    """Poll (every :data:`POLL_S`) until ``accept`` takes the status; fail naming ``what`` and the last status."""
    last: list[JobStatus] = []
    next_read = [0.0]

    def check() -> JobStatus | None:
        if time.monotonic() < next_read[0]:
            return None
        next_read[0] = time.monotonic() + POLL_S
        status = poll_one(backend, handle)
        last[:] = [status]
        return status if accept(status) else None

    try:
        return wait_for(check, timeout, f"job {handle.job_id} {what}")  # type: ignore[no-any-return]
    except AssertionError as err:
        raise AssertionError(f"{err}; last status: {last[0] if last else None}") from None


def wait_state(backend: Backend, handle: JobHandle, *states: JobState, timeout: float = WAIT_S) -> JobStatus:
    """Poll until the job is in one of ``states``."""
    return wait_status(
        backend, handle, lambda s: s.state in states, f"to reach {[s.value for s in states]}", timeout=timeout
    )


def wait_ended(backend: Backend, handle: JobHandle, *, timeout: float = WAIT_S) -> JobStatus:
    """Poll until the job is in a terminal state."""
    return wait_status(backend, handle, lambda s: s.state.terminal, "to end", timeout=timeout)


def drain_logs(
    backend: Backend, handle: JobHandle, cursor: str | None = None, *, max_bytes: int
) -> tuple[list[LogChunk], str | None]:
    """Read ``logs`` from ``cursor`` until a chunk says ``more=False``; the chunks and the last cursor."""
    chunks: list[LogChunk] = []
    for _ in range(10_000):  # a backend that always says more=True fails here, not by hanging
        chunk = backend.logs(handle, cursor, max_bytes=max_bytes)
        chunks.append(chunk)
        cursor = chunk.cursor
        if not chunk.more:
            return chunks, cursor
    raise AssertionError(f"logs of {handle.job_id} still said more=True after 10000 reads")


def read_until(
    backend: Backend, handle: JobHandle, found: Callable[[list[str]], bool], *, timeout: float = 15.0
) -> list[str]:
    """Read the whole log from the start until ``found`` takes its lines: a service may deliver an
    ended job's last lines a little later (``log_settle_s``)."""
    lines: list[str] = []

    def check() -> bool:
        chunks, _ = drain_logs(backend, handle, None, max_bytes=1 << 20)
        lines[:] = [line for chunk in chunks for line in chunk.lines]
        return found(lines)

    try:
        wait_for(check, timeout, f"the log of job {handle.job_id}")
    except AssertionError as err:
        raise AssertionError(f"{err}; its lines: {lines[-20:]}") from None
    return lines


def marked(lines: Sequence[str], pattern: re.Pattern[str]) -> list[re.Match[str]]:
    """The matches of ``pattern`` in log lines (backends prefix lines with their stream's name)."""
    return [m for line in lines if (m := pattern.search(line))]
