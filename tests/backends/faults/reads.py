"""What a service was asked to change: each world's record of mutating requests, for "a read never acts".

The remote worlds read their emulator's request log (every request the backend sent, by action); the
local world's service is its state directory and its processes, so there the evidence is the job
folders' files and the signals the job's own handler recorded.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from gpu_provider.backends.base import JobHandle
from gpu_provider.backends.local import common as local_common
from tests.backends.contract.worlds import (
    BackendWorld,
    BatchBackendWorld,
    KubernetesBackendWorld,
    LocalBackendWorld,
    SageMakerBackendWorld,
    py,
)

#: AWS actions (Batch, SageMaker, CloudWatch Logs) that only read
_AWS_READ = re.compile(r"^(logs:)?(Describe|List|Get|Filter|Search|BatchGet)")
#: verbs of the fake Kubernetes API server's log that only read
_K8S_READS = ("get", "list", "watch")


#: the environment variable naming the file :data:`SIGNAL_RECORDING_JOB` appends the signals it gets to
SIGNAL_MARKER_ENV = "SIGNAL_MARKER"

#: a job that runs about 30 s and appends every SIGHUP/SIGINT/SIGUSR1/SIGTERM it gets to ``$SIGNAL_MARKER``
#: (short: SageMaker takes at most 256 characters per argument)
SIGNAL_RECORDING_JOB = py(
    """
    import os,signal,time
    def r(n,f): open(os.environ['SIGNAL_MARKER'],'a').write(str(n)+'\\n')
    for s in (1,2,10,15): signal.signal(s,r)
    print('started',flush=True)
    t=time.time()+30
    while time.time()<t: time.sleep(0.05)
    """
)


class MutationWatch:
    """Remembers where a world's service stood; :meth:`changes` lists what was asked of it since."""

    def __init__(self, world: BackendWorld) -> None:
        self.world = world
        self._since = 0
        self._files: dict[str, bytes] = {}

    def start(self) -> MutationWatch:
        world = self.world
        if isinstance(world, LocalBackendWorld):
            self._files = self._local_files(world)
        else:
            self._since = len(self._requests())
        return self

    def _requests(self) -> list[dict[str, object]]:
        world = self.world
        if isinstance(world, (BatchBackendWorld, SageMakerBackendWorld, KubernetesBackendWorld)):
            return world.emulator.requests(since=self._since)  # type: ignore[no-any-return]
        raise AssertionError(f"no request log for the {world.name} world")

    @staticmethod
    def _local_files(world: LocalBackendWorld) -> dict[str, bytes]:
        """Every file of the state directory but the ones a live supervisor rewrites as its job runs."""
        root = world.state_dir
        out = {}
        for path in sorted(root.rglob("*")):
            if path.is_file() and not _written_by_a_live_supervisor(path):
                out[str(path.relative_to(root))] = path.read_bytes()
        return out

    def changes(self) -> list[str]:
        """What the service was asked to change since :meth:`start` (empty: nothing)."""
        world = self.world
        if isinstance(world, LocalBackendWorld):
            now = self._local_files(world)
            return [
                f"{name}: {'created' if name not in self._files else 'removed' if name not in now else 'changed'}"
                for name in sorted(set(self._files) | set(now))
                if self._files.get(name) != now.get(name)
            ]
        if isinstance(world, KubernetesBackendWorld):
            return [str(r["action"]) for r in self._requests() if str(r["action"]).split()[0] not in _K8S_READS]
        return [str(r["action"]) for r in self._requests() if not _AWS_READ.match(str(r["action"]))]


def _written_by_a_live_supervisor(path: Path) -> bool:
    """A running job's supervisor rewrites its status (heartbeat), appends to its logs and updates the GPU
    ledger; a read writes none of them, and an ended job's status must stay as it is."""
    if path.name in (local_common.ALLOC_FILE, local_common.ALLOC_LOCK_FILE) or path.suffix == ".log":
        return True
    if path.name == local_common.STATUS_FILE:
        status = local_common.read_json(path) or {}
        return status.get("state") not in local_common.TERMINAL_STATES
    return False


def break_reads(world: BackendWorld, handle: JobHandle) -> Callable[[], None]:
    """From now on, every status read of this one running job fails (the service answers, but with something
    the backend cannot read); the job itself runs on, and can be cancelled. Returns what undoes it."""
    if isinstance(world, LocalBackendWorld):
        request = Path(str(handle.extra.get("job_dir") or world.state_dir / local_common.JOBS_DIR / handle.job_id))
        request = request / local_common.REQUEST_FILE
        saved = request.read_bytes()
        request.write_text("{not json")
        return lambda: request.write_bytes(saved)
    if isinstance(world, BatchBackendWorld):
        world.emulator.report_status(handle.job_id, "ARCHIVED")
        return lambda: world.emulator.report_status(handle.job_id, None)
    if isinstance(world, SageMakerBackendWorld):
        world.emulator.report_status(handle.job_id, "Archived", "Archived")
        return lambda: world.emulator.report_status(handle.job_id, None)
    if isinstance(world, KubernetesBackendWorld):
        pod = world._pod(handle)
        world.emulator.report_phase(pod, "Archived")
        return lambda: None  # the owner's cancel deletes the pod; its Event says why
    raise AssertionError(f"no way to break reads in the {world.name} world")
