"""``GpuJobOperator``: one GPU job (preprocessing, training, inference) on any backend.

The operator is a thin Airflow adapter: it renders and validates its fields, reads and saves the
attempt records (task state store), defers, and returns the result to XCom. What happens next
after each attempt is decided by :class:`~gpu_provider.engine.attempts.AttemptEngine`; every
service call lives in a backend.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseOperator

from gpu_provider import names
from gpu_provider.backends.base import (
    Backend,
    JobHandle,
    JobStatus,
    check_backend_name,
    resolve_backend,
)
from gpu_provider.capacity import CapacityPolicy, Ladder, resolve_capacity, validate_instance_fallback
from gpu_provider.engine.attempts import AttemptEngine, Fail, Step, Submit, Succeed, Wait, reattached
from gpu_provider.engine.planned_stops import resume_stop
from gpu_provider.engine.runner import AttemptRunner, read_owner, recover
from gpu_provider.engine.watch import ENDED
from gpu_provider.exceptions import GpuJobCancelledError, GpuJobPollError, GpuJobStoppedError
from gpu_provider.job import is_templated, to_bool, validate_checkpoint_uri
from gpu_provider.links.gpu_job import GpuJobConsoleLink, GpuJobLogsLink
from gpu_provider.names import DEFER_TIMEOUT_SLACK_S, MAX_POLL_INTERVAL_S, STATE_KEY
from gpu_provider.operators._deferral import backoff_trigger, check_event, job_trigger, outcome_of
from gpu_provider.operators._fields import (
    any_templated,
    check_fixed_options,
    check_rendered_fixed_options,
    check_secrets_in_env,
    check_spot_return_checkpoint,
    check_team_quota,
    configured_max_attempt_records,
    configured_poll_interval,
    positive_seconds,
    priority_weight,
    team_pool,
    to_checkpoint,
    to_resources,
    validate_command,
    validate_env,
    warn_spot_without_checkpoint,
)
from gpu_provider.operators._ladder import ladder_backend, rung_place, rung_places, validate_rungs
from gpu_provider.operators._plan import Plan, attempt_request
from gpu_provider.operators._state import (
    attempts_at_start,
    describe_outlets,
    found_line,
    latest_checkpoint,
    persist_records,
    publish_links,
    publish_log_link,
    stored_records,
    task_key,
)
from gpu_provider.records import AttemptRecord, AttemptSummary, dump_records, load_records, load_summary
from gpu_provider.spend.budget import SpendControl, check_max_cost
from gpu_provider.spend.ended import record_end
from gpu_provider.templates import WithTemplateFilters

if TYPE_CHECKING:
    from airflow.sdk import Context

#: how long ``on_kill`` reads the job's owner before it cancels anyway (seconds)
ON_KILL_OWNER_READ_S = 1.5

# MAX_POLL_INTERVAL_S, STATE_KEY and DEFER_TIMEOUT_SLACK_S are defined once in gpu_provider.names and
# stay importable from here
__all__ = ["DEFER_TIMEOUT_SLACK_S", "MAX_POLL_INTERVAL_S", "ON_KILL_OWNER_READ_S", "STATE_KEY", "GpuJobOperator"]


class GpuJobOperator(WithTemplateFilters, BaseOperator):
    """Run one GPU job on a backend, with spot fallback, checkpoint-resume and reattach.

    :param command: the job's command as a list of arguments (templated).
    :param backend: a backend object, a registered name (``"local"``, the default), or a mapping
        ``{"name": "local", "simulate_preemptions": "[8]"}`` whose other keys are the backend's
        options (templated).
    :param image: container image the job runs in, for container backends (templated).
    :param env: extra environment variables for the job (templated). The job does not inherit the
        worker's environment; it gets a minimal base (PATH, HOME, locale), this, and the contract.
    :param resources: :class:`~gpu_provider.GpuResources` or a dict of its fields (default 1 GPU, 1 node).
    :param gpu_resources: the same as ``resources``; the name ``partial()`` stores it under for a mapped task
        (Airflow's own ``resources`` field is for CPU and RAM)
    :param capacity: :class:`~gpu_provider.OnDemand` (default), :class:`~gpu_provider.Spot`,
        :class:`~gpu_provider.SpotFallback`, or ``"on_demand"`` | ``"spot"`` | ``"spot_fallback"``.
    :param checkpoint: :class:`~gpu_provider.Checkpoint` or a URI string (its URI is templated);
        every attempt resumes from the newest complete checkpoint found there.
    :param team: the team that owns the job: sets ``pool="gpu_<team>"`` and ``pool_slots`` to the
        job's total GPUs rounded up; also tagged on the job for cost attribution.
    :param priority: sets ``priority_weight`` with the ``absolute`` weight rule, lowered by
        ``[gpu_provider] backfill_priority_penalty`` in backfill runs (the ``gpu_provider_priority``
        plugin's ``GpuAbsolutePriority``; without ``priority=``, ``GpuDownstreamPriority``); backends with
        service-side priorities also pass it on (Batch: ``schedulingPriorityOverride`` on fair-share
        queues, 0-9999).
    :param max_runtime: longest one attempt may run (timedelta or seconds), enforced by the backend
        on the job itself; ``execution_timeout``, if shorter, is enforced the same way. A deferred
        task also honours ``execution_timeout``: when it passes, the job is cancelled and the try fails.
    :param queue_timeout: longest an attempt not covered by the policy's ``spot_wait_timeout`` (an
        on-demand attempt, or a spot one under a policy that waits forever) may stay queued; then it
        is cancelled and the try fails (Airflow's retries apply). Default: wait forever.
    :param deferrable: wait in the triggerer instead of a worker slot (default:
        ``[operators] default_deferrable``).
    :param poll_interval: seconds between status checks (default: ``[gpu_provider] poll_interval``,
        else the backend's own default).
    :param max_cost_usd: the most this task's job may cost, in US dollars, over all its attempts. With
        ``max_runtime`` (or ``execution_timeout``), before each submit the worst case (price per GPU-hour
        x GPUs x max runtime x the attempts the policy and retries allow, plus what earlier attempts
        cost) is compared with it, and the task fails with the arithmetic instead of submitting; while
        an attempt runs, it is stopped once its cost crosses what is left. Neither is retried by Airflow.
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
        resources: Any = None,
        capacity: CapacityPolicy | str | None = None,
        checkpoint: Any = None,
        team: str | None = None,
        priority: int | None = None,
        max_runtime: timedelta | float | None = None,
        queue_timeout: timedelta | float | None = None,
        deferrable: bool | str | None = None,
        poll_interval: float | None = None,
        max_cost_usd: float | None = None,
        gpu_resources: Any = None,
        **kwargs: Any,
    ) -> None:
        if resources is not None and gpu_resources is not None:
            raise ValueError("give resources= (or gpu_resources=, its name in a mapped task's partial), not both")
        self.gpu_resources = to_resources(resources if resources is not None else gpu_resources)
        kwargs.update(team_pool(team, kwargs.get("pool"), self.gpu_resources))
        kwargs.update(priority_weight(priority, kwargs.get("weight_rule")))
        super().__init__(**kwargs)

        self.command = command if is_templated(command) else validate_command(command)
        self.env = env if env is None or any_templated(env) else validate_env(env)
        self.image = image
        backend = ladder_backend(capacity, backend)  # a capacity ladder: its first rung's
        if backend is None:
            from airflow.configuration import conf

            backend = conf.get("gpu_provider", "default_backend", fallback="") or None
        self.backend = backend
        self._backend_as_written = backend  # fixed options are checked against it after rendering
        self.capacity = resolve_capacity(capacity)
        ckpt = to_checkpoint(checkpoint)
        self.checkpoint_uri = ckpt.uri if ckpt else None
        self.checkpoint_keep = ckpt.keep if ckpt else None
        self.team = team
        self.job_priority = priority
        self.max_runtime_s = positive_seconds("max_runtime", max_runtime)
        self.queue_timeout_s = positive_seconds("queue_timeout", queue_timeout)
        self.poll_interval = positive_seconds("poll_interval", poll_interval, maximum=MAX_POLL_INTERVAL_S)
        if deferrable is None:
            from airflow.configuration import conf

            deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)
        self.deferrable = to_bool("deferrable", deferrable)
        self.max_cost_usd = check_max_cost(max_cost_usd)

        # parse-time checks of what is already known
        check_fixed_options(backend)
        if isinstance(self.capacity, Ladder):  # every rung with its own backend's checks; one checkpoint for all
            uri = None if is_templated(self.checkpoint_uri) else self.checkpoint_uri
            validate_rungs(self, image or None, uri, image_known=not is_templated(image), parse=True)
        elif not any_templated(backend):
            known = resolve_backend(backend)
            self._validate_for(known, self._runtime_limit(self.max_runtime_s))
            if not is_templated(image):
                known.validate_image(image or None)
        elif isinstance(backend, Mapping) and not is_templated(backend.get("name")):
            check_backend_name(str(backend.get("name")))
        if not is_templated(self.checkpoint_uri):  # a templated one is checked once rendered (_plan)
            check_spot_return_checkpoint(self.capacity, self.checkpoint_uri, rendered=False)
        warn_spot_without_checkpoint(self.task_id, self.capacity, self.checkpoint_uri, self.max_runtime_s)
        check_secrets_in_env(self.task_id, env, backend)
        check_team_quota(team, priority)
        self._handle: JobHandle | None = None
        self._backend: Backend | None = None
        self._run_id: str | None = None
        self._try_number: int | None = None
        self._log_link: str | None = None
        self._stop = threading.Event()
        self._attempts: AttemptRunner | None = None  # this try's runner: on_kill writes the end of its attempt
        self._spend: SpendControl | None = None  # this try's spend control: a deferred kill reports with its price

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:  # type: ignore[override]
        """``GpuJobOperator.partial(...).expand(...)``: a mapped task, each map index its own job.

        Airflow's scheduler reads a mapped task's ``pool``, ``pool_slots`` and ``priority_weight`` from
        ``partial()``, before any ``__init__`` runs: ``team=``, ``resources=`` and ``priority=`` set them
        here as ``__init__`` does for an unmapped task, so each map index holds its own GPUs of the team's
        pool. Give ``team``, ``resources`` and ``priority`` to ``partial()``: expanded, they do not change
        the pool slots the scheduler reserves.
        """
        # Airflow's serialisation reads a partial's `resources` as BaseOperator's own (CPU/RAM Resources):
        # ours travel as gpu_resources
        if "resources" in kwargs:
            kwargs["gpu_resources"] = to_resources(kwargs.pop("resources"))
        if kwargs.get("team") is not None:
            resources = to_resources(kwargs.get("gpu_resources"))
            kwargs.update(team_pool(kwargs["team"], kwargs.get("pool"), resources))
        kwargs.update(priority_weight(kwargs.get("priority"), kwargs.get("weight_rule")))
        return super().partial(**kwargs)

    # ------------------------------------------------------------------ parse & render checks
    def _plan(self, context: Context) -> Plan:
        """Validate the rendered fields (templates are resolved by now) and fix the job for this try."""
        check_rendered_fixed_options(self.backend, self._backend_as_written)
        backend = resolve_backend(self.backend)
        self._backend = backend
        ti = context["ti"]
        self._run_id = str(ti.run_id)
        self._try_number = int(ti.try_number)
        max_runtime_s = self._runtime_limit(self.max_runtime_s)
        image = self.image or None
        rungs: tuple[Backend, ...] = ()
        checkpoint_uri = validate_checkpoint_uri(self.checkpoint_uri) if self.checkpoint_uri else None
        check_spot_return_checkpoint(self.capacity, checkpoint_uri, rendered=True)
        if isinstance(self.capacity, Ladder):  # rung 0 is the task's backend: one object
            rungs = (backend, *validate_rungs(self, image, checkpoint_uri)[1:])
        else:
            self._validate_for(backend, max_runtime_s)
            backend.validate_image(image)
        return Plan(
            rungs=rungs,
            backend=backend,
            command=validate_command(self.command),
            env=validate_env(self.env),
            image=image,
            checkpoint_uri=checkpoint_uri,
            max_runtime_s=max_runtime_s,
            poll_interval=self.poll_interval or configured_poll_interval(backend, MAX_POLL_INTERVAL_S),
            try_number=int(ti.try_number),
            retry=self._next_retry(ti),
        )

    def _next_retry(self, ti: Any) -> str | None:
        """The retry Airflow runs if this try fails, read from the task instance (``max_tries`` grows when
        a task is cleared), else from ``retries``; ``None`` when this is the last try."""
        try_number = int(ti.try_number)
        max_tries = getattr(ti, "max_tries", None)
        last = int(max_tries) if isinstance(max_tries, int) and max_tries > 0 else int(self.retries or 0)
        if not self.retries or try_number > last:
            return None
        return f"try {try_number + 1} of {last + 1}"

    def _validate_for(self, backend: Backend, max_runtime_s: float | None) -> None:
        resources = self.gpu_resources
        if self.capacity.spot_return is not None:  # back to spot: some EC2 instance type to read spot capacity of
            self.capacity.spot_return.validate(resources.instance_types)
        if self.capacity.instances is not None:
            # an ordered preference, one type per attempt: checked type by type (price table, backend)
            validate_instance_fallback(resources.instance_types, backend=backend)
            resources = dataclasses.replace(resources, instance_types=())
        backend.validate(
            resources,
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

    def _deadline(self, context: Context) -> float | None:
        """When this try's ``execution_timeout`` ends (Unix time); Airflow does not apply it while deferred."""
        start = getattr(context["ti"], "start_date", None)
        if not isinstance(self.execution_timeout, timedelta) or start is None:
            return None
        return float(start.timestamp()) + self.execution_timeout.total_seconds()

    # ------------------------------------------------------------------ execution
    def execute(self, context: Context) -> Any:
        plan = self._plan(context)
        found, stored, summary = attempts_at_start(context, plan.backend, task_key(context), plan.rungs, self.log)
        runner = self._runner(context, plan, found, summary)
        runner.cancel_duplicates({r.job_id for r in stored})
        step = runner.engine.resume()
        self._adopt(context, plan, runner, step, {r.job_id for r in stored})
        return self._run(context, plan, runner, step, self._deadline(context))

    def _adopt(self, context: Context, plan: Plan, runner: AttemptRunner, step: Step, stored: set[str]) -> None:
        """Say that the try's first step found an attempt live or succeeded (``stored``: the job ids the task
        state store held), and take a live one over."""
        if isinstance(step, (Wait, Succeed)):
            self.log.info("%s.", found_line(plan.backend.name, step.record, step.record.job_id in stored))
        if isinstance(step, Wait):
            self._handle, self._backend = step.record.handle, runner.backend_for(step.record)
            runner.take_over(step.record)
            self._log_link = publish_links(context, self._backend, step.record.handle, self._log_link)

    def execute_complete(
        self,
        context: Context,
        event: dict[str, Any],
        records: list[dict[str, Any]] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Resume after the trigger fired: check the event, then let the engine decide.

        ``records`` (the attempts so far) come back from ``defer(kwargs=...)``; where a runner does
        not hand them back (``dag.test()`` replaces them with the event), they are read again from
        the task state store, else from the backend.
        """
        check_event(event)
        plan = self._plan(context)
        gave_up = event["status"] == names.EVENT_POLL_ERROR  # the service cannot be read: the store's records only
        runner = self._resumed_runner(context, plan, records, refresh=not gave_up)
        handle = self._handle = JobHandle.from_dict(event["handle"])
        record = runner.engine.record_for(handle.job_id)
        if record is None:  # the store lost it: the event's handle is the truth
            record = AttemptRecord.new(handle, try_number=plan.try_number)
            runner.engine.records.append(record)
        backend = self._backend = runner.backend_for(record)  # the attempt's own (a ladder's rung), else the task's
        if gave_up:  # the worker's give-up, the same code: bounded owner read, then a bounded stop
            why = str(event.get("message") or "could not read the job status")
            return self._run(context, plan, runner, runner.gave_up_reading(record, why, retry=plan.retry), deadline)
        status = JobStatus.from_dict(event["job_status"])
        self._publish_log_link(context, status.log_url)
        outcome = outcome_of(event)
        runner.spot_decision = event.get("spot_return")  # spot_returned: the trigger's reading
        if outcome == ENDED and not backend.stream_logs_when_deferred:
            runner.copy_ended_log(handle, status, backend)
        return self._run(context, plan, runner, runner.after_wait(record, status, outcome), deadline)

    def _resumed_runner(
        self, context: Context, plan: Plan, records: list[dict[str, Any]] | None, *, refresh: bool = True
    ) -> AttemptRunner:
        """The runner of a task resuming from a deferral: the records it handed ``defer``, or, where a runner
        does not hand them back (``dag.test()``), those in the task state store, refreshed by the backend
        unless ``refresh`` is false (the trigger gave up reading the service: the store's records as they are)."""
        loaded, summary = load_records(records), load_summary(records)
        if not loaded:
            stored, summary = stored_records(context, self.log)
            loaded = (
                recover(plan.backend, task_key(context), stored, self.log, summary, others=plan.rungs)
                if refresh
                else stored
            )
        return self._runner(context, plan, loaded, summary)

    def _runner(
        self, context: Context, plan: Plan, records: list[AttemptRecord], summary: AttemptSummary | None = None
    ) -> AttemptRunner:
        spend = self._spend = SpendControl.from_config(
            plan.backend,
            self.gpu_resources,
            self.capacity,
            log=self.log,
            team=self.team,
            max_cost_usd=self.max_cost_usd,
            max_runtime_s=plan.max_runtime_s,
            retries=int(self.retries or 0),
        )
        engine = AttemptEngine(
            self.capacity,
            records,
            try_number=plan.try_number,
            backend_name=plan.backend.name,
            retries=int(self.retries or 0),
            resumes=bool(plan.checkpoint_uri),
            before_submit=[spend.before_submit],
            on_status=[spend.on_status],
            summary=summary,
            instance_types=self.gpu_resources.instance_types if self.capacity.instances is not None else (),
        )
        runner = self._attempts = AttemptRunner(
            plan.backend,
            engine,
            log=self.log,
            label=self._task_label(),
            stop=self._stop,
            persist=lambda records: persist_records(context, records, engine.summary, self.log),
            on_status=lambda status: self._publish_log_link(context, status.log_url),
            capacity_wait=self.capacity.spot_wait_timeout_s,
            queue_timeout=self.queue_timeout_s,
            execution_timeout=self.execution_timeout,
            cost_limit=lambda record: spend.cost_limit(record, engine.records),
            max_records=configured_max_attempt_records(),
            rungs=plan.rungs,
        )
        runner.spot_types = tuple(self.gpu_resources.instance_types)  # what a SpotReturn reads spot capacity for
        if plan.rungs:  # a capacity ladder: each attempt priced on its own rung's service and region
            spend.rung_of = lambda record: rung_place(self, runner, record)
            spend.rung_places = rung_places(self, plan.rungs)
        return runner

    def _run(self, context: Context, plan: Plan, runner: AttemptRunner, step: Step, deadline: float | None) -> Any:
        """Carry the engine's steps out until the job succeeds, the try fails, or the task defers."""
        try:
            return self._run_steps(context, plan, runner, step, deadline)
        finally:
            runner.close()  # an interrupted attempt's late log lines; the backend's events no longer listened to

    def _run_steps(
        self, context: Context, plan: Plan, runner: AttemptRunner, step: Step, deadline: float | None
    ) -> Any:
        engine = runner.engine
        while True:
            if isinstance(step, Fail):
                # the run of the job ends here unless an Airflow retry continues it (same budget, same history)
                retried = not isinstance(step.error, GpuJobStoppedError) and plan.try_number <= int(self.retries or 0)
                runner.collect(None if retried else step.record)
                raise runner.explain(step)
            if isinstance(step, Succeed):
                result = runner.succeed(step.record, plan.checkpoint_uri)
                describe_outlets(self.outlets, context, result)
                return result
            if isinstance(step, Submit):
                if engine.note:
                    self.log.warning("%s", engine.note)
                if step.delay and self.deferrable:
                    self._defer_backoff(runner, step, deadline)
                if step.delay:
                    self._stop.wait(step.delay)
                if self._stop.is_set():
                    raise GpuJobCancelledError("this task was killed before it could submit its next attempt.")
                runner.check_submit(step)  # the attempt it follows is still this try's, read now
                engine.before_submit(step)
                step = Wait(self._submit(context, plan, runner, step))
                continue
            self._handle, self._backend = step.record.handle, runner.backend_for(step.record)  # on_kill stops this one
            if (ended := resume_stop(runner, step.record)) is not None:  # a planned stop never seen taken: sent again
                step = ended
                continue
            if self.deferrable:
                self._defer(plan, runner, step.record, deadline)
            try:
                status, outcome = runner.wait(step.record, plan.poll_interval)
            except GpuJobPollError as err:
                step = runner.gave_up_reading(step.record, str(err), retry=plan.retry)
                continue
            step = runner.after_wait(step.record, status, outcome)

    def _defer_backoff(self, runner: AttemptRunner, step: Submit, deadline: float | None) -> NoReturn:
        """Wait out the backoff before ``step`` in the triggerer, not on a worker; ``resubmit`` carries on."""
        trigger, timeout = backoff_trigger(step, task_label=self._task_label())
        self.log.info(
            "Waiting %.1fs before attempt %d in the triggerer (GpuBackoffTrigger): no worker slot is held meanwhile.",
            step.delay,
            step.attempt,
        )
        self.defer(
            trigger=trigger,
            method_name="resubmit",
            kwargs={
                "records": dump_records(runner.engine.records, runner.engine.summary),
                "deadline": deadline,
                "attempt": step.attempt,
                "capacity": step.capacity,
            },
            timeout=timeout,
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def resubmit(
        self,
        context: Context,
        event: dict[str, Any] | None = None,
        records: list[dict[str, Any]] | None = None,
        deadline: float | None = None,
        attempt: int | None = None,
        capacity: str | None = None,
    ) -> Any:
        """Resume after the backoff before a resubmission: submit the next attempt (as decided before the
        backoff; the records say again which it is, so an attempt submitted meanwhile is not sent twice)."""
        plan = self._plan(context)
        runner = self._resumed_runner(context, plan, records)
        step: Step = runner.engine.resume()  # an attempt live or succeeded meanwhile wins over a new one
        runner.engine.note = ""  # said before the backoff
        self._adopt(context, plan, runner, step, {r.job_id for r in load_records(records)})
        if isinstance(step, Submit):
            step = runner.engine.next_submit()  # the backoff is over: no second one
        if isinstance(step, Submit) and (attempt, capacity) != (step.attempt, step.capacity):
            planned = f"attempt {attempt} on {capacity} was planned before the backoff"
            self.log.info("The records now call for attempt %d on %s (%s).", step.attempt, step.capacity, planned)
        return self._run(context, plan, runner, step, deadline)

    def _defer(self, plan: Plan, runner: AttemptRunner, record: AttemptRecord, deadline: float | None) -> NoReturn:
        spend = self._spend.kill_report(record) if self._spend is not None else None
        trigger, timeout = job_trigger(plan, runner, record, deadline, task_label=self._task_label(), spend=spend)
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            kwargs={"records": dump_records(runner.engine.records, runner.engine.summary), "deadline": deadline},
            timeout=timeout,
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def _submit(self, context: Context, plan: Plan, runner: AttemptRunner, step: Submit) -> AttemptRecord:
        backend = runner.backend_for_rung(step.rung)  # a capacity ladder's rung, else the task's backend
        resume_from = latest_checkpoint(backend, plan.checkpoint_uri)
        request = attempt_request(self, task_key(context), plan, runner, step, resume_from)
        handle, adopted = backend.submit(request).take_adopted()
        self._handle, self._backend = handle, backend
        record = runner.engine.record_for(handle.job_id)  # an adopted job (create-or-adopt) keeps its record
        if adopted:  # the submit found this attempt created by another execution of the task (create-or-adopt)
            self.log.info(
                "%s; watching it, not submitting a second one.",
                reattached(backend.name, record or AttemptRecord.new(handle), "by its name when submitting"),
            )
        else:
            self.log.info(
                "Submitted %s job %s (attempt %d, %s capacity, %s GPU(s) x %d node(s)), %s; env keys: %s",
                backend.name if step.rung is None else f"{backend.name} (ladder rung {step.rung})",
                handle.job_id,
                step.attempt,
                f"{step.capacity}, {step.instance_type}" if step.instance_type else step.capacity,
                self.gpu_resources.gpus,
                self.gpu_resources.nodes,
                f"resuming from {resume_from}" if resume_from else "starting fresh (no checkpoint yet)",
                ", ".join(sorted(request.env)) or "-",
            )
        if record is None:
            record = AttemptRecord.new(handle, resume_from=resume_from, try_number=plan.try_number)
            record.instance_choice = record.instance_type = step.instance_type
            if step.rung is not None:  # where the attempt runs, so that every later step reads and stops it there
                record.rung, record.backend_spec, record.service = step.rung, backend.spec(), backend.service or None
            runner.engine.records.append(record)
        runner.persist()
        self._log_link = publish_links(context, backend, handle, self._log_link)
        return record

    def _publish_log_link(self, context: Context, url: str | None) -> None:
        self._log_link = publish_log_link(context, url, self._log_link)

    def _task_label(self) -> str:
        run = f" of run {self._run_id}" if self._run_id else ""
        return f"Airflow task {self.dag_id}.{self.task_id}{run}"

    # ------------------------------------------------------------------ kill
    def on_kill(self) -> None:
        """Cancel the running attempt: a killed task must leave no GPU job behind.

        Runs in the SIGTERM handler on the task's main thread, so it waits on nothing the interrupted
        code may hold: the owner is read in a separate thread for at most ``ON_KILL_OWNER_READ_S``
        (Airflow sends SIGKILL a few seconds after SIGTERM), and backends cancel the same way. It
        leaves the job alone only when the job says a later try owns it (Airflow replaced this try
        and the new one reattached), read from the service at that moment (:meth:`Backend.read_owner`,
        never a poll's cache); when that cannot be read in time, it cancels: a job nobody watches
        must not keep billing.
        """
        self._stop.set()
        handle = self._handle
        if handle is None:
            return
        try:
            backend = self._backend or resolve_backend(self.backend)
            # read from the service now, never from a poll's cache: the successor may have marked it a moment ago
            owner = read_owner(backend, handle, timeout=ON_KILL_OWNER_READ_S)
            mine = self._try_number
            if owner is not None and owner.later_than(mine):
                self.log.info(
                    "Not cancelling %s job %s on kill: Airflow try %s owns it now (this is try %s).",
                    backend.name,
                    handle.job_id,
                    owner.owner_try,
                    mine,
                )
                return
            backend.cancel(handle, f"{self._task_label()} was killed")
            self.log.info("Cancelled %s job %s because the task was killed.", backend.name, handle.job_id)
            record_end(self._attempts, handle, f"{self._task_label()} was killed", timeout=ON_KILL_OWNER_READ_S)
        except Exception:
            self.log.exception("Could not cancel job %s on kill", handle.job_id)
