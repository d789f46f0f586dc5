"""Helpers for running the example job programs (``gpu_provider.examples``) as real subprocesses, as a backend does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: the example job programs, run as ``python -m gpu_provider.examples.<program>`` like the example DAG runs them
EXAMPLES = "gpu_provider.examples"

#: the job contract's variables: removed from the inherited environment so only what a test sets is seen
CONTRACT_VARIABLES = (
    "GPU_PROVIDER_CHECKPOINT_URI",
    "GPU_PROVIDER_RESUME_FROM",
    "GPU_PROVIDER_ATTEMPT",
    "GPU_PROVIDER_CAPACITY",
    "GPU_PROVIDER_OUTPUT_FILE",
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)

EXIT_STOPPED = 143


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def checkpoint_steps(folder: Path) -> list[int]:
    """The steps of the complete checkpoints (``ckpt-<step>`` folders) in a checkpoint folder."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in folder.iterdir() if re.fullmatch(r"ckpt-\d{10}", p.name))


class Job:
    """One running job program; its stdout and stderr go to a log file (no pipe to fill up)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log

    @property
    def output(self) -> str:
        """Everything the program printed so far."""
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = 60) -> int:
        """Wait for the program to exit and return its exit status (negative: killed by that signal)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.log.stem} still running after {timeout}s:\n{self.output}") from None

    def signal(self, signum: int) -> None:
        """Send ``signum`` if the program is still running."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)


class Launcher:
    """Starts job programs and kills whatever is still running in :meth:`close` (fixture teardown)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.jobs: list[Job] = []

    def start(self, program: str, args: list[str], env: Mapping[str, str] | None = None, name: str = "") -> Job:
        """Start ``python -m gpu_provider.examples.<program> args...`` with the contract ``env``.

        The working directory is the test's log folder, not the repository: the module is found where
        it is installed, as on a worker or in a trainer image.
        """
        environ = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARIABLES}
        environ.update(env or {})
        environ["PYTHONUNBUFFERED"] = "1"
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{len(self.jobs):02d}-{name or program}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"{EXAMPLES}.{program}", *args],
                cwd=self.logs,
                env=environ,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        job = Job(proc, log)
        self.jobs.append(job)
        return job

    def run(self, program: str, args: list[str], env: Mapping[str, str] | None = None, timeout: float = 60) -> Job:
        """Run a program to completion and check it succeeded."""
        job = self.start(program, args, env)
        status = job.wait(timeout)
        assert status == 0, f"{program} exited {status}:\n{job.output}"
        return job

    def start_ranks(
        self, program: str, args: list[str], nnodes: int, env: Mapping[str, str] | None = None, name: str = ""
    ) -> list[Job]:
        """Start ``nnodes`` copies of a program as the ranks of one multi-node job on this machine."""
        rendezvous = {"NNODES": str(nnodes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        return [
            self.start(program, args, {**(env or {}), **rendezvous, "NODE_RANK": str(rank)}, f"{name}rank{rank}")
            for rank in range(nnodes)
        ]

    def close(self) -> None:
        """Kill every program still running and reap it."""
        for job in self.jobs:
            if job.proc.poll() is None:
                job.proc.send_signal(signal.SIGKILL)
        for job in self.jobs:
            job.proc.wait(10)
