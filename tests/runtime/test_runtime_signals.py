"""The stop handler, with real signals sent to a real child process."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpu_provider.runtime import StopFlag, exit_code_for_stop, install_stop_handler

TRAINER = """
import sys, time
from gpu_provider.runtime import exit_code_for_stop, install_stop_handler

stop = install_stop_handler()
print("ready", flush=True)
steps = 0
while not stop.requested:
    steps += 1
    time.sleep(0.002)  # one training step
print(f"noticed: {stop.reason}", flush=True)
if sys.argv[1] == "twice":
    print("saving", flush=True)
    deadline = time.monotonic() + 10
    while stop.signals_received < 2 and time.monotonic() < deadline:
        time.sleep(0.002)  # a long checkpoint save, hit by a second signal
print(f"saved after {steps} steps, signals={stop.signals_received}", flush=True)
sys.exit(exit_code_for_stop(stop))
"""


class _Lines:
    """Read a child's stdout line by line with a deadline (raw reads: no hidden buffering to wait past)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._buffer = b""
        self.seen: list[str] = []

    def wait_for(self, expected: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                self.seen.append(line.decode())
                if line.decode().strip() == expected:
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"child did not print {expected!r} within {timeout} s; printed {self.seen}")
            readable, _, _ = select.select([self._fd], [], [], remaining)
            if readable:
                chunk = os.read(self._fd, 4096)
                if not chunk:
                    pytest.fail(f"child exited before printing {expected!r}; printed {self.seen}")
                self._buffer += chunk


@pytest.fixture
def trainer(
    tmp_path: Path, child_env: Callable[..., dict[str, str]]
) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    started: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(script), mode],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_lets_the_loop_finish_and_exit_cleanly(
    trainer: Callable[[str], subprocess.Popen[bytes]], signum: int, exit_code: int
) -> None:
    proc = trainer("once")
    _Lines(proc).wait_for("ready")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=10)
    stdout, stderr = out.decode(), err.decode()
    name = signal.Signals(signum).name
    # a positive status means the child called sys.exit itself; death by the signal would be -signum
    assert proc.returncode == exit_code, stderr
    assert f"noticed: received {name}" in stdout
    assert "saved after" in stdout
    assert f"gpu_provider: {name} received; stopping after the current step" in stderr
    assert "KeyboardInterrupt" not in stderr


def test_second_signal_does_not_kill_the_save(trainer: Callable[[str], subprocess.Popen[bytes]]) -> None:
    proc = trainer("twice")
    lines = _Lines(proc)
    lines.wait_for("ready")
    proc.send_signal(signal.SIGTERM)
    lines.wait_for("saving")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    stdout, stderr = "\n".join(lines.seen) + out.decode(), err.decode()
    assert proc.returncode == 143, stderr
    assert "signals=2" in stdout
    assert "SIGTERM received again; still stopping" in stderr


def test_in_process_handler_sets_flag_and_uninstall_restores() -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    stop = install_stop_handler(signals=(signal.SIGUSR1,))
    try:
        assert not stop.requested and stop.wait(0.01) is False
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.wait(timeout=5)
        assert stop.reason == "received SIGUSR1"
        assert stop.signum == signal.SIGUSR1
        assert exit_code_for_stop(stop) == 128 + signal.SIGUSR1
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_flag_set_from_another_thread_wakes_wait_and_keeps_first_reason() -> None:
    stop = StopFlag()
    threading.Timer(0.05, stop.set, args=("spot interruption notice: terminate at now",)).start()
    assert stop.wait(timeout=5)
    stop.set("a later reason")
    assert stop.reason == "spot interruption notice: terminate at now"
    assert bool(stop) and stop.signum is None
    assert exit_code_for_stop(stop) == 143
    assert exit_code_for_stop() == 143


def test_install_outside_main_thread_is_refused() -> None:
    errors: list[BaseException] = []

    def install() -> None:
        try:
            install_stop_handler()
        except ValueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join(5)
    assert len(errors) == 1 and "main thread" in str(errors[0])
