"""The local backend's class: options, and the contract carried out by the modules beside it."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.base import (
    LOG_READ_BYTES,
    Backend,
    Capabilities,
    JobHandle,
    JobRequest,
    LogChunk,
    OwnedJob,
    OwnerRead,
    PollResult,
    TaskKey,
)
from gpu_provider.backends.common import check_owner_try
from gpu_provider.backends.local import common, control, folders, launch, lookups
from gpu_provider.backends.local.folders import this_host
from gpu_provider.backends.local.gpus import NVIDIA_MODELS, detect_gpu_models, detected_gpus
from gpu_provider.backends.local.logs import read_log, read_tail
from gpu_provider.backends.local.options import (
    default_run_as_user,
    default_state_dir,
    parse_gpus,
    parse_run_as_user,
    parse_simulate_preemptions,
    resolve_run_as,
    seconds_option,
)
from gpu_provider.backends.local.prune import prune_jobs, prune_now_and_then
from gpu_provider.backends.local.status import read_status
from gpu_provider.exceptions import GpuJobElsewhereError, GpuJobError, GpuJobStatusError

log = logging.getLogger("gpu_provider.backends.local")

# Things logged once per process, not once per job (a worker running many jobs would repeat them).
_logged_once: set[str] = set()
_logged_once_lock = threading.Lock()


def _log_once(key: str, message: str, *args: Any) -> None:
    with _logged_once_lock:
        if key in _logged_once:
            return
        _logged_once.add(key)
    log.warning(message, *args)


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
        else the worker's own user. The worker must run as root. Never from a template. Checked at submit,
        not at parse time (the DAG processor that parses the DAG may run as another user).
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
            devices, problem = detected_gpus(self.nvidia_smi, self.state_dir)  # one reading per minute and host
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

    # --- submit --------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> JobHandle:
        """Start the attempt, or return the handle of the one already started under its name.

        Nothing is left behind when it fails: no folder, no process.
        """
        launch.reap_children()
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
            jobs = folders.ensure_jobs_dir(self.state_dir)
        except OSError as err:
            raise GpuJobError(
                f"local job {identity.name}: cannot use the state directory {self.state_dir}: {err}"
            ) from err
        job_id = identity.name
        job_dir = jobs / job_id
        # the fork server is asked now, so that its child gets ready while the folder is written; it starts
        # nothing before start() below hands it the job's environment (abandoned: it exits, having started nothing)
        starting = launch.SupervisorStart(job_dir, state_dir=self.state_dir)
        try:
            return self._submit(request, jobs, job_dir, starting, run_as)
        finally:
            starting.abandon()

    def _submit(
        self,
        request: JobRequest,
        jobs: Path,
        job_dir: Path,
        starting: launch.SupervisorStart,
        run_as: dict[str, Any] | None,
    ) -> JobHandle:
        """:meth:`submit` from the create-or-adopt lookup on, the supervisor's start asked already."""
        identity, job_id = request.identity, job_dir.name
        try:
            existing = folders.existing(jobs, identity)
        except OSError as err:
            raise GpuJobError(
                f"local job {identity.name}: cannot use the state directory {self.state_dir}: {err}"
            ) from err
        if existing is not None:
            log.info("local job %s exists already (submitted before): adopting it", existing.job_id)
            return existing.as_adopted()
        spot_index = folders.previous_spot_attempts(jobs, identity.task) if request.capacity == names.SPOT else None
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
        handle = JobHandle(
            backend=self.name,
            job_id=job_id,
            name=identity.name,
            attempt=identity.attempt,
            capacity=request.capacity,
            submitted_at=time.time(),
            extra={"job_dir": str(job_dir), "host": this_host()},
        )
        work_dir = launch.work_folder(job_id, run_as)
        record = launch.request_record(
            request,
            handle,
            cwd=self.working_dir or os.getcwd(),
            run_as=run_as,
            work_dir=work_dir,
            devices=devices,
            model=model,
            grace_period=self.grace_period,
            spot_index=spot_index,
            preempt_after=preempt_after,
            state_dir=self.state_dir,
        )
        try:
            adopted = folders.create_job_dir(jobs, job_dir, record)
        except BaseException:
            common.remove_work_dir(work_dir)
            raise
        if adopted is not None:
            common.remove_work_dir(work_dir)
            log.info("local job %s was submitted at the same moment by another caller: adopting it", job_id)
            return adopted.as_adopted()
        secrets_payload = {"env": dict(request.env), "base_env": common.base_env(os.environ)}
        try:
            pid = starting.start(secrets_payload)
        except BaseException as err:
            shutil.rmtree(job_dir, ignore_errors=True)
            common.remove_work_dir(work_dir)
            if isinstance(err, OSError):
                raise GpuJobError(f"local job {job_id}: could not start the local supervisor: {err}") from err
            raise
        log.info("local job %s submitted (supervisor pid %s, state in %s)", job_id, pid, job_dir)
        prune_now_and_then(self.state_dir, self.prune)  # housekeeping, once the job runs: never before it
        return handle

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
        launch.reap_children()
        result: PollResult = {}
        for handle in handles:
            try:
                result[handle.job_id] = read_status(handle, self._job_dir(handle), backend=self.name)
            except GpuJobElsewhereError as err:
                result[handle.job_id] = err
            except (GpuJobError, OSError, ValueError, KeyError, TypeError) as err:
                result[handle.job_id] = GpuJobStatusError(
                    f"local job {handle.job_id}: its state in {self._job_dir(handle)} cannot be read: {err}"
                )
        return result

    # --- cancel and marks ----------------------------------------------------------------------

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Ask the supervisor to stop the job (SIGTERM to every node, SIGKILL after ``grace_period``).

        Returns at once; the processes are gone within about ``grace_period`` + 1 s. When the
        supervisor is already gone, the node processes are killed here and the job is marked cancelled.
        A reason starting (after :data:`~gpu_provider.names.CANCEL_PREFIX`) with
        :data:`~gpu_provider.names.CAPACITY_TIMEOUT_MARK` is reported later as ``interruption="capacity_timeout"``.
        Takes no lock: safe in a signal handler.
        """
        control.cancel(handle, self._job_dir(handle), reason)

    def simulate_preemption(self, handle: JobHandle) -> None:
        """Interrupt a running job now, as ``simulate_preemptions`` would (SIGTERM, grace period,
        SIGKILL; the job ends ``PREEMPTED``). For tests and demos of interruption handling."""
        control.simulate_preemption(handle, self._job_dir(handle))

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """The owner read from the job's folder now (``mark.json``, else the try in ``request.json``)."""
        return control.read_owner(handle, self._job_dir(handle))

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Record in the job's folder (``mark.json``, written atomically) the try that owns it, and
        whether its outcome was collected; :meth:`poll` reports both. ``collected`` never goes back."""
        if owner_try is not None:
            check_owner_try(owner_try)
        control.mark(handle, self._job_dir(handle), owner_try=owner_try, collected=collected)

    # --- lookup and housekeeping ---------------------------------------------------------------

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of exactly this task instance found in the state directory, oldest attempt first."""
        return lookups.find_existing(self._jobs_dir(), task)

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A job by id (its folder's name; today also its attempt name) or by attempt name, else ``None``."""
        return lookups.lookup(self._jobs_dir(), job_id=job_id, name=name)

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        """The task instance recorded in the job's ``request.json`` (``None`` once its folder is gone)."""
        return lookups.task_of(self._job_dir(handle))

    def list_jobs(self) -> list[JobHandle]:
        """Every job in the state directory, of any task, oldest submission first (cleanup, reaper)."""
        return lookups.list_jobs(self._jobs_dir())

    def list_owned(self) -> list[OwnedJob]:
        """Every job in the state directory that has not ended, with the task and try of its ``request.json``.

        Reading a job's status also ends a job whose supervisor died (see :meth:`poll`); such a job
        is not listed. A job whose state cannot be read is listed as ``RUNNING``: it may be running.
        """
        return lookups.list_owned(self._jobs_dir(), self.poll)

    def prune(self, *, now: float | None = None) -> list[str]:
        """Delete the folders of jobs that ended more than ``retention_days`` ago; return their ids.

        Never leaves the state directory: a ``jobs/`` that is a symbolic link is not pruned at all,
        links inside it are not followed (nor removed), and folders are removed through a handle on
        ``jobs/`` itself. Only folders that are really gone afterwards are reported. Jobs still
        running, or whose state cannot be read, are never touched.
        """
        return prune_jobs(self._jobs_dir(), self.retention_days, time.time() if now is None else now)

    def job_pids(self, handle: JobHandle) -> list[int]:
        """Pids of the job's node processes (each leads its own process group), in rank order.

        Empty before the nodes started. The supervisor's pid is not included: it is bookkeeping, not the job.
        """
        status = common.read_json(self._job_dir(handle) / common.STATUS_FILE) or {}
        return [int(node["pid"]) for node in status.get("nodes") or [] if node.get("pid")]

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Complete lines of ``job.log`` after ``cursor``, about ``max_bytes`` of them per call.

        Overlong lines come cut (:func:`~gpu_provider.backends.base.clip_line`'s words) and their rest
        is skipped without being held in memory; see :mod:`gpu_provider.backends.local.logs`.
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
