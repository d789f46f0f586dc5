"""A read never changes anything (issue 24, item 6): status, lookup, logs and list_owned ask, and only ask.

Stopping a job that can never start is the owning task's decision, taken in its wait after it read the
owner fresh; a sensor watching someone else's job never stops it, whatever the job's status says.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from gpu_provider import names
from gpu_provider.backends.base import JobState, JobStatus, backend_class
from gpu_provider.backends.batch import CANCEL_PREFIX, BatchBackend
from gpu_provider.engine.attempts import AttemptEngine, Fail
from gpu_provider.engine.runner import AttemptRunner
from gpu_provider.engine.watch import NEVER_STARTS, QUEUE_TIMEOUT
from gpu_provider.exceptions import GpuJobCancelledError, GpuJobFailedError
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import OnDemand
from gpu_provider.sensors import GpuJobSensor
from tests.backends.contract.worlds import BackendWorld, poll_one, py, read_until, wait_ended, wait_state
from tests.backends.faults.reads import SIGNAL_MARKER_ENV, SIGNAL_RECORDING_JOB, MutationWatch
from tests.batch_world import BatchWorld
from tests.harness import wait_for

log = logging.getLogger("test-reads-never-act")

#: Batch's words for a job no compute environment of its queue can hold (it never starts as submitted)
TOO_BIG = (
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement (vCPU/memory/GPU) is higher than that "
    "can be met by the CE(s) attached to the job queue."
)
#: Batch's words for a queue whose compute environments' maxvCpus is too small: an administrator can raise it
MAX_RESOURCE = (
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE - CE(s) associated with the job queue cannot meet the CPU "
    "requirement of the job."
)
#: what a read must never send to the Batch emulator
MUTATING_BATCH = ("TerminateJob", "CancelJob", "TagResource", "UntagResource", "SubmitJob")


def test_every_read_of_the_contract_changes_nothing_on_the_service(world: BackendWorld, tmp_path: Path) -> None:
    backend = world.backend()
    marker = tmp_path / "signals"
    running_request = world.request("reads_running", SIGNAL_RECORDING_JOB, env={SIGNAL_MARKER_ENV: str(marker)})
    running = backend.submit(running_request)
    ended = backend.submit(world.request("reads_ended", py("print('done')")))
    wait_ended(backend, ended)
    wait_state(backend, running, JobState.RUNNING)
    read_until(backend, running, lambda lines: any("started" in line for line in lines))

    watch = MutationWatch(world).start()
    reader = world.backend()  # another process's backend, as a sensor's or the reaper's would be
    for _ in range(3):
        reader.poll([running, ended])
    assert reader.lookup(job_id=running.job_id) is not None
    assert reader.lookup(name=ended.name) is not None
    assert {h.job_id for h in reader.find_existing(running_request.identity.task)} == {running.job_id}
    reader.task_of(running)
    reader.logs(running)
    reader.logs(ended)
    reader.output_tail(ended, 5)
    assert running.job_id in {owned.handle.job_id for owned in reader.list_owned()}
    reader.console_url(running)
    reader.logs_url(running)

    assert watch.changes() == [], f"{world.name}: a read changed the service"
    assert not marker.exists(), f"{world.name}: a read signalled the job: {marker.read_text()}"
    assert poll_one(reader, running).state is JobState.RUNNING


def _foreign_job(batch: BatchWorld, reason: str) -> str:
    """A job another system submitted with boto3 (no tags of ours), RUNNABLE in a held queue with ``reason``."""
    client = batch.emulator.client("batch")
    client.register_job_definition(
        jobDefinitionName="nightly-etl",
        type="container",
        containerProperties={
            "image": "etl:1",
            "command": ["python", "-c", "print('etl')"],
            "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
        },
    )
    batch.emulator.hold(batch.setup.on_demand_queue)
    job_id = str(
        client.submit_job(jobName="nightly-etl", jobQueue=batch.setup.on_demand_queue, jobDefinition="nightly-etl")[
            "jobId"
        ]
    )
    wait_for(lambda: batch.describe(job_id)["status"] == "RUNNABLE", 15, "nightly-etl to be RUNNABLE")
    batch.emulator.set_status_reason(job_id, reason)
    return job_id


class _TaskInstance:
    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def test_a_sensor_watching_a_foreign_batch_job_that_can_never_start_sends_nothing_that_changes_it(
    batch: BatchWorld,
) -> None:
    job_id = _foreign_job(batch, TOO_BIG)
    since = len(batch.emulator.requests())
    backend = BatchBackend(**batch.queues)

    poking = GpuJobSensor(task_id="watch_etl", backend=backend, job_name="nightly-etl", deferrable=False)
    for _ in range(3):
        assert not poking.poke({"ti": _TaskInstance()})  # type: ignore[arg-type]

    deferring = GpuJobSensor(task_id="watch_etl_deferred", backend=backend, job_id=job_id, poll_interval=0.1)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute({"ti": _TaskInstance()})  # type: ignore[arg-type]
    described = batch.emulator.count("DescribeJobs")

    async def watch_a_few_ticks() -> None:
        run = deferred.value.trigger.run()
        pending = asyncio.ensure_future(run.__anext__())
        deadline = time.monotonic() + 30
        while batch.emulator.count("DescribeJobs") < described + 5:
            assert not pending.done(), f"the sensor's trigger fired: {pending.result()}"
            assert time.monotonic() < deadline, "the trigger did not poll five times in 30 s"
            await asyncio.sleep(0.05)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await run.aclose()

    asyncio.run(watch_a_few_ticks())

    sent = [r["action"] for r in batch.emulator.requests(since=since)]
    assert [a for a in sent if a in MUTATING_BATCH] == [], sent
    assert {a for a in sent} <= {"DescribeJobs", "ListJobs", "ListTagsForResource"} | {
        a for a in sent if a.startswith("logs:Get") or a.startswith("logs:Describe") or a.startswith("logs:Filter")
    }, sent
    job = batch.describe(job_id)
    assert (job["status"], job["statusReason"]) == ("RUNNABLE", TOO_BIG)


def _runner(backend: BatchBackend, record: AttemptRecord, *, try_number: int = 1, **limits: float) -> AttemptRunner:
    engine = AttemptEngine(OnDemand(), [record], try_number=try_number, backend_name=backend.name)
    return AttemptRunner(
        backend,
        engine,
        log=log,
        label="Airflow task d.t of run r",
        stop=threading.Event(),
        persist=lambda records: None,
        cancel_retry_s=0.0,
        **limits,  # type: ignore[arg-type]
    )


def _owned_job(batch: BatchWorld, world_request: Any, reason: str) -> tuple[BatchBackend, AttemptRecord]:
    backend = BatchBackend(**batch.queues)
    batch.emulator.hold(batch.setup.on_demand_queue, reason=reason)
    handle = backend.submit(world_request)
    wait_for(lambda: batch.describe(handle.job_id).get("statusReason") == reason, 15, "the job's RUNNABLE reason")
    return backend, AttemptRecord.new(handle, try_number=1)


def _request(batch: BatchWorld, suffix: str) -> Any:
    from tests.backends.contract.worlds import BatchBackendWorld

    return BatchBackendWorld(batch).request(suffix, py("print('never')"))


def test_the_owning_task_stops_a_job_that_can_never_start_and_fails_saying_why(batch: BatchWorld) -> None:
    backend, record = _owned_job(batch, _request(batch, "never_starts"), TOO_BIG)
    runner = _runner(backend, record)
    status, outcome = runner.wait(record, poll_interval=0.1)
    assert (status.state, outcome) == (JobState.QUEUED, NEVER_STARTS)
    assert batch.bodies("TerminateJob") == [], "the wait's read acted before the owner decided"

    step = runner.after_wait(record, status, outcome)
    assert isinstance(step, Fail) and isinstance(step.error, GpuJobFailedError), step
    assert "can never start" in str(step.error) and TOO_BIG in str(step.error), step.error
    assert "cancelled it" in str(step.error), step.error
    (terminate,) = batch.bodies("TerminateJob")
    assert terminate["jobId"] == record.job_id
    assert terminate["reason"].startswith(CANCEL_PREFIX + names.UNRUNNABLE_MARK + TOO_BIG), terminate
    assert record.state is JobState.FAILED and record.interruption is None
    after = wait_ended(backend, record.handle)
    assert after.state is JobState.FAILED and after.reason.startswith("AWS Batch cannot run this job: " + TOO_BIG)


def test_a_job_another_try_owns_is_left_to_it_even_when_it_can_never_start(batch: BatchWorld) -> None:
    backend, record = _owned_job(batch, _request(batch, "never_starts_owned"), TOO_BIG)
    backend.mark(record.handle, owner_try=2)  # a later try took it over
    runner = _runner(backend, record, try_number=1)
    # the owner, read fresh before any stop, is a later try: this try stands down, touching nothing
    with pytest.raises(GpuJobCancelledError, match="owned by Airflow try 2"):
        runner.after_wait(record, JobStatus(state=JobState.QUEUED, never_starts=TOO_BIG), NEVER_STARTS)
    assert batch.bodies("TerminateJob") == []
    assert batch.describe(record.job_id)["status"] == "RUNNABLE"


def test_a_reason_an_administrator_can_fix_waits_out_the_queue_timeout(batch: BatchWorld) -> None:
    backend, record = _owned_job(batch, _request(batch, "max_resource"), MAX_RESOURCE)
    runner = _runner(backend, record, queue_timeout=1.0)
    status, outcome = runner.wait(record, poll_interval=0.1)
    assert (status.state, status.never_starts, outcome) == (JobState.QUEUED, None, QUEUE_TIMEOUT)
    assert status.reason == MAX_RESOURCE
    assert batch.bodies("TerminateJob") == [], "the job was stopped before its queue timeout"


# --- the same promise, read in the source: no read path of any backend reaches a destructive call ----

#: calls that stop, delete, signal or mark a job (the service's API names and the backends' own helpers)
DESTRUCTIVE = re.compile(
    r"^(cancel|_cancel|_terminate|terminate_job|cancel_job|_stop|stop_training_job|delete_namespaced_\w+|"
    r"patch_namespaced_\w+|kill_groups|killpg|kill|mark|tag_resource|add_tags|simulate_preemption)$"
)
#: the contract's reads
READS = ("poll", "lookup", "find_existing", "task_of", "logs", "output_tail", "list_owned", "console_url", "logs_url")
#: read paths allowed to act, each with the reason: the local backend ends a job whose supervisor process is
#: dead (read fresh from the process table): nobody else can ever record its end or stop its processes
ALLOWED = {"_end_orphan", "end_orphan"}


def _defined_functions(cls: type) -> dict[str, list[tuple[str, ast.FunctionDef]]]:
    """Every function and method, by name, of the modules a backend's reads can run: the backend's package,
    the modules of its classes (the contract) and what backends share (``backends/aws``, ``backends/common``).

    The backends are packages split by concern, so a read is mostly a call into a sibling module
    (``lookups.list_owned(...)``, ``self._jobs.describe(...)``); a call is followed to every function of that
    name in these modules (more than Python would run, never less)."""
    import gpu_provider.backends

    root = Path(gpu_provider.backends.__file__).parent
    package = Path(inspect.getfile(cls)).parent
    files = set(package.glob("*.py")) | set((root / "aws").glob("*.py")) | {root / "common.py"}
    files |= {Path(inspect.getfile(k)) for k in cls.__mro__ if k.__module__.startswith("gpu_provider.")}
    out: dict[str, list[tuple[str, ast.FunctionDef]]] = {}
    for file in sorted(files):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, []).append((f"{file.parent.name}/{file.name}:{node.name}", node))
    return out


def _destructive_calls_from_reads(cls: type, reads: tuple[str, ...] = READS) -> tuple[list[str], set[str]]:
    """What the reads reach that stops, deletes, signals or marks, and every function they reach."""
    defined = _defined_functions(cls)
    todo = [(read, node) for read in reads for _, node in defined.get(read, [])]
    assert {read for read, _ in todo} == set(reads), "a read of the contract is not defined where it is looked for"
    seen: set[str] = set()
    found = []
    while todo:
        name, function = todo.pop()
        key = f"{name}@{function.lineno}:{id(function)}"
        if key in seen or name in ALLOWED:
            continue
        seen.add(key)
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            signal = node.args[1] if called == "kill" and len(node.args) == 2 else None
            probe = isinstance(signal, ast.Constant) and signal.value == 0
            if DESTRUCTIVE.match(called) and not probe:  # kill(pid, 0) asks whether a process lives, sends nothing
                found.append(f"{cls.__name__}: {name} calls {called} (line {node.lineno})")
            for _, target in defined.get(called, []):
                todo.append((called, target))
    return found, {key.split("@")[0] for key in seen}


@pytest.mark.parametrize("backend_name", ["local", "batch", "sagemaker", "kubernetes"])
def test_no_read_of_a_backend_reaches_a_call_that_stops_deletes_or_marks(backend_name: str) -> None:
    cls = backend_class(backend_name)
    found, reached = _destructive_calls_from_reads(cls)
    assert found == []
    # the guard follows the reads into the package's modules (a split backend delegates): it must reach them
    assert len(reached) > len(READS) + 5, sorted(reached)


def test_the_guard_finds_a_destructive_call_hidden_in_a_sibling_module(tmp_path: Path) -> None:
    """The guard itself: a read that delegates to a module function that stops the job is found."""
    package = tmp_path / "fakebackend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lookups.py").write_text(
        "def find(client, name):\n    job = client.describe(name)\n    client.terminate_job(name)\n    return job\n"
    )
    (package / "backend.py").write_text(
        "from fakebackend import lookups\n\n"
        "class FakeBackend:\n"
        "    def lookup(self, name):\n        return lookups.find(self.client, name)\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        from fakebackend.backend import FakeBackend  # type: ignore[import-not-found]

        found, reached = _destructive_calls_from_reads(FakeBackend, reads=("lookup",))
        assert reached == {"lookup", "find"}
        assert found == ["FakeBackend: find calls terminate_job (line 3)"]
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m.startswith("fakebackend")]:
            del sys.modules[module]
