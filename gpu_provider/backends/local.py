"""The local backend: runs a job's command as processes on this machine, one process per node.

This is the embedded default: a fresh clone runs the whole pipeline with no cloud. Each job gets a
small supervisor process (:mod:`gpu_provider.backends._local_supervisor`) started in its own
session, so the job survives a crash of the Airflow worker that submitted it, and a restarted
worker finds it again through the state directory (layout in
:mod:`gpu_provider.backends._local_common`).

What the job sees (besides its own ``env=`` and the ``GPU_PROVIDER_*`` contract):

* ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` (free port, same for all nodes)
* ``CUDA_VISIBLE_DEVICES``: GPUs allocated to that node; ``""`` on a machine without NVIDIA GPUs
* ``GPU_PROVIDER_OUTPUT_FILE``: a file the job may write its output URI to
* ``PYTHONUNBUFFERED=1`` and only an allow-listed part of the worker's environment (``PATH``,
  ``HOME``, locale, ``TZ``, ``TMPDIR``, ``USER``, ``LOGNAME``, ``PYTHONPATH``): never Airflow
  connections or cloud credentials.

Spot capacity is simulated: with ``simulate_preemptions=[8, 5]`` the first spot attempt of a task
instance is interrupted 8 s after its processes start (SIGTERM, ``grace_period``, SIGKILL) and ends
``PREEMPTED``, the second after 5 s; later spot attempts and on-demand attempts run undisturbed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import gpu_provider
from gpu_provider.backends import _local_common as common
from gpu_provider.backends._local_gpus import detect_gpus, gpu_seconds
from gpu_provider.backends.base import (
    Backend,
    JobHandle,
    JobRequest,
    JobState,
    JobStatus,
    TaskKey,
    map_state,
    provider_config,
)
from gpu_provider.exceptions import GpuJobError

log = logging.getLogger(__name__)

#: the supervisor's states (``status.json["state"]``) and what they mean for the operator
STATE_TABLE: dict[str, JobState] = {
    common.QUEUED: JobState.QUEUED,
    common.WAITING_FOR_GPUS: JobState.QUEUED,
    common.STARTING: JobState.STARTING,
    common.RUNNING: JobState.RUNNING,
    # still RUNNING while the nodes get their grace period: they hold their GPUs until they exit
    common.STOPPING: JobState.RUNNING,
    common.SUCCEEDED: JobState.SUCCEEDED,
    common.FAILED: JobState.FAILED,
    common.PREEMPTED: JobState.PREEMPTED,
    common.CANCELLED: JobState.CANCELLED,
}

#: a supervisor that has not recorded its pid this long after submit is taken as never started
_SUPERVISOR_START_TIMEOUT_S = 60.0
#: the most bytes of job.log one ``logs()`` call returns
_LOG_CHUNK = 1 << 20

# Things logged once per process, not once per job (a worker running many jobs would repeat them).
_logged_once: set[str] = set()
_logged_once_lock = threading.Lock()

# When each state directory was last pruned of old job folders (by this process).
_pruned_at: dict[str, float] = {}
_pruned_lock = threading.Lock()
_PRUNE_EVERY_S = 600.0

# Supervisors this process started: polled now and then so finished ones are reaped, not left as zombies.
_children: list[subprocess.Popen[bytes]] = []
_children_lock = threading.Lock()


def _log_once(key: str, message: str, *args: Any) -> None:
    with _logged_once_lock:
        if key in _logged_once:
            return
        _logged_once.add(key)
    log.warning(message, *args)


def _reap_children() -> None:
    with _children_lock:
        _children[:] = [p for p in _children if p.poll() is None]


def default_state_dir() -> Path:
    """``[gpu_provider] local_state_dir`` from the Airflow config, else ``$AIRFLOW_HOME/gpu_provider/local``."""
    configured = provider_config("local_state_dir")
    if configured:
        return Path(configured).expanduser().absolute()
    home = os.environ.get("AIRFLOW_HOME") or "~/airflow"
    return (Path(home).expanduser() / "gpu_provider" / "local").absolute()


# --- option parsing (values may come as strings from Jinja templates) ------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(option: str, value: Any, item: Any = None) -> float:
    """One duration in seconds (a number or a numeric string), finite and >= 0."""
    shown = value if item is None else item
    seconds: float | None = None
    if _is_number(shown):
        seconds = float(shown)
    elif isinstance(shown, str):
        try:
            seconds = float(shown.strip())
        except ValueError:
            seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        what = f"{option}={value!r}" + (f": entry {item!r}" if item is not None else "")
        raise ValueError(f"{what} is not a number of seconds >= 0")
    return seconds


def _split_list_text(option: str, value: str, what: str, usage: str) -> list[Any]:
    """A list given as template text: JSON (``"[8, 5]"``) or comma-separated (``"8,5"``)."""
    text = value.strip()
    if not text.startswith("["):
        return [part.strip() for part in text.split(",")]
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, list):
        raise ValueError(f"{option}={value!r} is not a {what}; {usage}")
    return parsed


def parse_simulate_preemptions(value: Any) -> tuple[float, ...]:
    """``[8, 5]``, ``"8,5"``, ``"[8, 5]"``, ``"8"``, ``8`` -> ``(8.0, 5.0)``; ``""``, ``"None"``, ``None`` -> ``()``."""
    usage = "use seconds after start for each spot attempt, e.g. [8, 5] or '8,5' (empty or None: no interruptions)"
    items: list[Any]
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "none", "null"):
            return ()
        items = _split_list_text("simulate_preemptions", value, "list", usage)
    elif _is_number(value):
        items = [value]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise TypeError(f"simulate_preemptions={value!r} ({type(value).__name__}) is not a list of seconds; {usage}")
    try:
        return tuple(_seconds("simulate_preemptions", value, item) for item in items)
    except ValueError as err:
        raise ValueError(f"{err}; {usage}") from None


def parse_gpus(value: Any) -> str | tuple[int, ...]:
    """``"auto"`` (ask nvidia-smi) or device indices: ``[0, 1]``, ``"0,1"``, ``"[0, 1]"``; ``"none"``, ``[]``: none."""
    usage = "use 'auto' (detect with nvidia-smi) or a list of device indices such as [0, 1] or '0,1' ([] for none)"
    items: list[Any]
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return "auto"
        if text.lower() in ("", "none", "[]"):
            return ()
        items = _split_list_text("gpus", value, "device list", usage)
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        # a bare int is refused: gpus=2 could mean "two GPUs" as well as "device 2"
        raise TypeError(f"gpus={value!r} ({type(value).__name__}) is not a device list; {usage}")
    devices: list[int] = []
    for item in items:
        if isinstance(item, str) and item.strip().isdigit():
            item = int(item.strip())
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise ValueError(f"gpus={value!r}: {item!r} is not a device index (an integer >= 0); {usage}")
        if item in devices:
            raise ValueError(f"gpus={value!r}: device {item} is listed twice; {usage}")
        devices.append(item)
    return tuple(devices)


class LocalBackend(Backend):
    """Run jobs as local processes, one per node, supervised outside the Airflow worker.

    Construction is cheap (no subprocess, no file access): the state directory is resolved and
    GPUs are detected when a job is submitted.

    :param state_dir: where jobs keep their files; default ``[gpu_provider] local_state_dir`` from
        the Airflow config, else ``$AIRFLOW_HOME/gpu_provider/local``. Templated strings accepted.
    :param simulate_preemptions: seconds after start at which the 1st, 2nd, ... *spot* attempt of a
        task instance is interrupted (``[8, 5]``, or a string ``"8,5"`` / ``"[8, 5]"``; empty: never).
        On-demand attempts and spot attempts beyond the list are not interrupted.
    :param grace_period: seconds between SIGTERM and SIGKILL when a job is stopped (cancel,
        max runtime, simulated interruption, another node failing). Default 10.
    :param gpus: ``"auto"`` to detect devices with ``nvidia-smi``, or the device indices to use.
        With no device the jobs run CPU-only (``CUDA_VISIBLE_DEVICES=""``).
    :param nvidia_smi: the ``nvidia-smi`` binary to ask (a name on ``PATH`` or a path).
    :param retention_days: the folders (state, log) of jobs that ended longer ago than this are
        deleted, checked at most every 10 minutes when a job is submitted. ``0`` keeps them forever.
        Default 7.
    """

    name: ClassVar[str] = "local"
    #: reading a few local files is cheap: look often
    default_poll_interval: ClassVar[float] = 2.0

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        simulate_preemptions: Sequence[float] | str | None = (),
        grace_period: float | str = 10.0,
        gpus: str | Sequence[int] = "auto",
        nvidia_smi: str = "nvidia-smi",
        retention_days: float | str = 7.0,
    ) -> None:
        if state_dir is not None and not isinstance(state_dir, (str, os.PathLike)):
            raise TypeError(f"state_dir={state_dir!r} ({type(state_dir).__name__}) must be a path string or None")
        text = os.fspath(state_dir).strip() if state_dir is not None else ""
        self._state_dir_arg: str | None = None if text.lower() in ("", "none") else text
        self._state_dir: Path | None = None
        self.simulate_preemptions = parse_simulate_preemptions(simulate_preemptions)
        self.grace_period = _seconds("grace_period", grace_period)
        self.retention_days = _seconds("retention_days", retention_days)
        self.gpus = parse_gpus(gpus)
        if not isinstance(nvidia_smi, str) or not nvidia_smi.strip():
            raise ValueError(f"nvidia_smi={nvidia_smi!r} must name the nvidia-smi binary (a name on PATH or a path)")
        self.nvidia_smi = nvidia_smi.strip()

    # --- configuration -------------------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        """The resolved state directory (resolved on first use, then fixed for this object)."""
        if self._state_dir is None:
            if self._state_dir_arg is not None:
                self._state_dir = Path(self._state_dir_arg).expanduser().absolute()
            else:
                self._state_dir = default_state_dir()
        return self._state_dir

    def options(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "simulate_preemptions": list(self.simulate_preemptions),
            "grace_period": self.grace_period,
            "gpus": self.gpus if isinstance(self.gpus, str) else list(self.gpus),
            "nvidia_smi": self.nvidia_smi,
            "retention_days": self.retention_days,
        }

    @classmethod
    def from_options(cls, **options: Any) -> LocalBackend:
        """Rebuild from :meth:`options` or from rendered template strings (``grace_period="3"``...)."""
        return cls(**options)

    def _devices(self) -> list[int]:
        """The GPUs jobs may use; logs once per process when there are none."""
        if isinstance(self.gpus, str):  # "auto"
            devices, problem = detect_gpus(self.nvidia_smi)
        else:
            devices = list(self.gpus)
            problem = None if devices else "gpus=[] configured"
        if not devices:
            _log_once("no-gpu", "no NVIDIA GPU found (%s): running jobs CPU-only", problem)
        return devices

    # --- the contract --------------------------------------------------------------------------

    def _jobs_dir(self) -> Path:
        return self.state_dir / common.JOBS_DIR

    def _job_dir(self, handle: JobHandle) -> Path:
        job_dir = handle.extra.get("job_dir")
        return Path(job_dir) if job_dir else self._jobs_dir() / handle.job_id

    def _previous_spot_attempts(self, task: TaskKey) -> int:
        return sum(1 for req in self._requests(task) if req.get("capacity") == "spot")

    def _requests(self, task: TaskKey) -> list[dict[str, Any]]:
        """request.json of every job of ``task`` in the state directory."""
        jobs = self._jobs_dir()
        if not jobs.is_dir():
            return []
        wanted = asdict(task)
        found = []
        for job_dir in jobs.iterdir():
            # the name prefix narrows the scan; the stored TaskKey decides (prefixes are slugs and may collide)
            if not job_dir.name.startswith(task.prefix + "-"):
                continue
            req = common.read_json(job_dir / common.REQUEST_FILE)
            if req is not None and req.get("task") == wanted:
                found.append(req)
        return found

    def submit(self, request: JobRequest) -> JobHandle:
        _reap_children()
        for key, value in request.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(
                    f"env[{key!r}] is a {type(value).__name__}: environment names and values must be strings"
                )
        if request.image:
            _log_once(
                "image",
                "the local backend runs the command directly on this machine; image %r is not used",
                request.image,
            )
        identity = request.identity
        jobs = self._jobs_dir()
        jobs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._prune_now_and_then()
        spot_index = self._previous_spot_attempts(identity.task) if request.capacity == "spot" else None
        preempt_after = (
            self.simulate_preemptions[spot_index]
            if spot_index is not None and spot_index < len(self.simulate_preemptions)
            else None
        )
        devices = self._devices()

        while True:
            job_id = f"{identity.name}-{secrets.token_hex(3)}"
            job_dir = jobs / job_id
            try:
                job_dir.mkdir(mode=0o700)
                break
            except FileExistsError:  # 1 in 16 million: draw again
                continue
        submitted_at = time.time()
        handle = JobHandle(
            backend=self.name,
            job_id=job_id,
            name=identity.name,
            attempt=identity.attempt,
            capacity=request.capacity,
            submitted_at=submitted_at,
            extra={"job_dir": str(job_dir)},
        )
        common.write_json_atomic(
            job_dir / common.REQUEST_FILE,
            {
                "version": common.REQUEST_VERSION,
                "job_id": job_id,
                "handle": handle.to_dict(),
                "task": asdict(identity.task),
                "identity": {
                    "name": identity.name,
                    "try_number": identity.try_number,
                    "attempt": identity.attempt,
                    "capacity": identity.capacity,
                    "team": identity.team,
                    "tags": identity.tags(),
                },
                "command": list(request.command),
                "env": dict(request.env),
                "base_env": common.base_env(os.environ),
                "cwd": os.getcwd(),
                "resources": request.resources.to_dict(),
                "capacity": request.capacity,
                "image": request.image,
                "max_runtime_s": request.max_runtime_s,
                "checkpoint_uri": request.checkpoint_uri,
                "resume_from": request.resume_from,
                "gpu_devices": devices,
                "grace_period": self.grace_period,
                "spot_index": spot_index,
                "preempt_after_s": preempt_after,
                "state_dir": str(self.state_dir),
                "submitted_at": submitted_at,
            },
        )
        common.write_json_atomic(
            job_dir / common.STATUS_FILE,
            {"state": common.QUEUED, "reason": "starting the local supervisor", "updated_at": submitted_at},
        )
        try:
            proc = self._start_supervisor(job_dir)
        except OSError as err:
            reason = f"could not start the local supervisor: {err}"
            common.write_json_atomic(
                job_dir / common.STATUS_FILE, {"state": common.FAILED, "reason": reason, "ended_at": time.time()}
            )
            raise GpuJobError(f"local job {job_id}: {reason}") from err
        common.write_json_atomic(
            job_dir / common.SUPERVISOR_FILE, {"pid": proc.pid, "pid_start": common.process_start_time(proc.pid)}
        )
        log.info("local job %s submitted (supervisor pid %s, state in %s)", job_id, proc.pid, job_dir)
        return handle

    def _start_supervisor(self, job_dir: Path) -> subprocess.Popen[bytes]:
        # The supervisor gets the same allow-listed environment as the nodes (no connections or keys
        # in its /proc/<pid>/environ either), plus the directory this package is imported from.
        env = common.base_env(os.environ)
        package_root = str(Path(gpu_provider.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        with open(job_dir / common.SUPERVISOR_LOG_FILE, "ab") as sup_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_provider.backends._local_supervisor", str(job_dir)],
                cwd=job_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sup_log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,  # not in the worker's process group: a worker crash does not stop the job
            )
        with _children_lock:
            _children.append(proc)
        return proc

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Statuses read from each job's ``status.json``. A job whose supervisor vanished without a
        final state (killed, machine rebooted) is reported ``FAILED`` and its processes are killed.

        ``gpu_seconds`` is the GPU-seconds the job held or would have held: requested GPUs x nodes x
        time since its processes started (also on a CPU-only machine, so estimates stay comparable).
        """
        _reap_children()
        return {handle.job_id: self._status(handle) for handle in handles}

    def _status(self, handle: JobHandle) -> JobStatus:
        job_dir = self._job_dir(handle)
        request = common.read_json(job_dir / common.REQUEST_FILE)
        if request is None:
            return JobStatus(
                state=JobState.FAILED,
                reason=f"local job {handle.job_id}: {job_dir / common.REQUEST_FILE} is missing "
                "(state directory deleted or on another machine?)",
            )
        status = common.read_json(job_dir / common.STATUS_FILE) or {"state": common.QUEUED}
        if status.get("state") not in common.TERMINAL_STATES:
            status = self._check_supervisor(job_dir, request, status)
        state = map_state(STATE_TABLE, str(status.get("state")), backend=self.name)
        started_at = status.get("started_at")
        ended_at = status.get("ended_at")
        held = 0.0
        if started_at is not None:
            end = ended_at if ended_at is not None else (time.time() if state.active else started_at)
            held = gpu_seconds(
                float(request["resources"]["gpus"]), int(request["resources"]["nodes"]), end - started_at
            )
        return JobStatus(
            state=state,
            reason=str(status.get("reason") or ""),
            exit_code=status.get("exit_code"),
            started_at=started_at,
            ended_at=ended_at,
            gpu_seconds=held,
            output_uri=self._output_uri(job_dir),
        )

    @staticmethod
    def _output_uri(job_dir: Path) -> str | None:
        try:
            text = (job_dir / common.OUTPUT_FILE).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return text or None

    @staticmethod
    def _supervisor(job_dir: Path, status: Mapping[str, Any]) -> tuple[int | None, int | None]:
        if status.get("supervisor_pid"):
            return int(status["supervisor_pid"]), status.get("supervisor_start")
        info = common.read_json(job_dir / common.SUPERVISOR_FILE) or {}
        pid = info.get("pid")
        return (int(pid), info.get("pid_start")) if pid else (None, None)

    def _check_supervisor(self, job_dir: Path, request: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Turn a non-terminal status whose supervisor is gone into a terminal one (and kill the rest)."""
        pid, pid_start = self._supervisor(job_dir, status)
        if pid is None:
            if time.time() - float(request.get("submitted_at", 0)) < _SUPERVISOR_START_TIMEOUT_S:
                return status  # submit is between writing request.json and recording the supervisor
            reason = "local supervisor never started (the submitting worker died during submit?)"
        elif common.is_alive(pid, pid_start):
            return status
        else:
            reason = f"local supervisor process {pid} disappeared"
        # the supervisor may have written its final state just before exiting
        fresh = common.read_json(job_dir / common.STATUS_FILE) or status
        if fresh.get("state") in common.TERMINAL_STATES:
            return fresh
        return self._end_orphan(job_dir, fresh, reason)

    def _end_orphan(self, job_dir: Path, status: dict[str, Any], reason: str) -> dict[str, Any]:
        """Kill the node processes of a job without a supervisor and record its end."""
        common.kill_groups(status.get("nodes") or [], signal.SIGKILL)
        cancel = common.read_json(job_dir / common.CANCEL_FILE)
        if cancel is not None:
            state, reason = common.CANCELLED, str(cancel.get("reason") or "cancelled")
        else:
            state = common.FAILED
        status = {**status, "state": state, "reason": reason, "ended_at": time.time(), "updated_at": time.time()}
        common.write_json_atomic(job_dir / common.STATUS_FILE, status)
        log.warning("local job %s: %s; marked %s", job_dir.name, reason, state.upper())
        return status

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Ask the supervisor to stop the job (SIGTERM to every node, SIGKILL after ``grace_period``).

        Returns at once; the processes are gone within about ``grace_period`` + 1 s. When the
        supervisor is already gone, the node processes are killed here and the job is marked cancelled.
        """
        job_dir = self._job_dir(handle)
        status = common.read_json(job_dir / common.STATUS_FILE)
        if status is None or status.get("state") in common.TERMINAL_STATES:
            return
        if not (job_dir / common.CANCEL_FILE).exists():  # keep the first reason: cancel is idempotent
            common.write_json_atomic(job_dir / common.CANCEL_FILE, {"reason": reason, "at": time.time()})
        pid, pid_start = self._supervisor(job_dir, status)
        if pid is not None and common.is_alive(pid, pid_start):
            try:
                os.kill(pid, signal.SIGTERM)
                return
            except ProcessLookupError:
                pass
        fresh = common.read_json(job_dir / common.STATUS_FILE) or status
        if fresh.get("state") not in common.TERMINAL_STATES:
            self._end_orphan(job_dir, fresh, reason)

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of exactly this task instance found in the state directory, oldest attempt first."""
        handles = [JobHandle.from_dict(req["handle"]) for req in self._requests(task) if "handle" in req]
        return sorted(handles, key=lambda h: (h.attempt, h.submitted_at, h.job_id))

    def list_jobs(self) -> list[JobHandle]:
        """Every job in the state directory, of any task, oldest submission first (cleanup, reaper)."""
        jobs = self._jobs_dir()
        if not jobs.is_dir():
            return []
        requests = (common.read_json(job_dir / common.REQUEST_FILE) for job_dir in jobs.iterdir())
        handles = [JobHandle.from_dict(req["handle"]) for req in requests if req is not None and "handle" in req]
        return sorted(handles, key=lambda h: (h.submitted_at, h.job_id))

    def prune(self, *, now: float | None = None) -> list[str]:
        """Delete the folders of jobs that ended more than ``retention_days`` ago; return their ids.

        Jobs still running, or whose state cannot be read, are never touched.
        """
        jobs = self._jobs_dir()
        if self.retention_days <= 0 or not jobs.is_dir():
            return []
        cutoff = (time.time() if now is None else now) - self.retention_days * 86400
        removed = []
        for job_dir in jobs.iterdir():
            status = common.read_json(job_dir / common.STATUS_FILE) or {}
            ended_at = status.get("ended_at")
            if (
                status.get("state") in common.TERMINAL_STATES
                and isinstance(ended_at, (int, float))
                and ended_at < cutoff
            ):
                shutil.rmtree(job_dir, ignore_errors=True)
                removed.append(job_dir.name)
        if removed:
            log.info(
                "removed %d local job folder(s) older than %g days from %s", len(removed), self.retention_days, jobs
            )
        return removed

    def _prune_now_and_then(self) -> None:
        key = str(self.state_dir)
        now = time.monotonic()
        with _pruned_lock:
            if now - _pruned_at.get(key, -math.inf) < _PRUNE_EVERY_S:
                return
            _pruned_at[key] = now
        try:
            self.prune()
        except OSError as err:  # housekeeping must never fail a submission
            log.warning("could not prune old local jobs in %s: %s", key, err)

    def job_pids(self, handle: JobHandle) -> list[int]:
        """Pids of the job's node processes (each leads its own process group), in rank order.

        Empty before the nodes started. The supervisor's pid is not included: it is bookkeeping, not the job.
        """
        status = common.read_json(self._job_dir(handle) / common.STATUS_FILE) or {}
        return [int(node["pid"]) for node in status.get("nodes") or [] if node.get("pid")]

    def logs(self, handle: JobHandle, since: int = 0) -> tuple[list[str], int]:
        """Complete lines of ``job.log`` from byte offset ``since`` (at most about 1 MiB per call).

        :param since: a byte offset: 0, or the position a previous call returned
        :return: the lines (without newlines) and the offset to pass next time
        """
        if since < 0:
            raise ValueError(f"since={since!r} must be a byte offset >= 0")
        try:
            with open(self._job_dir(handle) / common.LOG_FILE, "rb") as fh:
                fh.seek(since)
                data = fh.read(_LOG_CHUNK)
        except FileNotFoundError:
            return [], since
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) < _LOG_CHUNK:
                return [], since  # a line still being written
            end = len(data) - 1  # one line longer than a chunk: hand it out in pieces
        chunk = data[: end + 1]
        lines = [line.decode("utf-8", errors="replace") for line in chunk.split(b"\n")]
        if chunk.endswith(b"\n"):
            lines.pop()
        return lines, since + len(chunk)

    def console_url(self, handle: JobHandle) -> str | None:
        return (self._job_dir(handle) / common.LOG_FILE).as_uri()
