"""``GpuJobSensor``: wait for a GPU job this task did not submit (another DAG's, or one started by hand).

The sensor finds the job through the backend contract (``Backend.lookup``), waits deferred by
default through :class:`~gpu_provider.triggers.gpu_job_watch.GpuJobWatchTrigger` and the shared,
batched poller the operator uses, and ends with the job: its status to XCom when it succeeds, an
error naming the backend, job, state and reason otherwise. With ``follow_resubmits=True``, a job
that was interrupted (spot reclaim, capacity timeout, lost) and that ``GpuJobOperator`` resubmits is
followed to the next attempt of the same task instance, found by identity (``Backend.task_of`` and
``Backend.find_existing``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from gpu_provider import names
from gpu_provider.backends.base import (
    Backend,
    JobHandle,
    JobState,
    JobStatus,
    TaskKey,
    check_backend_name,
    resolve_backend,
)
from gpu_provider.exceptions import (
    GpuBackendThrottledError,
    GpuJobCancelledError,
    GpuJobError,
    GpuJobFailedError,
    GpuJobPollError,
)
from gpu_provider.job import MAX_DURATION_S, is_templated, to_bool
from gpu_provider.links.gpu_job import CONSOLE_URL_XCOM_KEY, LOGS_URL_XCOM_KEY, GpuJobConsoleLink, GpuJobLogsLink
from gpu_provider.names import DEFER_TIMEOUT_SLACK_S, MAX_POLL_INTERVAL_S
from gpu_provider.operators._fields import (
    any_templated,
    check_fixed_options,
    check_rendered_fixed_options,
    configured_poll_interval,
    positive_seconds,
)
from gpu_provider.templates import WithTemplateFilters

if TYPE_CHECKING:
    from airflow.sdk import Context

#: how long a GPU job sensor waits by default: as long as GPU jobs run (training takes days)
DEFAULT_TIMEOUT = timedelta(days=7)
#: how long an interrupted job's next attempt may take to appear (the operator's backoff is at most 5 minutes)
DEFAULT_RESUBMIT_TIMEOUT = timedelta(minutes=15)


@dataclass
class _Follow:
    """What a wait knows besides the job it watches now: the task instance (read while the service knew
    the job), the attempts followed so far, and when it first saw the current attempt ended (for a job
    that gives no end time). A runner that does not hand ``defer`` kwargs back (``dag.test()``) loses
    it; then it is read again from the backend."""

    task: TaskKey | None = None
    followed: list[str] = field(default_factory=list)
    ended_seen_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": None if self.task is None else asdict(self.task),
            "followed": list(self.followed),
            "ended_seen_at": self.ended_seen_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> _Follow:
        data = data or {}
        task = data.get("task")
        return cls(
            task=TaskKey(**task) if isinstance(task, Mapping) else None,
            followed=[str(j) for j in data.get("followed") or []],
            ended_seen_at=data.get("ended_seen_at"),
        )


class GpuJobSensor(WithTemplateFilters, BaseSensorOperator):
    """Wait until a GPU job ends; succeed when it succeeds.

    :param job_id: the job's id in its backend (templated). Exactly one of ``job_id`` and ``job_name``.
    :param job_name: the job's name (templated), e.g. an attempt name ``gp-<dag>-<task>-<runhash>-t1-a1``.
        Where a service allows one name for several jobs (Batch), the newest active job of that name is taken.
    :param backend: a backend object, a registered name, or a mapping ``{"name": "batch", **options}``
        (templated), as for ``GpuJobOperator``; default ``[gpu_provider] default_backend``.
    :param deferrable: wait in the triggerer (default ``True``); ``False`` pokes from the worker in
        ``mode="poke"`` or ``mode="reschedule"``. Passing ``mode="reschedule"`` alone means ``False``.
    :param poll_interval: seconds between status checks (default ``[gpu_provider] poll_interval``, else
        the backend's own); deferred sensors of one backend share one batched status call per interval.
        Also the ``poke_interval`` unless that is given.
    :param follow_resubmits: when the job is interrupted (spot reclaim, capacity timeout, lost) and the
        ``GpuJobOperator`` that owns it submits a next attempt, wait for that attempt instead of failing.
    :param resubmit_timeout: how long to wait for that next attempt to appear (default 15 minutes);
        the sensor fails sooner when the owning task marked the attempt collected (it gave up).
    :param timeout: how long the sensor waits in all (default 7 days: as long as GPU jobs run).
    :return: (XCom) the job's final status: ``backend``, ``job_id``, ``job_name``, ``attempt``,
        ``state``, ``reason``, ``exit_code``, ``started_at``/``ended_at`` (Unix time), ``gpu_seconds``,
        ``output_uri``, ``log_url``, ``console_url``, ``capacity`` and ``followed`` (ids of the
        attempts from the named job up to this one; empty when the named job itself succeeded).
    """

    template_fields: Sequence[str] = ("backend", "job_id", "job_name")
    template_fields_renderers = {"backend": "json"}

    ui_color = "#d6e9c9"
    operator_extra_links = (GpuJobConsoleLink(), GpuJobLogsLink())

    def __init__(
        self,
        *,
        job_id: str | None = None,
        job_name: str | None = None,
        backend: Backend | str | Mapping[str, Any] | None = None,
        deferrable: bool | str | None = None,
        poll_interval: timedelta | float | None = None,
        follow_resubmits: bool | str = False,
        resubmit_timeout: timedelta | float = DEFAULT_RESUBMIT_TIMEOUT,
        timeout: timedelta | float = DEFAULT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        given = [name for name, value in (("job_id", job_id), ("job_name", job_name)) if value is not None]
        if len(given) != 1:
            raise ValueError(
                f"GpuJobSensor takes exactly one of job_id= and job_name=; got {' and '.join(given) or 'neither'}"
            )
        for name, value in (("job_id", job_id), ("job_name", job_name)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name}={value!r} must be a non-empty string (a job id or name, or a template)")
        self.poll_interval = positive_seconds("poll_interval", poll_interval, maximum=MAX_POLL_INTERVAL_S)
        if backend is None:
            from airflow.configuration import conf

            backend = conf.get("gpu_provider", "default_backend", fallback="") or None
        check_fixed_options(backend)
        known: Backend | None = None
        if not any_templated(backend):
            known = resolve_backend(backend)  # an unknown name or option fails here, with the valid ones
        elif isinstance(backend, Mapping) and not is_templated(backend.get("name")):
            check_backend_name(str(backend.get("name")))
        if "poke_interval" not in kwargs:
            default = self.poll_interval or (known.default_poll_interval if known is not None else None)
            if default is not None:
                kwargs["poke_interval"] = default
        if deferrable is None:
            deferrable = kwargs.get("mode") != "reschedule"
        deferrable = to_bool("deferrable", deferrable)
        if deferrable and kwargs.get("mode") == "reschedule":
            raise ValueError("deferrable=True with mode='reschedule': pick one (deferrable=False to reschedule)")
        super().__init__(timeout=timeout, **kwargs)
        self.job_id = job_id
        self.job_name = job_name
        self.backend = backend
        self._backend_as_written = backend  # fixed options are checked against it after rendering
        self.deferrable = deferrable
        self.follow_resubmits = to_bool("follow_resubmits", follow_resubmits)
        resubmit_s = positive_seconds("resubmit_timeout", resubmit_timeout, maximum=MAX_DURATION_S)
        self.resubmit_timeout_s = float(resubmit_s or DEFAULT_RESUBMIT_TIMEOUT.total_seconds())
        # poke mode keeps these between pokes; reschedule mode starts from the named job every time
        self._current: JobHandle | None = None
        self._follow = _Follow()
        self._seen: tuple[str, str] | None = None
        self._linked: dict[str, str] = {}

    # ------------------------------------------------------------------ finding the job
    def _rendered_backend(self) -> Backend:
        """The backend as rendered for this run, refused when a template set one of its fixed options."""
        check_rendered_fixed_options(self.backend, self._backend_as_written)
        return resolve_backend(self.backend)

    def _find(self, backend: Backend) -> JobHandle:
        """The job named by ``job_id``/``job_name`` (rendered by now)."""
        if self.job_id is not None:
            field_name, value = "job_id", str(self.job_id).strip()
            handle = backend.lookup(job_id=value)
        else:
            field_name, value = "job_name", str(self.job_name).strip()
            handle = backend.lookup(name=value)
        if handle is None:
            raise GpuJobError(
                f"{backend.service or backend.name} has no job with {field_name}={value!r} (backend {backend.name!r}); "
                "check the value and the backend's options (queues, state_dir), and that the job was submitted "
                "before this sensor ran. Airflow's retries apply."
            )
        return handle

    def _interval(self, backend: Backend) -> float:
        return self.poll_interval or configured_poll_interval(backend, MAX_POLL_INTERVAL_S)

    @staticmethod
    def _where(backend: Backend, handle: JobHandle) -> str:
        return f"{backend.name} job {handle.name} (id {handle.job_id}, attempt {handle.attempt}, {handle.capacity})"

    def _status(self, backend: Backend, handle: JobHandle) -> JobStatus | None:
        """The job's status now; ``None`` when it could not be read this time: this one job's entry was an
        error, or the service throttled the call (it answered; the wait goes on, as in the trigger)."""
        try:
            entry = backend.poll([handle]).get(handle.job_id)
        except GpuBackendThrottledError as err:
            self.log.warning("%s; still waiting for job %s.", err, handle.job_id)
            return None
        return entry if isinstance(entry, JobStatus) else None

    # ------------------------------------------------------------------ deferred (default)
    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)  # poke / reschedule: BaseSensorOperator calls poke()
        backend = self._rendered_backend()
        handle = self._find(backend)
        # read while the service surely knows the job: a job it loses later ("lost") is followed too
        follow = _Follow(task=backend.task_of(handle) if self.follow_resubmits else None)
        return self._watch(context, backend, handle, None, follow, time.time() + self.timeout)

    def execute_complete(
        self,
        context: Context,
        event: dict[str, Any],
        follow: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """The trigger fired: check the event, then act on the job's end (or wait on its next attempt)."""
        if not isinstance(event, dict) or event.get("status") not in names.EVENT_STATUSES:
            raise GpuJobPollError(f"GPU job trigger returned an unexpected event: {event!r}")
        backend = self._rendered_backend()
        handle = JobHandle.from_dict(event["handle"])
        if event["status"] == names.EVENT_POLL_ERROR:
            raise GpuJobPollError(
                f"{event.get('message') or 'could not read the job status'}; the job itself is untouched."
            )
        status = JobStatus.from_dict(event["job_status"])
        if deadline is None:  # not handed back (dag.test()): the sensor's timeout counts from the task's start
            start = getattr(context["ti"], "start_date", None)
            deadline = None if start is None else float(start.timestamp()) + self.timeout
        if event["status"] == names.EVENT_DEADLINE:
            self._time_out(backend, handle, status)
        return self._watch(context, backend, handle, status, _Follow.from_dict(follow), deadline)

    def _watch(
        self,
        context: Context,
        backend: Backend,
        handle: JobHandle,
        status: JobStatus | None,
        follow: _Follow,
        deadline: float | None,
    ) -> Any:
        """Act on the job until it succeeds (the result), fails (raise) or must be waited on (defer)."""
        while True:
            self._publish_links(context, backend, handle, status)
            if status is None:
                status = self._status(backend, handle)
            if status is None or status.state.active:
                self._defer(backend, handle, follow, deadline)
            step = self._after_end(context, backend, handle, status, follow)
            if isinstance(step, dict):
                return step
            if step is None:  # the next attempt is not there yet: look again shortly (a short gap)
                if deadline is not None and time.time() >= deadline:
                    self._time_out(backend, handle, status)
                time.sleep(self._interval(backend))
            else:
                handle = step
            status = None

    def _defer(self, backend: Backend, handle: JobHandle, follow: _Follow, deadline: float | None) -> NoReturn:
        from gpu_provider.triggers.gpu_job_watch import GpuJobWatchTrigger

        timeout = (
            None if deadline is None else timedelta(seconds=max(0.0, deadline - time.time()) + DEFER_TIMEOUT_SLACK_S)
        )
        self.defer(
            trigger=GpuJobWatchTrigger(
                backend=backend.spec(),
                handle=handle.to_dict(),
                poll_interval=self._interval(backend),
                deadline=deadline,
                stream_logs=False,  # the job's log belongs to the task that runs it; the link points at it
                task_label=f"GpuJobSensor {self.dag_id}.{self.task_id}",
            ),
            method_name="execute_complete",
            kwargs={"follow": follow.to_dict(), "deadline": deadline},
            timeout=timeout,
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def _time_out(self, backend: Backend, handle: JobHandle, status: JobStatus | None) -> NoReturn:
        from airflow.sdk.exceptions import AirflowSensorTimeout

        state = status.state.value if status is not None else "unknown"
        raise AirflowSensorTimeout(
            f"GpuJobSensor timed out after {self.timeout:.0f}s (timeout=) waiting for {self._where(backend, handle)}, "
            f"still {state}; the job itself was left alone."
        )

    # ------------------------------------------------------------------ poke / reschedule
    def poke(self, context: Context) -> bool | PokeReturnValue:
        """One look at the job (and, when following, at the attempts after it). In ``reschedule`` mode
        every poke starts again from the named job: nothing is kept between pokes but the job itself."""
        backend = self._rendered_backend()
        try:
            return self._poke(context, backend)
        except GpuBackendThrottledError as err:  # the service answered, only asked us to slow down: not yet
            self.log.warning("%s; looking again at the next poke.", err)
            return False

    def _poke(self, context: Context, backend: Backend) -> bool | PokeReturnValue:
        handle = self._current or self._find(backend)
        follow = self._follow
        if self.follow_resubmits and follow.task is None:
            follow.task = backend.task_of(handle)
        while True:
            self._current = handle
            status = self._status(backend, handle)
            self._publish_links(context, backend, handle, status)
            seen = (handle.job_id, status.state.value if status is not None else "unreadable")
            if seen != self._seen:  # once per state, not once per poke
                self._seen = seen
                self.log.info("%s is %s; poking every %gs.", self._where(backend, handle), seen[1], self.poke_interval)
            if status is None or status.state.active:
                return False
            step = self._after_end(context, backend, handle, status, follow)
            if isinstance(step, dict):
                return PokeReturnValue(is_done=True, xcom_value=step)
            if step is None:
                return False
            handle = step

    # ------------------------------------------------------------------ the job's end
    def _after_end(
        self, context: Context, backend: Backend, handle: JobHandle, status: JobStatus, follow: _Follow
    ) -> dict[str, Any] | JobHandle | None:
        """The result of a succeeded job, the next attempt to follow, ``None`` to look for it again, or raise."""
        where = self._where(backend, handle)
        if status.state is JobState.SUCCEEDED:
            return self._result(backend, handle, status, follow)
        reason = status.reason or "no reason given"
        if status.interruption not in names.INTERRUPTION_KINDS:
            if status.state is JobState.CANCELLED:
                raise GpuJobCancelledError(
                    f"{where} was CANCELLED: {reason}. It was stopped on purpose, so Airflow does not retry this "
                    "sensor; clear it to wait again."
                )
            code = f" (exit code {status.exit_code})" if status.exit_code is not None else ""
            raise GpuJobFailedError(f"{where} ended {status.state.value}: {reason}{code}.")
        what = f"{where} ended {status.state.value}: {reason} (an interruption: {status.interruption})"
        if not self.follow_resubmits:
            raise GpuJobFailedError(
                f"{what}. The GpuJobOperator that runs it may resubmit it as a new attempt; set "
                "follow_resubmits=True to wait for that attempt."
            )
        if follow.task is None:
            follow.task = backend.task_of(handle)
        if follow.task is None:
            raise GpuJobFailedError(
                f"{what}. It carries no task identity (not submitted by GpuJobOperator, or the service no longer "
                "knows it), so there is no next attempt to follow."
            )
        later = [h for h in backend.find_existing(follow.task) if h.attempt > handle.attempt]
        if later:
            following = max(later, key=lambda h: (h.attempt, h.submitted_at))
            self.log.info("%s; following the next attempt: %s.", what, self._where(backend, following))
            follow.followed.append(handle.job_id)
            follow.ended_seen_at = None
            return following
        if status.collected:
            raise GpuJobFailedError(
                f"{what}. The task that runs it gave up on it (its interruption budget is spent, or it failed); no "
                "next attempt will come."
            )
        follow.ended_seen_at = follow.ended_seen_at or time.time()
        waited = time.time() - (status.ended_at or follow.ended_seen_at)
        if waited > self.resubmit_timeout_s:
            raise GpuJobFailedError(
                f"{what}. No next attempt of task {follow.task.dag_id}.{follow.task.task_id} (run "
                f"{follow.task.run_id}) appeared within resubmit_timeout={self.resubmit_timeout_s:.0f}s."
            )
        self.log.info("%s; waiting for the next attempt (%.0fs so far).", what, waited)
        return None

    def _result(self, backend: Backend, handle: JobHandle, status: JobStatus, follow: _Follow) -> dict[str, Any]:
        output_uri = status.output_uri
        if not output_uri:  # a backend whose jobs declare their output in their log (Batch)
            from gpu_provider.engine.logs import LogForwarder

            try:
                reader = LogForwarder(backend, handle, self.log, copy=False)
                reader.pump(drain=True)
                output_uri = reader.output_uri
            except (GpuJobError, OSError) as err:  # the status is the result; the output is a bonus
                self.log.warning("Could not read the log of %s for its output: %s", handle.job_id, err)
        console = backend.console_url(handle)
        self.log.info("%s SUCCEEDED.", self._where(backend, handle))
        return {
            **status.to_dict(),
            "backend": backend.name,
            "job_id": handle.job_id,
            "job_name": handle.name,
            "attempt": handle.attempt,
            "capacity": status.capacity or handle.capacity,
            "output_uri": output_uri,
            "log_url": status.log_url or backend.logs_url(handle) or console,
            "console_url": console,
            "followed": self._followed(backend, handle, follow),
        }

    def _followed(self, backend: Backend, handle: JobHandle, follow: _Follow) -> list[str]:
        """Ids of the attempts from the named job up to ``handle`` (empty when ``handle`` is the named job):
        as carried along, else (the kwargs were not handed back) as the backend lists them now."""
        if handle.job_id == self.job_id or handle.name == self.job_name or follow.followed:
            return list(follow.followed)
        named = backend.lookup(job_id=self.job_id) if self.job_id is not None else backend.lookup(name=self.job_name)
        task = follow.task or backend.task_of(handle)
        first = named.attempt if named is not None else 0
        return [h.job_id for h in (backend.find_existing(task) if task else []) if first <= h.attempt < handle.attempt]

    def _publish_links(self, context: Context, backend: Backend, handle: JobHandle, status: JobStatus | None) -> None:
        """Point the "GPU job" and "GPU job logs" buttons at the job watched now (once per change)."""
        urls = {
            CONSOLE_URL_XCOM_KEY: backend.console_url(handle),
            LOGS_URL_XCOM_KEY: (status.log_url if status is not None else None) or backend.logs_url(handle),
        }
        for key, url in urls.items():
            if url and self._linked.get(key) != url:
                context["ti"].xcom_push(key=key, value=url)
                self._linked[key] = url


__all__ = ["DEFAULT_RESUBMIT_TIMEOUT", "DEFAULT_TIMEOUT", "GpuJobSensor"]
