"""``GpuJobOperator``: one GPU job (preprocessing, training, inference) on any backend.

The operator orchestrates; every service call lives in a backend. One task instance may run
several *attempts* of its job: after a spot interruption, or spot capacity that never came, the
capacity policy picks the next attempt's capacity and the job resumes from its latest checkpoint.
Those attempts do not use Airflow's ``retries``; a job's own failure does, and the retry resumes
from the checkpoint too. A new try first looks for the previous try's job and reattaches to it.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseOperator

from gpu_provider._watch import AttemptWatch, declared_output
from gpu_provider.backends.base import (
    Backend,
    JobHandle,
    JobIdentity,
    JobRequest,
    JobState,
    JobStatus,
    TaskKey,
    check_backend_name,
    resolve_backend,
)
from gpu_provider.exceptions import (
    GpuJobCancelledError,
    GpuJobFailedError,
    GpuJobInterruptionBudgetError,
    GpuJobPollError,
)
from gpu_provider.job import Checkpoint, GpuResources, is_templated, to_seconds, validate_checkpoint_uri
from gpu_provider.links.gpu_job import CONSOLE_URL_XCOM_KEY, LOGS_URL_XCOM_KEY, GpuJobConsoleLink, GpuJobLogsLink
from gpu_provider.recovery import (
    CAPACITY_TIMEOUT,
    PREEMPTED,
    SPOT,
    CapacityPolicy,
    Interruption,
    resolve_capacity,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
    from pydantic import JsonValue

#: spot without a checkpoint is fine for short jobs; above this max runtime it earns a warning
SPOT_WITHOUT_CHECKPOINT_WARN_S = 3600.0

#: task state store key holding this task instance's attempt records (survives worker crashes)
STATE_KEY = "gpu_provider_attempts"

#: variables the provider sets on every job; ``env=`` may not override them
_RESERVED_ENV = frozenset({"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEAM = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def _iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat() if ts else None


def _validate_command(command: Any) -> list[str]:
    if isinstance(command, str):
        raise TypeError(
            f"command={command!r} must be a list of arguments, e.g. ['python', 'train.py', '--epochs', '3'] "
            "(a string would need a shell; pass ['bash', '-c', '...'] if you want one)"
        )
    if not isinstance(command, Sequence) or not command:
        raise TypeError(f"command={command!r} must be a non-empty list of strings")
    out = []
    for i, arg in enumerate(command):
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            arg = str(arg)
        if not isinstance(arg, str):
            raise TypeError(f"command[{i}]={arg!r} ({type(arg).__name__}) must be a string")
        out.append(arg)
    return out


def _validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env={type(env).__name__} must be a mapping of variable names to strings")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ValueError(f"env key {key!r} is not a valid environment variable name (letters, digits, _)")
        if key in _RESERVED_ENV or key.startswith("GPU_PROVIDER_"):
            raise ValueError(
                f"env key {key!r} is set by the provider on every job (GPU_PROVIDER_*, NNODES, NODE_RANK, "
                "MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES) and cannot be overridden"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            # never echo the value: it may be a secret
            raise TypeError(f"env[{key!r}] is a {type(value).__name__}; environment values must be strings")
        out[key] = str(value)
    return out


def _to_resources(resources: Any) -> GpuResources:
    if resources is None:
        return GpuResources()
    if isinstance(resources, GpuResources):
        return resources
    if isinstance(resources, Mapping):
        try:
            return GpuResources(**resources)
        except TypeError as err:
            raise TypeError(f"resources={dict(resources)!r}: {err}") from err
    raise TypeError(f"resources={resources!r} ({type(resources).__name__}) must be GpuResources(...) or a dict")


def _to_checkpoint(checkpoint: Any) -> Checkpoint | None:
    if checkpoint is None or isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, str):
        return Checkpoint(uri=checkpoint)
    raise TypeError(
        f"checkpoint={checkpoint!r} ({type(checkpoint).__name__}) must be Checkpoint(uri=...) or a URI string"
    )


def _backend_is_templated(backend: Any) -> bool:
    if isinstance(backend, Mapping):
        return any(is_templated(v) for v in backend.values())
    return is_templated(backend)


@dataclass(frozen=True)
class _Plan:
    """The rendered, validated fields of this try (the untemplated spec stays on the operator)."""

    backend: Backend
    command: list[str]
    env: dict[str, str]
    image: str | None
    checkpoint_uri: str | None
    max_runtime_s: float | None
    poll_interval: float


class GpuJobOperator(BaseOperator):
    """Run one GPU job on a backend, with spot fallback, checkpoint-resume and reattach.

    :param command: the job's command as a list of arguments (templated).
    :param backend: a backend object, a registered name (``"local"``, the default), or a mapping
        ``{"name": "local", "simulate_preemptions": "[8]"}`` whose other keys are the backend's
        options (templated).
    :param image: container image the job runs in, for container backends (templated).
    :param env: extra environment variables for the job (templated). The job does not inherit the
        worker's environment; it gets a minimal base (PATH, HOME, locale), this, and the contract.
    :param resources: :class:`~gpu_provider.GpuResources` or a dict of its fields (default 1 GPU, 1 node).
    :param capacity: :class:`~gpu_provider.OnDemand` (default), :class:`~gpu_provider.Spot`,
        :class:`~gpu_provider.SpotFallback`, or ``"on_demand"`` | ``"spot"`` | ``"spot_fallback"``.
    :param checkpoint: :class:`~gpu_provider.Checkpoint` or a URI string (its URI is templated);
        every attempt resumes from the newest complete checkpoint found there.
    :param team: the team that owns the job: sets ``pool="gpu_<team>"`` and ``pool_slots`` to the
        job's total GPUs rounded up; also tagged on the job for cost attribution.
    :param priority: sets ``priority_weight`` with the ``absolute`` weight rule; backends with
        service-side priorities also pass it on (Batch: ``schedulingPriorityOverride`` on fair-share
        queues, 0-9999).
    :param max_runtime: longest one attempt may run (timedelta or seconds), enforced by the backend
        on the job itself; ``execution_timeout``, if shorter, is enforced the same way.
    :param deferrable: wait in the triggerer instead of a worker slot (default:
        ``[operators] default_deferrable``).
    :param poll_interval: seconds between status checks (default: ``[gpu_provider] poll_interval``,
        else the backend's own default).
    """

    template_fields: Sequence[str] = ("command", "backend", "image", "env", "checkpoint_uri")
    template_fields_renderers = {"command": "py", "env": "json", "backend": "json"}
    ui_color = "#c9f0d6"
    # runtime-only state (a lock inside) is shared, not deep-copied, when Airflow copies the task
    shallow_copy_attrs: Sequence[str] = ("_stop",)
    operator_extra_links = (GpuJobConsoleLink(), GpuJobLogsLink())

    def __init__(
        self,
        *,
        command: Sequence[str] | str,
        backend: Backend | str | Mapping[str, Any] | None = None,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        resources: GpuResources | Mapping[str, Any] | None = None,
        capacity: CapacityPolicy | str | None = None,
        checkpoint: Checkpoint | str | None = None,
        team: str | None = None,
        priority: int | None = None,
        max_runtime: timedelta | float | None = None,
        deferrable: bool | None = None,
        poll_interval: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.gpu_resources = _to_resources(resources)
        if team is not None:
            if not isinstance(team, str) or not _TEAM.match(team):
                raise ValueError(
                    f"team={team!r} must be lower-case letters, digits, '-' or '_' (1-63 chars, e.g. 'vision'); "
                    "it names the pool gpu_<team>"
                )
            pool = f"gpu_{team}"
            if kwargs.get("pool") not in (None, pool):
                raise ValueError(f"team={team!r} sets pool={pool!r}; do not also pass pool={kwargs['pool']!r}")
            kwargs["pool"] = pool
            kwargs.setdefault("pool_slots", self.gpu_resources.pool_slots)
        if priority is not None:
            if not isinstance(priority, int) or isinstance(priority, bool):
                raise TypeError(f"priority={priority!r} ({type(priority).__name__}) must be an integer")
            kwargs["priority_weight"] = priority
            kwargs["weight_rule"] = "absolute"
        super().__init__(**kwargs)

        self.command = command if is_templated(command) else _validate_command(command)
        self.env = env if env is None or _backend_is_templated(env) else _validate_env(env)
        self.image = image
        if backend is None:
            from airflow.configuration import conf

            backend = conf.get("gpu_provider", "default_backend", fallback="") or None
        self.backend = backend
        self.capacity = resolve_capacity(capacity)
        ckpt = _to_checkpoint(checkpoint)
        self.checkpoint_uri = ckpt.uri if ckpt else None
        self.checkpoint_keep = ckpt.keep if ckpt else None
        self.team = team
        self.job_priority = priority
        self.max_runtime_s = to_seconds("max_runtime", max_runtime)
        if self.max_runtime_s == 0:
            raise ValueError("max_runtime=0 must be > 0 seconds (None for no limit)")
        if poll_interval is not None:
            poll = to_seconds("poll_interval", poll_interval, allow_none=False)
            if not poll:
                raise ValueError(f"poll_interval={poll_interval!r} must be > 0 seconds")
            poll_interval = poll
        self.poll_interval = poll_interval
        if deferrable is None:
            from airflow.configuration import conf

            deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)
        self.deferrable = bool(deferrable)

        # parse-time checks of what is already known
        if not _backend_is_templated(backend):
            known = resolve_backend(backend)
            self._validate_for(known, self._runtime_limit(self.max_runtime_s))
            if not is_templated(image):
                known.validate_image(image or None)
        elif isinstance(backend, Mapping) and not is_templated(backend.get("name")):
            check_backend_name(str(backend.get("name")))
        self._warn_spot_without_checkpoint()
        self._handle: JobHandle | None = None
        self._backend: Backend | None = None
        self._run_id: str | None = None
        self._log_link: str | None = None
        #: output URIs declared in the logs this process has read, by job id
        self._log_outputs: dict[str, str | None] = {}
        self._stop = threading.Event()

    # ------------------------------------------------------------------ parse & render checks
    def _warn_spot_without_checkpoint(self) -> None:
        if SPOT not in self.capacity.may_use or self.checkpoint_uri:
            return
        runtime = self.max_runtime_s
        if runtime is None or runtime > SPOT_WITHOUT_CHECKPOINT_WARN_S:
            limit = "no max_runtime" if runtime is None else f"max_runtime={runtime:.0f}s"
            warnings.warn(
                f"task {self.task_id!r}: capacity={self.capacity!r} may run on spot, but the job has no "
                f"checkpoint= and {limit} (> {SPOT_WITHOUT_CHECKPOINT_WARN_S:.0f}s): every interruption restarts "
                "it from the beginning. Add checkpoint=Checkpoint(uri=...) or use capacity='on_demand'.",
                UserWarning,
                stacklevel=3,
            )

    def _plan(self, context: Context) -> _Plan:
        """Validate the rendered fields (templates are resolved by now) and fix the job for this try."""
        backend = resolve_backend(self.backend)
        self._backend = backend
        self._run_id = str(context["ti"].run_id)
        max_runtime_s = self._runtime_limit(self.max_runtime_s)
        self._validate_for(backend, max_runtime_s)
        image = self.image or None
        backend.validate_image(image)
        checkpoint_uri = validate_checkpoint_uri(self.checkpoint_uri) if self.checkpoint_uri else None
        poll = self.poll_interval or self._configured_poll_interval(backend)
        return _Plan(
            backend=backend,
            command=_validate_command(self.command),
            env=_validate_env(self.env),
            image=image,
            checkpoint_uri=checkpoint_uri,
            max_runtime_s=max_runtime_s,
            poll_interval=poll,
        )

    def _validate_for(self, backend: Backend, max_runtime_s: float | None) -> None:
        backend.validate(
            self.gpu_resources,
            self.capacity.first_capacity(),
            multi_capacity=len(self.capacity.may_use) > 1,
            priority=self.job_priority,
            max_runtime_s=max_runtime_s,
        )

    def _runtime_limit(self, max_runtime_s: float | None) -> float | None:
        """The shorter of ``max_runtime`` and ``execution_timeout``: the backend enforces it on the job."""
        timeout = self.execution_timeout
        limits = [s for s in (max_runtime_s, timeout.total_seconds() if isinstance(timeout, timedelta) else None) if s]
        return min(limits) if limits else None

    @staticmethod
    def _configured_poll_interval(backend: Backend) -> float:
        from airflow.configuration import conf

        raw = conf.get("gpu_provider", "poll_interval", fallback="") or ""
        if raw.strip():
            value = to_seconds("[gpu_provider] poll_interval", raw, allow_none=False)
            if value:
                return value
        return backend.default_poll_interval

    # ------------------------------------------------------------------ execution
    def execute(self, context: Context) -> Any:
        plan = self._plan(context)
        task = self._task_key(context)
        records = self._previous_attempts(context, plan.backend, task)
        if records:
            last = records[-1]
            handle = JobHandle.from_dict(last["handle"])
            state = JobState(last["state"])
            if state.active:
                self.log.info(
                    "Reattaching to %s job %s (attempt %d, %s) left by an earlier try; not submitting a new one.",
                    plan.backend.name,
                    handle.job_id,
                    handle.attempt,
                    state.value,
                )
                self._publish_link(context, plan.backend, handle)
                return self._wait(context, plan, records, handle)
            if state is JobState.SUCCEEDED:
                self.log.info("Job %s of an earlier try already succeeded; returning its result.", handle.job_id)
                self._publish_link(context, plan.backend, handle)
                return self._result(plan, records)
            if last.get("interruption"):
                # interrupted while no worker watched: the policy and its budget decide, as if we had seen it
                status = JobStatus(state=state, reason=str(last.get("reason") or ""))
                return self._attempt_ended(context, plan, records, handle, status, capacity_timeout=False)
        return self._start_attempt(context, plan, records)

    def execute_complete(
        self, context: Context, event: dict[str, Any], records: list[dict[str, Any]] | None = None
    ) -> Any:
        """Resume after the trigger fired: check the event, then apply the recovery policy.

        ``records`` (the attempts so far) come back from ``defer(kwargs=...)``; where a runner does
        not hand them back (``dag.test()`` replaces them with the event), they are read again from
        the task state store, else from the backend.
        """
        if not isinstance(event, dict) or event.get("status") not in _EVENT_STATUSES:
            raise GpuJobPollError(f"GPU job trigger returned an unexpected event: {event!r}")
        plan = self._plan(context)
        if not records:
            records = self._previous_attempts(context, plan.backend, self._task_key(context))
        handle = JobHandle.from_dict(event["handle"])
        self._handle = handle
        if event["status"] == "poll_error":
            raise GpuJobPollError(event.get("message") or "could not read the job's status")
        status = JobStatus.from_dict(event["job_status"])
        self._publish_log_link(context, status.log_url)
        if not plan.backend.stream_logs_when_deferred:
            self._read_log(plan.backend, handle, copy=True)
        timed_out = event["status"] == "capacity_timeout"
        return self._attempt_ended(context, plan, records, handle, status, capacity_timeout=timed_out)

    def _task_key(self, context: Context) -> TaskKey:
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return TaskKey(
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            run_id=ti.run_id,
            map_index=-1 if map_index is None else int(map_index),
        )

    def _previous_attempts(self, context: Context, backend: Backend, task: TaskKey) -> list[dict[str, Any]]:
        """Attempt records of earlier tries, with their current state.

        The task state store keeps the full records (resume point, try, interruption kind). The
        backend's lookup by identity is asked too: it also finds an attempt submitted just before a
        crash that kept its record from reaching the store, so that attempt is reattached, not duplicated.
        """
        records: list[dict[str, Any]] = []
        store = context.get("task_state_store")
        if store is not None:
            try:
                stored = store.get(STATE_KEY)
            except Exception as err:  # the store is an optimisation; the backend lookup still works
                self.log.warning("Could not read the task state store (%s); asking the backend instead.", err)
                stored = None
            if isinstance(stored, list):
                records = [r for r in stored if isinstance(r, dict) and "handle" in r]
        known = {r["job_id"] for r in records}
        records += [self._record(h) for h in backend.find_existing(task) if h.job_id not in known]
        if not records:
            return []
        records.sort(key=lambda r: int(r["attempt"]))
        handles = [JobHandle.from_dict(r["handle"]) for r in records]
        statuses = backend.poll(handles)
        for record, handle in zip(records, handles, strict=True):
            status = statuses.get(handle.job_id)
            if status is not None:
                self._update_record(record, status)
        return records

    # ------------------------------------------------------------------ attempts
    def _start_attempt(self, context: Context, plan: _Plan, records: list[dict[str, Any]]) -> Any:
        interruptions = _interruptions(records)
        capacity = self.capacity.capacity_after(interruptions) if interruptions else self.capacity.first_capacity()
        attempt = max((int(r["attempt"]) for r in records), default=0) + 1
        resume_from = self._latest_checkpoint(plan.backend, plan.checkpoint_uri)
        task = self._task_key(context)
        identity = JobIdentity(
            task=task, try_number=int(context["ti"].try_number), attempt=attempt, capacity=capacity, team=self.team
        )
        env = dict(plan.env)
        env.update(
            {
                "GPU_PROVIDER_CHECKPOINT_URI": plan.checkpoint_uri or "",
                "GPU_PROVIDER_CHECKPOINT_KEEP": str(self.checkpoint_keep or ""),
                "GPU_PROVIDER_RESUME_FROM": resume_from or "",
                "GPU_PROVIDER_ATTEMPT": str(attempt),
                "GPU_PROVIDER_CAPACITY": capacity,
            }
        )
        request = JobRequest(
            identity=identity,
            command=tuple(plan.command),
            env=env,
            resources=self.gpu_resources,
            capacity=capacity,
            image=plan.image,
            max_runtime_s=plan.max_runtime_s,
            checkpoint_uri=plan.checkpoint_uri,
            resume_from=resume_from,
            priority=self.job_priority,
        )
        handle = plan.backend.submit(request)
        self._handle = handle
        self.log.info(
            "Submitted %s job %s (attempt %d, %s capacity, %s GPU(s) x %d node(s)), %s; env keys: %s",
            plan.backend.name,
            handle.job_id,
            attempt,
            capacity,
            self.gpu_resources.gpus,
            self.gpu_resources.nodes,
            f"resuming from {resume_from}" if resume_from else "starting fresh (no checkpoint yet)",
            ", ".join(sorted(env)) or "-",
        )
        records.append(self._record(handle, resume_from, int(context["ti"].try_number)))
        self._persist(context, records)
        self._publish_link(context, plan.backend, handle)
        return self._wait(context, plan, records, handle)

    def _publish_link(self, context: Context, backend: Backend, handle: JobHandle) -> None:
        url = backend.console_url(handle)
        if url:
            context["ti"].xcom_push(key=CONSOLE_URL_XCOM_KEY, value=url)
        self._publish_log_link(context, backend.logs_url(handle))

    def _publish_log_link(self, context: Context, url: str | None) -> None:
        """Point the "GPU job logs" button at ``url`` (the newest known place of the attempt's log)."""
        if url and url != self._log_link:
            context["ti"].xcom_push(key=LOGS_URL_XCOM_KEY, value=url)
            self._log_link = url

    def _wait(self, context: Context, plan: _Plan, records: list[dict[str, Any]], handle: JobHandle) -> Any:
        self._handle = handle
        spot_wait = self.capacity.spot_wait_timeout_s if handle.capacity == SPOT else None
        if self.deferrable:
            from gpu_provider.triggers.gpu_job import GpuJobTrigger

            self.defer(
                trigger=GpuJobTrigger(
                    backend=plan.backend.spec(),
                    handle=handle.to_dict(),
                    poll_interval=plan.poll_interval,
                    spot_wait_timeout=spot_wait,
                    stream_logs=plan.backend.stream_logs_when_deferred,
                    task_label=self._task_label(),
                ),
                method_name="execute_complete",
                kwargs={"records": records},
            )
        status, timed_out = self._wait_sync(context, plan, handle, spot_wait)
        return self._attempt_ended(context, plan, records, handle, status, capacity_timeout=timed_out)

    def _wait_sync(
        self, context: Context, plan: _Plan, handle: JobHandle, spot_wait: float | None
    ) -> tuple[JobStatus, bool]:
        """Poll in the worker until the attempt ends; stream its log into the task log."""
        watch = AttemptWatch(plan.backend, handle, spot_wait_timeout=spot_wait, log=self.log)
        while True:
            try:
                status = plan.backend.poll([handle])[handle.job_id]
            except Exception as err:
                give_up = watch.failed_read(err)
                if give_up:
                    raise GpuJobPollError(
                        f"{give_up}. The job may still be running: a retry of this task will reattach to it."
                    ) from err
                self._stop.wait(plan.poll_interval)
                continue
            self._publish_log_link(context, status.log_url)
            outcome = watch.read(status)
            if outcome is not None:
                self._log_outputs[handle.job_id] = watch.output_uri
                return status, outcome == CAPACITY_TIMEOUT
            self._stop.wait(plan.poll_interval)

    def _attempt_ended(
        self,
        context: Context,
        plan: _Plan,
        records: list[dict[str, Any]],
        handle: JobHandle,
        status: JobStatus,
        *,
        capacity_timeout: bool,
    ) -> Any:
        record = _find_record(records, handle)
        if capacity_timeout:
            reason = (
                f"no spot capacity after {self.capacity.spot_wait_timeout_s:.0f}s waiting "
                f"(spot_wait_timeout); cancelled by Airflow task {self.dag_id}.{self.task_id}"
            )
            plan.backend.cancel(handle, reason)
            status = JobStatus(
                state=JobState.CANCELLED, reason=reason, started_at=status.started_at, ended_at=time.time()
            )
            record["interruption"] = CAPACITY_TIMEOUT
        elif status.state is JobState.PREEMPTED:
            record["interruption"] = PREEMPTED
        if status.state is JobState.SUCCEEDED and not status.output_uri:
            # the log was read already when this process watched or copied it; else read it now
            if handle.job_id in self._log_outputs:
                output = self._log_outputs[handle.job_id]
            else:
                output = self._read_log(plan.backend, handle, copy=False)
            status = dataclasses.replace(status, output_uri=output)
        self._update_record(record, status)
        self._persist(context, records)
        where = (
            f"{plan.backend.name} job {handle.name} (id {handle.job_id}, attempt {handle.attempt}, {handle.capacity})"
        )

        if status.state is JobState.SUCCEEDED:
            result = self._result(plan, records)
            self.log.info(
                "%s SUCCEEDED after %d attempt(s); %.1f GPU-seconds in all.", where, len(records), result["gpu_seconds"]
            )
            return result
        if record.get("interruption"):
            interruptions = _interruptions(records)
            budget = self.capacity.max_interruptions
            what = "spot capacity did not come" if capacity_timeout else "treated as a spot interruption"
            if len(interruptions) > budget:
                raise GpuJobInterruptionBudgetError(
                    f"{where} ended {status.state.value}: {status.reason or 'no reason given'}. {what.capitalize()}, "
                    f"but this task has now been interrupted {len(interruptions)} times and its interruption budget "
                    f"(max_interruptions={budget}) is spent; not resubmitting. Raise max_interruptions or use "
                    "capacity='on_demand'."
                )
            next_capacity = self.capacity.capacity_after(interruptions)
            delay = self.capacity.backoff_delay(len(interruptions))
            self.log.warning(
                "%s ended %s: %s. %s; resubmitting on %s (attempt %d, interruption %d of at most %d)%s.",
                where,
                status.state.value,
                status.reason or "no reason given",
                what.capitalize(),
                next_capacity,
                max(int(r["attempt"]) for r in records) + 1,
                len(interruptions),
                budget,
                f" in {delay:.1f}s" if delay else "",
            )
            if delay:
                self._stop.wait(delay)
            if self._stop.is_set():
                raise GpuJobCancelledError(f"this task was killed before it could resubmit {where}.")
            return self._start_attempt(context, plan, records)
        if status.state is JobState.CANCELLED and self._stop.is_set():
            raise GpuJobCancelledError(f"{where} was cancelled because this task was killed.")
        if status.state is JobState.CANCELLED:
            raise GpuJobCancelledError(
                f"{where} was CANCELLED: {status.reason or 'no reason given'}. It was stopped outside this task; "
                "clear the task to run it again."
            )
        try_number, retries = int(context["ti"].try_number), int(self.retries or 0)
        if try_number <= retries:
            next_step = f"Airflow will retry it (retry {try_number} of {retries})" + (
                ", resuming from the latest checkpoint." if plan.checkpoint_uri else ", starting it again."
            )
        else:
            next_step = f"No Airflow retries are left (retries={retries})."
        raise GpuJobFailedError(
            f"{where} ended FAILED: {status.reason or 'no reason given'}"
            + (f" (exit code {status.exit_code})" if status.exit_code is not None else "")
            + f". This is the job's own error, not an interruption. {next_step}"
        )

    # ------------------------------------------------------------------ records & results
    @staticmethod
    def _record(handle: JobHandle, resume_from: str | None = None, try_number: int | None = None) -> dict[str, Any]:
        """A new attempt record (resume point and try are unknown for attempts found by lookup)."""
        return {
            "attempt": handle.attempt,
            "job_id": handle.job_id,
            "name": handle.name,
            "capacity": handle.capacity,
            "state": JobState.QUEUED.value,
            "reason": "",
            "started_at": None,
            "ended_at": None,
            "resume_from": resume_from,
            "try_number": try_number,
            "gpu_seconds": 0.0,
            "output_uri": None,
            "interruption": None,
            "queue": handle.extra.get("queue"),
            "handle": handle.to_dict(),
        }

    @staticmethod
    def _update_record(record: dict[str, Any], status: JobStatus) -> None:
        record["state"] = status.state.value
        record["reason"] = status.reason
        record["started_at"] = _iso(status.started_at) or record.get("started_at")
        record["ended_at"] = _iso(status.ended_at) or record.get("ended_at")
        record["gpu_seconds"] = round(status.gpu_seconds, 3)
        if status.state is JobState.PREEMPTED:
            record["interruption"] = PREEMPTED
        if status.exit_code is not None:
            record["exit_code"] = status.exit_code
        if status.output_uri:
            record["output_uri"] = status.output_uri

    def _persist(self, context: Context, records: list[dict[str, Any]]) -> None:
        store = context.get("task_state_store")
        if store is None:
            return
        try:
            store.set(STATE_KEY, cast("JsonValue", records))
        except Exception as err:  # reattach still works through the backend's lookup
            self.log.warning("Could not save attempts to the task state store (%s).", err)

    def _result(self, plan: _Plan, records: list[dict[str, Any]]) -> dict[str, Any]:
        last = records[-1]
        attempts = [{k: v for k, v in r.items() if k != "handle"} for r in records]
        return {
            "backend": plan.backend.name,
            "job_id": last["job_id"],
            "job_name": last["name"],
            "state": last["state"],
            "capacity": last["capacity"],
            "attempts": attempts,
            "interruptions": sum(1 for r in records if r.get("interruption")),
            "gpu_seconds": round(sum(float(r.get("gpu_seconds") or 0) for r in records), 3),
            "checkpoint_uri": plan.checkpoint_uri,
            "output_uri": last.get("output_uri"),
        }

    @staticmethod
    def _latest_checkpoint(backend: Backend, uri: str | None) -> str | None:
        """The newest complete checkpoint at ``uri`` (S3 through the backend's AWS connection, or aws_default)."""
        if not uri:
            return None
        from gpu_provider._aws import s3_client_for
        from gpu_provider.runtime.checkpoint import latest_checkpoint

        return latest_checkpoint(uri, s3_client=s3_client_for(uri, getattr(backend, "aws_conn_id", None)))

    def _read_log(self, backend: Backend, handle: JobHandle, *, copy: bool) -> str | None:
        """Read an attempt's whole log once: copy it into the task log if asked, and return the
        output URI the job declared there (``declare_output`` prints it where no file is shared).

        When copying, an empty log is read again for up to ``backend.log_settle_s``: the log
        service may not have the lines yet.
        """
        found, position = None, 0
        deadline = time.monotonic() + (backend.log_settle_s if copy else 0.0)
        try:
            while True:
                lines, position = backend.logs(handle, position)
                for line in lines:
                    if copy:
                        self.log.info("[job] %s", line)
                found = declared_output(lines) or found
                if not lines and (position > 0 or time.monotonic() >= deadline):
                    break
                if not lines:
                    time.sleep(1.0)
        except Exception as err:  # the log is a convenience; it never fails the task
            self.log.warning("Could not read the log of %s job %s: %s", backend.name, handle.job_id, err)
        self._log_outputs[handle.job_id] = found
        return found

    def _task_label(self) -> str:
        run = f" of run {self._run_id}" if self._run_id else ""
        return f"Airflow task {self.dag_id}.{self.task_id}{run}"

    # ------------------------------------------------------------------ kill
    def on_kill(self) -> None:
        """Cancel the running attempt: a killed task must leave no GPU job behind."""
        self._stop.set()
        handle = self._handle
        if handle is None:
            return
        try:
            backend = self._backend or resolve_backend(self.backend)
            backend.cancel(handle, f"{self._task_label()} was killed")
            self.log.info("Cancelled %s job %s because the task was killed.", backend.name, handle.job_id)
        except Exception:
            self.log.exception("Could not cancel job %s on kill", handle.job_id)


_EVENT_STATUSES = frozenset({"succeeded", "failed", "preempted", "capacity_timeout", "cancelled", "poll_error"})


def _find_record(records: list[dict[str, Any]], handle: JobHandle) -> dict[str, Any]:
    for record in records:
        if record["job_id"] == handle.job_id:
            return record
    raise GpuJobPollError(f"job {handle.job_id} is not among this task's attempts; the task state is inconsistent")


def _interruptions(records: list[dict[str, Any]]) -> list[Interruption]:
    return [
        Interruption(attempt=int(r["attempt"]), capacity=str(r["capacity"]), kind=str(r["interruption"]))
        for r in records
        if r.get("interruption")
    ]
