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

Isolation (docs/how-to/local.md states it for users): the job's environment values are
never written to disk (``request.json`` names the variables only; the supervisor gets the values on
its stdin and keeps them in memory). Every node runs in its own session and process group. State
folders are 0700 and files 0600. Without ``run_as_user`` a job runs as the worker's user and can
read whatever that user can, including ``/proc/<pid>/environ`` of the worker and of other jobs'
processes; with ``run_as_user`` (the worker must run as root) the nodes run as that user, with its
groups, and reach neither the worker's processes nor the state directory.

Spot capacity is simulated: with ``simulate_preemptions=[8, 5]`` the first spot attempt of a task
instance is interrupted 8 s after its processes start (SIGTERM, ``grace_period``, SIGKILL) and ends
``PREEMPTED``, the second after 5 s; later spot attempts and on-demand attempts run undisturbed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import gpu_provider
from gpu_provider import names
from gpu_provider.backends import _local_common as common
from gpu_provider.backends._local_gpus import NVIDIA_MODELS, detect_gpu_models, detect_gpus, gpu_seconds
from gpu_provider.backends._local_logs import read_log, read_tail
from gpu_provider.backends._local_options import (
    default_run_as_user,
    default_state_dir,
    parse_gpus,
    parse_run_as_user,
    parse_simulate_preemptions,
    resolve_run_as,
    seconds_option,
)
from gpu_provider.backends.base import (
    LOG_READ_BYTES,
    Backend,
    Capabilities,
    JobHandle,
    JobIdentity,
    JobRequest,
    JobState,
    JobStatus,
    LogChunk,
    OwnedJob,
    OwnerRead,
    PollResult,
    TaskKey,
    lookup_key,
    map_state,
)
from gpu_provider.exceptions import GpuJobElsewhereError, GpuJobError, GpuJobStatusError
from gpu_provider.job import GpuResources

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

# Verdicts on jobs whose supervisor vanished, when status.json could not be written (disk full): the
# same answer on every poll. A plain dict, no lock: cancel() may run in a signal handler.
_orphans: dict[str, dict[str, Any]] = {}

# Things logged once per process, not once per job (a worker running many jobs would repeat them).
_logged_once: set[str] = set()
_logged_once_lock = threading.Lock()

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


def this_host() -> str:
    """The name of the machine this process runs on, as recorded on the jobs it submits."""
    return socket.gethostname()


def _strip_cancel_prefix(reason: str) -> str:
    return reason[len(names.CANCEL_PREFIX) :] if reason.startswith(names.CANCEL_PREFIX) else reason


