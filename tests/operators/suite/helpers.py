"""What the operator suite's tests (and the per-backend operator tests) share: the one-task DAG file on a
world's backend, the toy job's pid files, a job that prints while it runs, and killing a deferred task once
its trigger has seen the job run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from gpu_provider.triggers.gpu_job import GpuJobTrigger
from tests.backends.contract.worlds import py
from tests.harness import Harness
from tests.operators.suite.worlds import OperatorWorld

#: a job that prints ``tick <i>`` every 0.1 s for a minute (tests stop it long before)
TICKING = py(
    """
    import time
    for i in range(600):
        print('tick', i, flush=True)
        time.sleep(0.1)
    """
)


class Source(str):
    """An operator argument given as Python source for the DAG file (``Source("SpotFallback(backoff=0)")``),
    where a plain value would be written as its ``repr``."""

    __slots__ = ()


def write_job_dag(harness: Harness, world: OperatorWorld, dag_id: str, command: list[str], **arguments: Any) -> Path:
    """The DAG file of one ``GpuJobOperator`` task, ``job``, on ``world``'s backend with image ``trainer:1``
    running ``command``; each of ``arguments`` is one more operator argument, a value (written as its
    ``repr``) or :class:`Source`."""
    lines = [f"backend={world.backend_source()}", 'image="trainer:1"', f"command={command!r}"]
    lines += [f"{name}={value if isinstance(value, Source) else repr(value)}" for name, value in arguments.items()]
    body = 'GpuJobOperator(\n    task_id="job",\n' + "".join(f"    {line},\n" for line in lines) + ")\n"
    return harness.write_dag(dag_id, body)


def pids(pid_dir: Path) -> dict[str, int]:
    """The toy job's pid files (tests/operators/toy_job.py): ``<attempt>-<rank>`` -> pid."""
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}


def _stamped(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["at"] = time.monotonic()
    return event


def reads_of_running_job(events: list[MutableMapping[str, Any]]) -> int:
    """Status reads in which the trigger saw the running job's new output: it copies the new lines of a
    :data:`TICKING` job to its log with every status it reads, in one burst; bursts come a poll apart."""
    reads = [e["at"] for e in list(events) if "[job]" in str(e.get("event")) and "tick" in str(e.get("event"))]
    return sum(1 for i, at in enumerate(reads) if i == 0 or at - reads[i - 1] > 0.1)


def kill_once_seen_running(trigger: GpuJobTrigger, *, reads: int = 3, timeout: float = 60.0) -> None:
    """Run the trigger until it has read its (:data:`TICKING`) job running ``reads`` times without firing an
    event, then kill it as the triggerer kills a deferred task: cancel its wait, then ``on_kill``."""

    async def wait_then_kill(events: list[MutableMapping[str, Any]]) -> None:
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        deadline = asyncio.get_running_loop().time() + timeout
        while reads_of_running_job(events) < reads and not waiting.done():
            assert asyncio.get_running_loop().time() < deadline, (
                f"the trigger did not read its running job {reads} times in {timeout:.0f}s"
            )
            await asyncio.sleep(0.05)
        assert not waiting.done(), f"the trigger fired while its job ran: {waiting.result()}"
        waiting.cancel()
        await trigger.on_kill()

    with capture_logs(processors=[_stamped]) as events:
        asyncio.run(wait_then_kill(events))
