"""Entry wrapper that normalises the rendezvous variables, runs the job's command and marks the log's end.

Use it as the container's command (or in front of ``torchrun``) on any backend::

    python -m gpu_provider.runtime.launch -- torchrun --nnodes "$NNODES" ... train.py

It reads the environment with :func:`~gpu_provider.runtime.job_env` (AWS Batch multi-node,
SageMaker hosts, Kubernetes indexed Jobs, our own variables), writes ``NNODES``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` into the command's environment and runs the command as its child
(same process group), passing on SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2. It copies the command's
stdout and stderr to its own as they come and watches them for GPU hardware faults (an Xid, an
uncorrectable ECC error, a GPU fallen off the bus, an NCCL watchdog timeout on several nodes:
:mod:`gpu_provider.runtime.faults`). When the command exits it prints one last line to stdout, the
end-of-log marker ``gpu_provider: end-of-log node=<NODE_RANK> nnodes=<NNODES> exit=<status>[ fault=<kind>]``
(see :data:`gpu_provider.names.END_OF_LOG`), so the task stops reading the log as soon as every node's
marker is in, and exits with the command's status (128 + N for a command ended by signal N), or, when
the command failed after its output reported a GPU hardware fault, with that fault's exit status
(:data:`gpu_provider.names.NODE_FAULT_EXIT_CODES`), which every backend reads as a node fault.
Shell-style parameters such as ``"$NNODES"`` must be expanded by a shell *after* this wrapper, e.g.
``... launch -- sh -c 'torchrun --nnodes "$NNODES" ...'``.

Exit status when the command cannot be started: 2 for a usage or environment error, 127 when the
command is not found, 126 when it cannot be executed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO

from gpu_provider.names import NODE_FAULT_EXIT_CODES
from gpu_provider.runtime.env import export_torchrun_env, job_env
from gpu_provider.runtime.faults import fault_in_line
from gpu_provider.runtime.output import end_of_log_line

USAGE = "usage: python -m gpu_provider.runtime.launch -- <command> [args...]"
_PREFIX = "gpu_provider.runtime.launch"
#: signals passed on to the command (SIGKILL cannot be caught: the backend sends it to the whole group)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_READ_BYTES = 64 * 1024
#: the most bytes of an unfinished line kept for the fault scan (the messages are short)
_TAIL_BYTES = 4096
#: how long to wait for the output pipes after the command exited
_DRAIN_S = 5.0


def exit_status(returncode: int) -> int:
    """A child's ``returncode`` as a shell reports it: 128 + N for a command ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class _FaultWatch:
    """Copies one of the command's output pipes to ours as it comes, and remembers the first GPU hardware
    fault a line of it reports (:mod:`gpu_provider.runtime.faults`). Holds at most one line's tail."""

    def __init__(self, source: IO[bytes], target_fd: int, nnodes: int, found: list[str]) -> None:
        self.source, self.target_fd, self.nnodes, self.found = source, target_fd, nnodes, found
        self.thread = threading.Thread(target=self._copy, name=f"launch-copy-{target_fd}", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        tail = b""
        fd = self.source.fileno()
        try:
            while data := os.read(fd, _READ_BYTES):
                _write_all(self.target_fd, data)
                text = tail + data
                end = text.rfind(b"\n")
                if end >= 0:
                    self._scan(text[: end + 1])
                    text = text[end + 1 :]
                tail = text[-_TAIL_BYTES:]
            if tail:
                self._scan(tail)
        except OSError:  # our own output is gone: nothing left to copy to
            pass
        finally:
            self.source.close()

    def _scan(self, data: bytes) -> None:
        if not self.found:
            kind = fault_in_line(data.decode("utf-8", "replace"), nodes=self.nnodes)
            if kind is not None:
                self.found.append(kind)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_marked(args: Sequence[str], env: dict[str, str], node: int, nnodes: int) -> int:
    """Run ``args`` as a child, pass signals on, watch its output for GPU hardware faults, print the
    end-of-log marker; the command's exit status, or for a command that failed after its output reported
    a GPU hardware fault, that fault's exit status (:data:`gpu_provider.names.NODE_FAULT_EXIT_CODES`).

    :raises OSError: the command cannot be started (``FileNotFoundError`` when it does not exist).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    started: list[subprocess.Popen[bytes]] = []
    early: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if not started:  # before the child exists: passed on as soon as it does
            early.append(signum)
        elif started[0].poll() is None:
            started[0].send_signal(signum)

    # the handlers come first: a stop that arrives while the child starts (its output may already be out)
    # must reach it, not end this process and leave the command running without its marker
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        child = subprocess.Popen(list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started.append(child)
        for signum in early:
            forward(signum, None)
        assert child.stdout is not None and child.stderr is not None
        found: list[str] = []
        watches = [_FaultWatch(child.stdout, 1, nnodes, found), _FaultWatch(child.stderr, 2, nnodes, found)]
        code = exit_status(child.wait())
        for watch in watches:  # the rest of the output (a process the command left behind may hold a pipe)
            watch.thread.join(_DRAIN_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    fault = found[0] if found and code != 0 else None
    print(end_of_log_line(node, nnodes, code, fault=fault), flush=True)
    return NODE_FAULT_EXIT_CODES[fault] if fault is not None else code


def main(argv: Sequence[str] | None = None) -> int:
    """Normalise the environment, run the command and print the end-of-log marker.

    :param argv: the arguments after the module name; ``sys.argv[1:]`` when ``None``. A leading
        ``--`` separates the command from this wrapper and is dropped.
    :return: the command's exit status; 2, 126 or 127 as described in the module documentation.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    elif args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not args:
        print(USAGE, file=sys.stderr)
        return 2

    try:
        env = job_env()
    except ValueError as exc:
        print(f"{_PREFIX}: bad job environment: {exc}", file=sys.stderr)
        return 2
    rendezvous = export_torchrun_env(env)
    child_env = {**os.environ, **rendezvous}
    print(f"{_PREFIX}: " + " ".join(f"{k}={v}" for k, v in rendezvous.items()), file=sys.stderr)

    node, nnodes = int(rendezvous["NODE_RANK"]), int(rendezvous["NNODES"])
    return start_command(_PREFIX, args, lambda: run_marked(args, child_env, node, nnodes))


def start_command(prefix: str, args: Sequence[str], start: Callable[[], int]) -> int:
    """``start()`` the job's command (run it, or ``exec`` it); when it cannot start, say why on stderr
    under ``prefix`` and return 127 (not found) or 126 (cannot be executed), as a shell would."""
    try:
        return start()
    except FileNotFoundError:
        print(f"{prefix}: command not found: {args[0]!r}", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"{prefix}: cannot execute {args[0]!r}: {exc}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main())
