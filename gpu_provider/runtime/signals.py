"""Graceful stop: turn SIGTERM/SIGINT (and spot notices) into a flag the training loop checks.

Every backend asks a job to stop with SIGTERM (Batch and Kubernetes on a spot interruption or a
cancel, SageMaker on a stop or a spot reclaim, the local backend on cancel) and sends SIGKILL after a
grace period (for example the pod's ``terminationGracePeriodSeconds``, 30 s by default, or about two
minutes after an EC2 spot notice). The handler installed here only sets a flag, so the loop can finish
its step, save a checkpoint and exit on its own terms::

    stop = install_stop_handler()
    for step in range(start, total):
        train_one_step()
        if stop.requested or step % every == 0:
            with save_checkpoint(uri, step) as folder: ...
        if stop.requested:
            sys.exit(exit_code_for_stop(stop))

Later signals keep setting the flag rather than killing the process: the save in progress must
not be cut short. Only SIGKILL, at the end of the grace period, ends the job abruptly.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

#: exit status of a job that stopped because it was asked to (128 + SIGTERM, as a shell reports it)
STOP_EXIT_CODE = 128 + signal.SIGTERM

#: what the handler prints (to stderr, after ``gpu_provider: <SIGNAL>``) when a signal first asks the job to stop:
#: a task reading the job's log then knows its end is near and looks at its status sooner
STOP_NOTICE = " received; stopping after the current step"

# How long StopFlag.wait sleeps between looks at a flag set by a signal handler (see StopFlag).
_SIGNAL_POLL_S = 0.05


class StopFlag:
    """Set once when the job has been asked to stop; thread-safe and safe to set from a signal handler.

    A signal handler must not take locks the interrupted code may hold, so the handler only
    assigns attributes. :meth:`set`, called from other threads (for example the spot watcher),
    also wakes :meth:`wait` at once; a signal wakes it within 50 ms.
    """

    def __init__(self) -> None:
        self._requested = False
        self._reason = ""
        self._signum: int | None = None
        self._signals_received = 0
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop has been requested."""
        return self._requested

    @property
    def reason(self) -> str:
        """Why the stop was requested (the first reason given); empty while not requested."""
        return self._reason

    @property
    def signum(self) -> int | None:
        """The first signal that requested the stop, or ``None`` when it was not a signal."""
        return self._signum

    @property
    def signals_received(self) -> int:
        """How many handled signals have arrived so far."""
        return self._signals_received

    def set(self, reason: str) -> None:
        """Request a stop. Only the first reason is kept.

        :param reason: a short human-readable explanation, e.g. ``"spot interruption notice: ..."``.
        """
        if not self._requested:
            self._reason = reason
            self._requested = True
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested or ``timeout`` seconds pass.

        :param timeout: seconds to wait at most; ``None`` waits indefinitely.
        :return: whether a stop has been requested.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._requested:
            remaining = _SIGNAL_POLL_S if deadline is None else min(_SIGNAL_POLL_S, deadline - time.monotonic())
            if remaining <= 0:
                return False
            self._event.wait(remaining)
        return True

    def __bool__(self) -> bool:
        return self._requested

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes: assignments and os.write only, no locks.
        self._signals_received += 1
        name = signal.Signals(signum).name
        if not self._requested:
            self._signum = signum
            self._reason = f"received {name}"
            self._requested = True
            message = f"gpu_provider: {name}{STOP_NOTICE}\n"
        else:
            message = f"gpu_provider: {name} received again; still stopping (SIGKILL follows the grace period)\n"
        try:
            os.write(2, message.encode())
        except OSError:
            pass

    def uninstall(self) -> None:
        """Restore the signal handlers that :func:`install_stop_handler` replaced (main thread only)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


def install_stop_handler(
    signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT), *, flag: StopFlag | None = None
) -> StopFlag:
    """Install handlers that only set a :class:`StopFlag`, and return it.

    SIGINT then no longer raises ``KeyboardInterrupt``. Must be called from the main thread.

    :param signals: the signals to handle.
    :param flag: an existing flag to set (e.g. one shared with a
        :class:`~gpu_provider.runtime.SpotInterruptionWatcher`); a new one when ``None``.
    :return: the flag.
    :raises ValueError: called from another thread than the main thread.
    """
    stop = StopFlag() if flag is None else flag
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("install_stop_handler must be called from the main thread (Python delivers signals there)")
    for signum in signals:
        previous = signal.signal(signum, stop._on_signal)
        stop._previous.setdefault(int(signum), previous)
    return stop


def exit_code_for_stop(flag: StopFlag | None = None) -> int:
    """The exit status for a job that stopped because it was asked to.

    Never 0: a job that stopped early has not finished, and the backend must not report success.
    The value follows the shell convention 128 + signal number: 143 for SIGTERM (also used when the
    stop came from a spot notice or from code), 130 for SIGINT.

    :param flag: the flag that requested the stop; 143 when ``None`` or not set by a signal.
    """
    if flag is not None and flag.signum is not None:
        return 128 + flag.signum
    return STOP_EXIT_CODE
