"""Figure 5b, the floor of a local launch: how fast can a job start that outlives the worker starting it?

Figure 5 compares ``GpuJobOperator(backend="local")`` with ``BashOperator``, which starts its command as a
child of the worker (it dies with the worker; a retry cannot find it). A job that outlives its worker must be
started by a process outside the worker's session; this script measures, in one process, launch after launch
and interleaved (so the machine's load hits all alike), from the caller's first step to the user's command
running (its command is ``sh -c 'date +%s.%N >> FILE'`` on every side):

- ``popen``: the caller starts ``sh -c CMD`` itself (``subprocess.Popen``, new session): what
  ``BashOperator`` does (with ``bash``), without Airflow around it;
- ``handover``: the least a detached launch can do: a process forked ahead (by a host process of its own that
  has the local supervisor imported, as the fork server is) waits on a Unix socket; the caller connects, sends one
  message (the command and an environment) and reads the pid; that process starts ``sh -c CMD``. No
  record of the job anywhere, no check of the caller's identity, no adoption: a lower bound, not a design;
- ``ours``: ``LocalBackend.submit`` (the fork server's spare, the job's folder and records, create-or-adopt),
  without the operator around it (figure 5 has the operator's part).

Reported: the median and the lower quartile of each, in ms, the ratios to ``popen`` and to ``handover``, and the
target (ours at most 2x the handover floor).

Usage: ``python benchmarks/launch_floor.py [--quick] [--launches N]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _marks(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _until_mark(path: Path, before: int, timeout: float = 10.0) -> float:
    """The time the command wrote once the file has more than ``before`` marks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marks = _marks(path)
        if len(marks) > before:
            return float(marks[-1])
        time.sleep(0.001)
    raise TimeoutError(f"no new mark in {path} within {timeout:.0f}s")


#: the process that forks the handover's waiting processes: a process of its own, as the fork server is (a caller
#: that forked them itself would pay, on its next writes, for the pages it then shared with them)
HOST = r"""
import json, os, socket, subprocess, sys
import gpu_provider.backends.local.supervisor  # the fork server's weight
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(8)
child = 0
for order in iter(lambda: sys.stdin.buffer.read(1), b""):
    if order == b"f":
        child = os.fork()
        if child == 0:
            code = 1
            try:
                os.setsid()
                conn, _ = listener.accept()
                message = json.loads(conn.recv(1 << 20))
                proc = subprocess.Popen(
                    message["command"],
                    env=message["env"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                    start_new_session=True,
                )
                conn.sendall(json.dumps({"pid": proc.pid}).encode())
                conn.close()
                proc.wait()
                code = 0
            finally:
                os._exit(code)
    elif child:
        os.waitpid(child, 0)
        child = 0
    sys.stdout.buffer.write(b"k")
    sys.stdout.flush()
"""


class Handover:
    """Processes forked ahead, each waiting on a Unix socket to start one command (see the module docstring),
    by a host process of their own."""

    def __init__(self, folder: Path) -> None:
        self.address = str(folder / "handover.sock")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        self.host = subprocess.Popen(
            [sys.executable, "-S", "-c", HOST, self.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )

    def _order(self, order: bytes) -> None:
        assert self.host.stdin is not None and self.host.stdout is not None
        self.host.stdin.write(order)
        self.host.stdin.flush()
        if self.host.stdout.read(1) != b"k":
            raise RuntimeError("the handover's host process ended")

    def fork_ahead(self) -> None:
        self._order(b"f")

    def launch(self, command: list[str]) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.address)
            conn.sendall(json.dumps({"command": command, "env": dict(os.environ)}).encode())
            conn.recv(1024)

    def reap(self) -> None:
        self._order(b"w")

    def close(self) -> None:
        assert self.host.stdin is not None
        self.host.stdin.close()
        self.host.wait(10)


def measure(launches: int, pause: float) -> dict[str, list[float]]:
    """Each side's launch times (seconds), ``launches`` of each after 3 unmeasured ones, interleaved."""
    logging.disable(logging.INFO)
    from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
    from gpu_provider.backends.local import LocalBackend, launch
    from gpu_provider.job import GpuResources

    out: dict[str, list[float]] = {"popen": [], "handover": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="gpu-bench-floor-") as tmp:
        folder = Path(tmp)
        marks = folder / "marks"
        cmd = f"date +%s.%N >> {marks}"
        handover = Handover(folder)
        children: list[subprocess.Popen[bytes]] = []

        def popen() -> None:
            children.append(
                subprocess.Popen(
                    ["sh", "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
                )
            )

        def ours(i: int) -> None:
            request = JobRequest(
                identity=JobIdentity(TaskKey("floor", f"t{i}", "manual__floor", -1), 1, 1, "on-demand"),
                command=("sh", "-c", cmd),
                env={"EXAMPLE": "1"},
                resources=GpuResources(gpus=1),
                capacity="on-demand",
            )
            LocalBackend(state_dir=str(folder / "state")).submit(request)

        sides: dict[str, Callable[[int], None]] = {
            "popen": lambda i: popen(),
            "handover": lambda i: handover.launch(["sh", "-c", cmd]),
            "ours": ours,
        }
        try:
            for i in range(launches + 3):
                for side, run in sides.items():
                    if side == "handover":
                        handover.fork_ahead()
                    time.sleep(pause)  # the last launch's processes have ended, the spare is forked
                    before = len(_marks(marks))
                    started = time.time()
                    run(i)
                    took = _until_mark(marks, before) - started
                    if i >= 3:
                        out[side].append(took)
                    handover.reap()
                    for child in children:
                        child.wait()
                    children.clear()
        finally:
            handover.close()
            launch.stop_fork_servers()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 launches per side")
    parser.add_argument("--launches", type=int, default=None, help="launches per side (default 40, --quick 10)")
    args = parser.parse_args()
    launches = args.launches or (10 if args.quick else 40)
    load = os.getloadavg()[0]
    started = time.monotonic()
    result = measure(launches, pause=0.1)
    floor = statistics.median(result["popen"])
    print(
        f"Figure 5b, the floor of a local launch: {launches} per side, interleaved, load {load:.2f} at the start, "
        f"{time.monotonic() - started:.0f} s"
    )
    handover = statistics.median(result["handover"])
    print("| side | median ms | lower quartile ms | median x popen | median x handover |")
    print("|---|---|---|---|---|")
    for side, times in result.items():
        quartile = statistics.quantiles(times, n=4)[0]
        median = statistics.median(times)
        ratios = f"{median / floor:.2f} | {median / handover:.2f}"
        print(f"| {side} | {median * 1e3:.2f} | {quartile * 1e3:.2f} | {ratios} |")
    ours = statistics.median(result["ours"]) / handover
    print(f"target: ours at most 2x the handover floor: {ours:.2f}x -> {'met' if ours <= 2 else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