class LocalBackend(Backend):
    """Run jobs as local processes, one per node, supervised outside the Airflow worker.

    Construction is cheap (no subprocess, no file access): the state directory is resolved and
    GPUs are detected when a job is submitted.

    :param state_dir: where jobs keep their files; default ``[gpu_provider] local_state_dir`` from
        the Airflow config, else ``$AIRFLOW_HOME/gpu_provider/local``. Never from a template.
    :param simulate_preemptions: seconds after start at which the 1st, 2nd, ... *spot* attempt of a
        task instance is interrupted (``[8, 5]``, or a string ``"8,5"`` / ``"[8, 5]"``; empty: never).
        On-demand attempts and spot attempts beyond the list are not interrupted.
    :param grace_period: seconds between SIGTERM and SIGKILL when a job is stopped (cancel,
        max runtime, simulated interruption, another node failing). Default 10.
    :param gpus: ``"auto"`` to detect devices with ``nvidia-smi``, or the device indices to use.
        With no device the jobs run CPU-only (``CUDA_VISIBLE_DEVICES=""``).
    :param nvidia_smi: the ``nvidia-smi`` binary to ask (a name on ``PATH`` or a path). It runs with
        a minimal environment. Never from a template.
    :param retention_days: the folders (state, log) of jobs that ended longer ago than this are
        deleted, checked at most every 10 minutes when a job is submitted. ``0`` keeps them forever.
        Default 7.
    :param run_as_user: run the job's processes as this user (its uid, primary group and groups),
        like Airflow's ``run_as_user`` impersonation; default ``[gpu_provider] local_run_as_user``,
        else the worker's own user. The worker must run as root. Never from a template.
    :param working_dir: the folder the job's command runs in, an absolute path (checked when the job is
        submitted: it must be a folder there). Default: the worker's current folder. Never from a template.

    Jobs run on the machine that submitted them, and their state lives in ``state_dir`` there. Each
    handle records that machine (``extra["host"]``); a status read, cancel or reattach from another
    machine (a triggerer elsewhere, a retry on another worker) works only where ``state_dir`` is a
    folder both machines share, and is refused with :class:`~gpu_provider.exceptions.GpuJobElsewhereError`
    otherwise, leaving the job alone.
    """

    name: ClassVar[str] = "local"
    service: ClassVar[str] = "the local backend"
    capabilities: ClassVar[Capabilities] = Capabilities(
        multi_node=True,
        multi_node_spot=True,
        fractional_gpus=True,
        instance_types=False,  # the machine is what it is
        image_required=False,
        restarts_inside_job=False,
        unique_names=True,  # one folder per attempt name: a second submit of a name adopts the first
    )
    #: what runs, as whom, where, and which folders get deleted: literal or from [gpu_provider]
    fixed_options: ClassVar[frozenset[str]] = frozenset(
        {"nvidia_smi", "state_dir", "run_as_user", "working_dir", "retention_days"}
    )
    #: reading a few local files is cheap: look often
    default_poll_interval: ClassVar[float] = 2.0
    #: the machine costs what [gpu_provider] local_gpu_hour_usd says (default 0)
    price_catalog: ClassVar[str] = "local"

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        simulate_preemptions: Sequence[float] | str | None = (),
        grace_period: float | str = 10.0,
        gpus: str | Sequence[int] = "auto",
        nvidia_smi: str = "nvidia-smi",
        retention_days: float | str = 7.0,
        run_as_user: str | None = None,
        working_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if state_dir is not None and not isinstance(state_dir, (str, os.PathLike)):
            raise TypeError(f"state_dir={state_dir!r} ({type(state_dir).__name__}) must be a path string or None")
        text = os.fspath(state_dir).strip() if state_dir is not None else ""
        self._state_dir_arg: str | None = None if text.lower() in ("", "none") else text
        self._state_dir: Path | None = None
        self.simulate_preemptions = parse_simulate_preemptions(simulate_preemptions)
        self.grace_period = seconds_option("grace_period", grace_period)
        self.retention_days = seconds_option("retention_days", retention_days)
        self.gpus = parse_gpus(gpus)
        if not isinstance(nvidia_smi, str) or not nvidia_smi.strip():
            raise ValueError(f"nvidia_smi={nvidia_smi!r} must name the nvidia-smi binary (a name on PATH or a path)")
        self.nvidia_smi = nvidia_smi.strip()
        self._run_as_user_arg = parse_run_as_user(run_as_user)
        self._run_as_user_resolved = self._run_as_user_arg is not None
        if working_dir is not None and not isinstance(working_dir, (str, os.PathLike)):
            raise TypeError(
                f"working_dir={working_dir!r} ({type(working_dir).__name__}) must be an absolute path string or None"
            )
        folder = os.fspath(working_dir).strip() if working_dir is not None else ""
        if folder and not os.path.isabs(os.path.expanduser(folder)):
            raise ValueError(
                f"working_dir={folder!r} must be an absolute path (the job's command runs in it, on the worker)"
            )
        self.working_dir: str | None = os.path.expanduser(folder) if folder else None

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

    @property
    def run_as_user(self) -> str | None:
        """The user the job's processes run as (``None``: the worker's); the config is read on first use."""
        if not self._run_as_user_resolved:
            self._run_as_user_arg = parse_run_as_user(default_run_as_user())
            self._run_as_user_resolved = True
        return self._run_as_user_arg

    def options(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "simulate_preemptions": list(self.simulate_preemptions),
            "grace_period": self.grace_period,
            "gpus": self.gpus if isinstance(self.gpus, str) else list(self.gpus),
            "nvidia_smi": self.nvidia_smi,
            "retention_days": self.retention_days,
            "run_as_user": self.run_as_user,
            "working_dir": self.working_dir,
        }

    @classmethod
    def from_options(cls, **options: Any) -> LocalBackend:
        """Rebuild from :meth:`options` or from rendered template strings (``grace_period="3"``...)."""
        return cls(**options)

    def validate(
        self,
        resources: GpuResources,
        capacity: str,
        *,
        multi_capacity: bool,
        priority: int | None = None,
        max_runtime_s: float | None = None,
    ) -> None:
        """The shared checks. Whether the worker can switch to ``run_as_user`` (it runs as root, the user
        exists) is checked at submit: the DAG processor that parses the DAG may run as another user."""
        super().validate(
            resources, capacity, multi_capacity=multi_capacity, priority=priority, max_runtime_s=max_runtime_s
        )

    def validate_instance_fallback(self, instance_types: Sequence[str]) -> None:
        """The local backend runs an instance type on this machine's GPUs of its model (the price table's
        ``accelerator``, matched against ``nvidia-smi`` names): each type must have an NVIDIA model."""
        for instance_type in instance_types:
            _instance_gpu_model(instance_type)

    def _model_devices(self, model: str) -> list[int]:
        """The GPUs jobs may use whose ``nvidia-smi`` name is of ``model``."""
        models, problem = detect_gpu_models(self.nvidia_smi)
        if problem:
            _log_once(
                f"no-models-{problem}", "could not read the GPU models (%s): no GPU matches an instance type", problem
            )
        return [d for d in self._devices() if models.get(d) == model]

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

    # --- the state directory -------------------------------------------------------------------

    def _jobs_dir(self) -> Path:
        return self.state_dir / common.JOBS_DIR

    def _job_dir(self, handle: JobHandle) -> Path:
        """The job's folder: where its host put it, or, read from another host, in this host's state
        directory (a shared state directory may be mounted elsewhere there)."""
        job_dir = handle.extra.get("job_dir")
        host = handle.extra.get("host")
        if job_dir and (not host or host == this_host()):
            return Path(job_dir)
        return self._jobs_dir() / handle.job_id

    def _ensure_jobs_dir(self) -> Path:
        """Create the state directory and ``jobs/`` (0700) if needed; refuse a ``jobs/`` that is a link."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=common.DIR_MODE)
        jobs = self._jobs_dir()
        with contextlib.suppress(FileExistsError):
            jobs.mkdir(mode=common.DIR_MODE)
        self._check_jobs_dir(jobs)
        return jobs

    @staticmethod
    def _check_jobs_dir(jobs: Path) -> None:
        info = os.lstat(jobs)
        if not stat.S_ISDIR(info.st_mode):
            raise GpuJobError(
                f"{jobs} is a symbolic link or not a folder: the local backend keeps its jobs in a real folder "
                "inside its state directory and never follows links out of it. Remove it, or configure another "
                "state_dir"
            )

    def _job_dirs(self) -> Iterator[Path]:
        """Every job folder in ``jobs/``: real folders only (no links, no half-made ``.new-*`` folders)."""
        jobs = self._jobs_dir()
        try:
            self._check_jobs_dir(jobs)
            entries = list(os.scandir(jobs))
        except FileNotFoundError:
            return
        for entry in entries:
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)

    def _requests(self, task: TaskKey) -> list[dict[str, Any]]:
        """request.json of every job of ``task`` in the state directory."""
        wanted = asdict(task)
        found = []
        for job_dir in self._job_dirs():
            # the name prefix narrows the scan; the stored TaskKey decides (prefixes are slugs and may collide)
            if not job_dir.name.startswith(task.prefix + "-"):
                continue
            req = common.read_json(job_dir / common.REQUEST_FILE)
            if req is not None and req.get("task") == wanted:
                found.append(req)
        return found

    def _previous_spot_attempts(self, task: TaskKey) -> int:
        return sum(1 for req in self._requests(task) if req.get("capacity") == names.SPOT)

    # --- submit --------------------------------------------------------------------------------

    def _existing(self, identity: JobIdentity) -> JobHandle | None:
        """The attempt already submitted under ``identity.name``, if any (create-or-adopt)."""
        folder = self._jobs_dir() / identity.name
        candidates: list[dict[str, Any] | None] = []
        if folder.is_dir() and not folder.is_symlink():
            req = common.read_json(folder / common.REQUEST_FILE)
            if req is None:
                raise GpuJobError(
                    f"local job {identity.name}: its folder {folder} exists but its request.json cannot be read; "
                    "it cannot be adopted or submitted again. Remove the folder to submit this attempt anew"
                )
            candidates.append(req)
        # folders of older versions carry a random suffix after the name
        candidates.extend(self._requests(identity.task))
        for req in candidates:
            if req is None or (req.get("identity") or {}).get("name") != identity.name or "handle" not in req:
                continue
            if req.get("task") != asdict(identity.task):
                raise GpuJobError(
                    f"local job {identity.name}: the name is taken by a job of another task ({req.get('task')}); "
                    "this cannot happen unless two run hashes collide. Remove the folder or rename the task"
                )
            return JobHandle.from_dict(req["handle"])
        return None

    def submit(self, request: JobRequest) -> JobHandle:
        """Start the attempt, or return the handle of the one already started under its name.

        Nothing is left behind when it fails: no folder, no process.
        """
        _reap_children()
        for key, value in request.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(
                    f"env[{key!r}] is a {type(value).__name__}: environment names and values must be strings"
                )
        run_as = resolve_run_as(self.run_as_user)
        if self.working_dir is not None and not os.path.isdir(self.working_dir):
            raise GpuJobError(
                f"local job {request.identity.name}: working_dir={self.working_dir!r} is not a folder on this "
                f"machine ({this_host()}); create it, or point working_dir at the job's code"
            )
        if request.image:
            _log_once(
                "image",
                "the local backend runs the command directly on this machine; image %r is not used",
                request.image,
            )
        identity = request.identity
        try:
            jobs = self._ensure_jobs_dir()
            existing = self._existing(identity)
        except OSError as err:
            raise GpuJobError(
                f"local job {identity.name}: cannot use the state directory {self.state_dir}: {err}"
            ) from err
        if existing is not None:
            log.info("local job %s exists already (submitted before): adopting it", existing.job_id)
            return existing
        common.prune_now_and_then(self.state_dir, self.prune)
        spot_index = self._previous_spot_attempts(identity.task) if request.capacity == names.SPOT else None
        preempt_after = (
            self.simulate_preemptions[spot_index]
            if spot_index is not None and spot_index < len(self.simulate_preemptions)
            else None
        )
        devices = self._devices()
        # instance fallback: the GPUs of the type's model (a CPU-only machine runs the job as it runs any)
        model = _instance_gpu_model(request.instance_type) if request.instance_type and devices else None
        if model:
            devices = self._model_devices(model)
        job_id = identity.name
        job_dir = jobs / job_id
        submitted_at = time.time()
        handle = JobHandle(
            backend=self.name,
            job_id=job_id,
            name=identity.name,
            attempt=identity.attempt,
            capacity=request.capacity,
            submitted_at=submitted_at,
            extra={"job_dir": str(job_dir), "host": this_host()},
        )
        work_dir: str | None = None
        if run_as is not None:
            # the job's own writable folder, outside the state directory (which its user cannot enter)
            try:
                work_dir = tempfile.mkdtemp(prefix=f"gpu-provider-{job_id}-")
                os.chown(work_dir, run_as["uid"], run_as["gid"])
            except OSError as err:
                common.remove_work_dir(work_dir)
                raise GpuJobError(f"local job {job_id}: could not create its work folder: {err}") from err
        record = {
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
            # names only: the values go to the supervisor over a pipe and never touch the disk
            "env_keys": sorted(request.env),
            "cwd": self.working_dir or os.getcwd(),
            "host": this_host(),
            "run_as": run_as,
            "work_dir": work_dir,
            "resources": request.resources.to_dict(),
            "capacity": request.capacity,
            "image": request.image,
            "max_runtime_s": request.max_runtime_s,
            "checkpoint_uri": request.checkpoint_uri,
            "resume_from": request.resume_from,
            "gpu_devices": devices,
            "gpu_model": model,
            "instance_type": request.instance_type,
            "grace_period": self.grace_period,
            "spot_index": spot_index,
            "preempt_after_s": preempt_after,
            "state_dir": str(self.state_dir),
            "submitted_at": submitted_at,
        }
        try:
            adopted = self._create_job_dir(jobs, job_dir, record)
        except BaseException:
            common.remove_work_dir(work_dir)
            raise
        if adopted is not None:
            common.remove_work_dir(work_dir)
            log.info("local job %s was submitted at the same moment by another caller: adopting it", job_id)
            return adopted
        secrets_payload = {"env": dict(request.env), "base_env": common.base_env(os.environ)}
        try:
            proc = self._start_supervisor(job_dir, secrets_payload)
        except BaseException as err:
            shutil.rmtree(job_dir, ignore_errors=True)
            common.remove_work_dir(work_dir)
            if isinstance(err, OSError):
                raise GpuJobError(f"local job {job_id}: could not start the local supervisor: {err}") from err
            raise
        log.info("local job %s submitted (supervisor pid %s, state in %s)", job_id, proc.pid, job_dir)
        return handle

    def _create_job_dir(self, jobs: Path, job_dir: Path, record: dict[str, Any]) -> JobHandle | None:
        """Write the job's folder under a temporary name and rename it into place.

        The rename is the create-or-adopt decision: it fails when ``job_dir`` exists, and then the
        handle of the job there is returned. A failure leaves no folder behind.
        """
        new = jobs / f".new-{job_dir.name}-{secrets.token_hex(4)}"
        new.mkdir(mode=common.DIR_MODE)
        try:
            common.write_json_atomic(new / common.REQUEST_FILE, record)
            common.write_json_atomic(
                new / common.STATUS_FILE,
                {
                    "state": common.QUEUED,
                    "reason": "starting the local supervisor",
                    "queued_since": record["submitted_at"],
                    "updated_at": record["submitted_at"],
                },
            )
            # written in place later, so that neither needs disk space when it matters
            common.preallocate(new / common.SUPERVISOR_FILE, {"pid": None})
            common.preallocate(new / common.FATAL_FILE, {})
            os.close(os.open(new / common.LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            os.close(os.open(new / common.SUPERVISOR_LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            try:
                os.rename(new, job_dir)
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                req = common.read_json(job_dir / common.REQUEST_FILE)
                if req is None or "handle" not in req:
                    raise GpuJobError(
                        f"local job {job_dir.name}: {job_dir} exists but its request.json cannot be read; "
                        "remove the folder to submit this attempt anew"
                    ) from err
                return JobHandle.from_dict(req["handle"])
        except BaseException as err:
            shutil.rmtree(new, ignore_errors=True)
            if isinstance(err, OSError):
                raise GpuJobError(f"local job {job_dir.name}: could not write its folder in {jobs}: {err}") from err
            raise
        shutil.rmtree(new, ignore_errors=True)  # only still there when the rename failed
        return None

    def _start_supervisor(self, job_dir: Path, secrets_payload: Mapping[str, Any]) -> subprocess.Popen[bytes]:
        """Start the job's supervisor, hand it the environment values over its stdin, record its pid.

        A failure after the process started kills it (its whole session) before raising.
        """
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
                stdin=subprocess.PIPE,
                stdout=sup_log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,  # not in the worker's process group: a worker crash does not stop the job
            )
        try:
            assert proc.stdin is not None
            with proc.stdin:
                proc.stdin.write(json.dumps(secrets_payload).encode("utf-8"))
            common.overwrite_in_place(
                job_dir / common.SUPERVISOR_FILE, {"pid": proc.pid, "pid_start": common.process_start_time(proc.pid)}
            )
        except BaseException:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        with _children_lock:
            _children.append(proc)
        return proc

    # --- status --------------------------------------------------------------------------------

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        """Statuses read from each job's ``status.json``, one entry per handle.

        A job whose supervisor vanished without a final state (killed, disk full, machine rebooted)
        is reported ``FAILED`` with the reason, and its processes are killed. A job whose folder is
        gone is ``FAILED`` with ``interruption="lost"``. A job whose files cannot be read gets a
        :class:`GpuJobStatusError` entry; the other jobs are unaffected.

        ``gpu_seconds`` is the GPU-seconds the job held or would have held: requested GPUs x nodes x
        time since its processes started (also on a CPU-only machine, so estimates stay comparable).
        """
        _reap_children()
        result: PollResult = {}
        for handle in handles:
            try:
                result[handle.job_id] = self._status(handle)
            except GpuJobElsewhereError as err:
                result[handle.job_id] = err
            except (GpuJobError, OSError, ValueError, KeyError, TypeError) as err:
                result[handle.job_id] = GpuJobStatusError(
                    f"local job {handle.job_id}: its state in {self._job_dir(handle)} cannot be read: {err}"
                )
        return result

    def _elsewhere(self, handle: JobHandle, job_dir: Path) -> bool:
        """Whether the job runs on another machine; raise when its state cannot be read from this one."""
        host = handle.extra.get("host")
        here = this_host()
        if not host or host == here:
            return False
        if os.path.lexists(job_dir / common.REQUEST_FILE):
            return True  # a shared state directory: its files are the truth, its processes are not ours to see
        raise GpuJobElsewhereError(
            f"local job {handle.job_id} runs on host {host!r}, and this process runs on {here!r}, which cannot "
            f"see its state ({job_dir} is not here). The local backend keeps a job's state on the machine "
            "that started it: run the task's worker and triggerer on one machine (or deferrable=False), or set "
            "[gpu_provider] local_state_dir to a folder every worker and triggerer host mounts; across "
            "machines, use a remote backend such as batch. The job was left alone; a retry on "
            f"{host!r} reattaches to it"
        )

    def _status(self, handle: JobHandle) -> JobStatus:
        job_dir = self._job_dir(handle)
        elsewhere = self._elsewhere(handle, job_dir)
        request = common.read_json(job_dir / common.REQUEST_FILE)
        if request is None:
            if os.path.lexists(job_dir):
                raise GpuJobError(f"{job_dir / common.REQUEST_FILE} is missing or not valid JSON")
            return JobStatus(
                state=JobState.FAILED,
                reason=f"local job {handle.job_id}: its folder {job_dir} is gone (pruned, deleted, or the state "
                "directory is on another machine); how the job ended is unknown",
                interruption=names.LOST,
                capacity=handle.capacity,
            )
        status = common.read_json(job_dir / common.STATUS_FILE) or {"state": common.QUEUED}
        map_state(STATE_TABLE, str(status.get("state")), backend=self.name)  # an unknown state is an error
        if status.get("state") not in common.TERMINAL_STATES and not elsewhere:
            # another host's supervisor cannot be seen from here: its status file is the truth
            status = self._check_supervisor(job_dir, request, status)
        state = map_state(STATE_TABLE, str(status.get("state")), backend=self.name)
        reason = _strip_cancel_prefix(str(status.get("reason") or ""))
        interruption = None
        if state is JobState.CANCELLED:
            asked = str((common.read_json(job_dir / common.CANCEL_FILE) or {}).get("reason") or reason)
            if _strip_cancel_prefix(asked).startswith(names.CAPACITY_TIMEOUT_MARK):
                interruption = names.CAPACITY_TIMEOUT
        elif state is JobState.PREEMPTED:
            interruption = names.PREEMPTED
        fault = status.get("fault") if state is JobState.FAILED else None
        if fault:  # a GPU hardware fault in a node's output (the supervisor read it): not the job's error
            interruption = names.NODE_FAULT
        started_at = status.get("started_at")
        ended_at = status.get("ended_at")
        held = 0.0
        if started_at is not None:
            end = ended_at if ended_at is not None else (time.time() if state.active else started_at)
            held = gpu_seconds(
                float(request["resources"]["gpus"]), int(request["resources"]["nodes"]), end - started_at
            )
        marks = common.read_json(job_dir / common.MARK_FILE) or {}
        owner_try = marks.get("owner_try")
        if owner_try is None:
            owner_try = (request.get("identity") or {}).get("try_number")
        return JobStatus(
            state=state,
            reason=reason,
            exit_code=status.get("exit_code"),
            started_at=started_at,
            ended_at=ended_at,
            gpu_seconds=held,
            output_uri=self._output_uri(job_dir),
            interruption=interruption,
            fault=str(fault) if fault else None,
            queued_since=status.get("queued_since") or request.get("submitted_at"),
            capacity=str(request.get("capacity") or handle.capacity),
            owner_try=int(owner_try) if owner_try is not None else None,
            collected=bool(marks.get("collected")),
        )

    @staticmethod
    def _output_uri(job_dir: Path) -> str | None:
        text = common.read_small_text(job_dir / common.OUTPUT_FILE)
        return (text or "").strip() or None

    @staticmethod
    def _supervisor(job_dir: Path, status: Mapping[str, Any]) -> tuple[int | None, int | None]:
        if status.get("supervisor_pid"):
            return int(status["supervisor_pid"]), status.get("supervisor_start")
        info = common.read_json(job_dir / common.SUPERVISOR_FILE) or {}
        pid = info.get("pid")
        return (int(pid), info.get("pid_start")) if pid else (None, None)

    def _check_supervisor(self, job_dir: Path, request: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Turn a non-terminal status whose supervisor is gone into a terminal one (and kill the rest)."""
        known = _orphans.get(str(job_dir))
        if known is not None:
            return known
        pid, pid_start = self._supervisor(job_dir, status)
        fatal = str((common.read_json(job_dir / common.FATAL_FILE) or {}).get("reason") or "")
        if pid is None:
            if not fatal and time.time() - float(request.get("submitted_at", 0)) < _SUPERVISOR_START_TIMEOUT_S:
                return status  # submit is between starting the supervisor and recording its pid
            reason = fatal or "local supervisor never started (the submitting worker died during submit?)"
        elif common.is_alive(pid, pid_start):
            return status
        else:
            reason = fatal or f"local supervisor process {pid} disappeared"
        # the supervisor may have written its final state just before exiting
        fresh = common.read_json(job_dir / common.STATUS_FILE) or status
        if fresh.get("state") in common.TERMINAL_STATES:
            return fresh
        return self._end_orphan(job_dir, request, fresh, reason)

    def _end_orphan(
        self, job_dir: Path, request: Mapping[str, Any], status: dict[str, Any], reason: str
    ) -> dict[str, Any]:
        """Kill the node processes of a job without a supervisor and record its end.

        When the record cannot be written (disk full), the verdict is kept in memory and returned:
        poll answers the same on every call instead of raising.
        """
        common.kill_groups(status.get("nodes") or [], signal.SIGKILL)
        common.remove_work_dir(request.get("work_dir"))
        cancel = common.read_json(job_dir / common.CANCEL_FILE)
        if cancel is not None:
            state, reason = common.CANCELLED, str(cancel.get("reason") or "cancelled")
        else:
            state = common.FAILED
        now = time.time()
        status = {**status, "state": state, "reason": reason, "ended_at": now, "updated_at": now}
        try:
            common.write_json_atomic(job_dir / common.STATUS_FILE, status)
        except OSError as err:
            _orphans[str(job_dir)] = status
            log.warning("local job %s: %s; could not record it in status.json (%s)", job_dir.name, reason, err)
        else:
            _orphans.pop(str(job_dir), None)
        log.warning("local job %s: %s; marked %s", job_dir.name, reason, state.upper())
        return status

    # --- cancel and marks ----------------------------------------------------------------------

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Ask the supervisor to stop the job (SIGTERM to every node, SIGKILL after ``grace_period``).

        Returns at once; the processes are gone within about ``grace_period`` + 1 s. When the
        supervisor is already gone, the node processes are killed here and the job is marked cancelled.
        A reason starting (after :data:`~gpu_provider.names.CANCEL_PREFIX`) with
        :data:`~gpu_provider.names.CAPACITY_TIMEOUT_MARK` is reported later as ``interruption="capacity_timeout"``.
        Takes no lock: safe in a signal handler.
        """
        job_dir = self._job_dir(handle)
        elsewhere = self._elsewhere(handle, job_dir)
        status = common.read_json(job_dir / common.STATUS_FILE)
        if status is None or status.get("state") in common.TERMINAL_STATES:
            return
        if not (job_dir / common.CANCEL_FILE).exists():  # keep the first reason: cancel is idempotent
            try:
                common.write_json_atomic(job_dir / common.CANCEL_FILE, {"reason": reason, "at": time.time()})
            except OSError as err:  # stop the job all the same; only the reason is lost
                log.warning("local job %s: cancel reason not recorded (%s); stopping it anyway", handle.job_id, err)
        if elsewhere:
            return  # its supervisor, on its own host, reads cancel.json; pids here are not its pids
        pid, pid_start = self._supervisor(job_dir, status)
        if pid is not None and common.is_alive(pid, pid_start):
            try:
                os.kill(pid, signal.SIGTERM)
                return
            except ProcessLookupError:
                pass
        fresh = common.read_json(job_dir / common.STATUS_FILE) or status
        request = common.read_json(job_dir / common.REQUEST_FILE) or {}
        if fresh.get("state") not in common.TERMINAL_STATES and (pid is not None or request):
            self._end_orphan(job_dir, request, fresh, reason)

    def simulate_preemption(self, handle: JobHandle) -> None:
        """Interrupt a running job now, as ``simulate_preemptions`` would (SIGTERM, grace period,
        SIGKILL; the job ends ``PREEMPTED``). For tests and demos of interruption handling."""
        job_dir = self._job_dir(handle)
        if common.read_json(job_dir / common.REQUEST_FILE) is None:
            raise GpuJobError(f"local job {handle.job_id}: cannot interrupt it, its folder {job_dir} is gone")
        common.write_json_atomic(
            job_dir / common.PREEMPT_FILE,
            {"reason": "simulated spot interruption (LocalBackend.simulate_preemption)", "at": time.time()},
        )

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """The owner read from the job's folder now (``mark.json``, else the try in ``request.json``)."""
        job_dir = self._job_dir(handle)
        self._elsewhere(handle, job_dir)  # raises when this machine cannot see the job's folder
        request = common.read_json(job_dir / common.REQUEST_FILE)
        if request is None:
            if os.path.lexists(job_dir):
                raise GpuJobError(f"{job_dir / common.REQUEST_FILE} is missing or not valid JSON")
            return OwnerRead(owner_try=None, exists=False)
        owner = (common.read_json(job_dir / common.MARK_FILE) or {}).get("owner_try")
        if owner is None:
            owner = (request.get("identity") or {}).get("try_number")
        return OwnerRead(owner_try=int(owner) if owner is not None else None)

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Record in the job's folder (``mark.json``, written atomically) the try that owns it, and
        whether its outcome was collected; :meth:`poll` reports both. ``collected`` never goes back."""
        if owner_try is not None and (isinstance(owner_try, bool) or not isinstance(owner_try, int) or owner_try < 1):
            raise ValueError(f"owner_try={owner_try!r} must be an Airflow try number (an integer >= 1) or None")
        job_dir = self._job_dir(handle)
        if common.read_json(job_dir / common.REQUEST_FILE) is None:
            raise GpuJobError(f"local job {handle.job_id}: cannot mark it, its folder {job_dir} is gone")
        marks = common.read_json(job_dir / common.MARK_FILE) or {}
        if owner_try is not None:
            marks["owner_try"] = owner_try
        marks["collected"] = bool(marks.get("collected")) or bool(collected)
        marks["updated_at"] = time.time()
        try:
            common.write_json_atomic(job_dir / common.MARK_FILE, marks)
        except OSError as err:
            raise GpuJobError(f"local job {handle.job_id}: could not write {common.MARK_FILE}: {err}") from err

    # --- lookup and housekeeping ---------------------------------------------------------------

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of exactly this task instance found in the state directory, oldest attempt first."""
        handles = [JobHandle.from_dict(req["handle"]) for req in self._requests(task) if "handle" in req]
        return sorted(handles, key=lambda h: (h.attempt, h.submitted_at, h.job_id))

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A job by id (its folder's name; today also its attempt name) or by attempt name, else ``None``."""
        field_name, value = lookup_key(job_id, name)
        if "/" in value or "\0" in value or value.startswith("."):
            # never a path: the value may come from a template, and folders outside jobs/ are not jobs
            raise ValueError(f"{field_name}={value!r}: local job ids and names hold no '/' and do not start with '.'")
        folder = self._jobs_dir() / value
        # its own folder first; folders of older versions carry a random suffix after the name
        first = [folder] if folder.is_dir() and not folder.is_symlink() else []
        for job_dir in [*first, *self._job_dirs()]:
            req = common.read_json(job_dir / common.REQUEST_FILE)
            if req is not None and "handle" in req:
                handle = JobHandle.from_dict(req["handle"])
                if value == (handle.job_id if field_name == "job_id" else handle.name):
                    return handle
        return None

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        """The task instance recorded in the job's ``request.json`` (``None`` once its folder is gone)."""
        req = common.read_json(self._job_dir(handle) / common.REQUEST_FILE)
        task = (req or {}).get("task")
        return TaskKey(**task) if isinstance(task, dict) else None

    def list_jobs(self) -> list[JobHandle]:
        """Every job in the state directory, of any task, oldest submission first (cleanup, reaper)."""
        requests = (common.read_json(job_dir / common.REQUEST_FILE) for job_dir in self._job_dirs())
        handles = [JobHandle.from_dict(req["handle"]) for req in requests if req is not None and "handle" in req]
        return sorted(handles, key=lambda h: (h.submitted_at, h.job_id))

    def list_owned(self) -> list[OwnedJob]:
        """Every job in the state directory that has not ended, with the task and try of its ``request.json``.

        Reading a job's status also ends a job whose supervisor died (see :meth:`poll`); such a job
        is not listed. A job whose state cannot be read is listed as ``RUNNING``: it may be running.
        """
        owned: list[OwnedJob] = []
        for job_dir in self._job_dirs():
            req = common.read_json(job_dir / common.REQUEST_FILE)
            if req is None or "handle" not in req:
                continue
            handle = JobHandle.from_dict(req["handle"])
            status = self.poll([handle])[handle.job_id]
            if isinstance(status, JobStatus) and status.state.terminal:
                continue
            task = req.get("task")
            identity = req.get("identity") or {}
            resources = req.get("resources") or {}
            owner = status.owner_try if isinstance(status, JobStatus) else None
            try_number = owner if owner is not None else identity.get("try_number")
            owned.append(
                OwnedJob(
                    handle=handle,
                    task=TaskKey(**task) if isinstance(task, dict) else None,
                    state=status.state if isinstance(status, JobStatus) else JobState.RUNNING,
                    try_number=int(try_number) if try_number is not None else None,
                    team=identity.get("team") or None,
                    started_at=status.started_at if isinstance(status, JobStatus) else None,
                    nodes=int(resources.get("nodes") or 1),
                    gpus=float(resources.get("gpus") or 0.0),
                    max_runtime_s=req.get("max_runtime_s"),
                    # the supervisor counts max_runtime from the job's start; a job waiting for GPUs has no limit
                    max_wait_s=None,
                    training_seconds=None,
                )
            )
        return sorted(owned, key=lambda o: (o.handle.submitted_at, o.handle.job_id))

    def prune(self, *, now: float | None = None) -> list[str]:
        """Delete the folders of jobs that ended more than ``retention_days`` ago; return their ids.

        Never leaves the state directory: a ``jobs/`` that is a symbolic link is not pruned at all,
        links inside it are not followed (nor removed), and folders are removed through a handle on
        ``jobs/`` itself. Only folders that are really gone afterwards are reported. Jobs still
        running, or whose state cannot be read, are never touched.
        """
        return common.prune_jobs(self._jobs_dir(), self.retention_days, time.time() if now is None else now)

    def job_pids(self, handle: JobHandle) -> list[int]:
        """Pids of the job's node processes (each leads its own process group), in rank order.

        Empty before the nodes started. The supervisor's pid is not included: it is bookkeeping, not the job.
        """
        status = common.read_json(self._job_dir(handle) / common.STATUS_FILE) or {}
        return [int(node["pid"]) for node in status.get("nodes") or [] if node.get("pid")]

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Complete lines of ``job.log`` after ``cursor``, about ``max_bytes`` of them per call.

        Overlong lines come cut (:func:`~gpu_provider.backends.base.clip_line`'s words) and their rest
        is skipped without being held in memory; see :mod:`gpu_provider.backends._local_logs`.
        """
        return read_log(self._job_dir(handle) / common.LOG_FILE, cursor, max_bytes)

    def console_url(self, handle: JobHandle) -> str | None:
        """None: the job's log is a file on the worker, which no browser can open from the Airflow UI;
        the task log holds its lines and names its path."""
        return None

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` complete lines of ``job.log``, from its last 64 KiB (each cut like every log line)."""
        return read_tail(self._job_dir(handle) / common.LOG_FILE, lines)


def _instance_gpu_model(instance_type: str) -> str:
    """The NVIDIA GPU model of an instance type, from the price table (``p5.48xlarge`` -> ``h100``)."""
    from gpu_provider.spend.prices import shipped_table

    instances = shipped_table()["instances"]
    info = instances.get(instance_type) or instances.get(instance_type.removeprefix("ml.")) or {}
    model = str(info.get("accelerator") or "")
    if model not in NVIDIA_MODELS:
        allowed = ", ".join(sorted(t for t, i in instances.items() if i.get("accelerator") in NVIDIA_MODELS))
        raise ValueError(
            f"resources.instance_types: {instance_type!r} has no NVIDIA GPU model the local backend can match "
            f"against nvidia-smi (its accelerator: {model or 'unknown'}); allowed: {allowed}"
        )
    return model
