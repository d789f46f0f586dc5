"""The AWS Batch backend: GPU jobs on a spot and an on-demand job queue.

Each attempt is one Batch job. The job definition (image, command, GPU/VCPU/MEMORY, roles,
secrets) is registered once per distinct content and reused: its name ends in a hash of its
body, so an unchanged task reuses revision 1 and a changed one gets a new definition. What changes
per attempt (the ``GPU_PROVIDER_*`` contract, the job's ``env=``) travels as submit-time overrides.

Capacity is chosen by queue: spot attempts go to ``spot_queue``, on-demand attempts to
``on_demand_queue``. Batch cannot run multi-node parallel jobs on spot compute environments, so a
multi-node job that may run on spot is refused when the DAG is parsed.

:class:`BatchBackend` orchestrates; each concern is a module of :mod:`gpu_provider.backends.batch` (the
request, the calls, the status, ownership, lookups, logs), and what Batch's answers mean is in
:mod:`gpu_provider.backends.batch.mapping`. Status reads are
batched: :meth:`BatchBackend.poll` asks DescribeJobs for up to 100 jobs per call. Throttling
(``TooManyRequestsException``) is retried with full-jitter backoff and, if it persists, reported as
:class:`~gpu_provider.exceptions.GpuBackendThrottledError`, which a waiting task never counts as a
failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.aws.calls import Clients, refused
from gpu_provider.backends.aws.status import VISIBILITY_GRACE_S
from gpu_provider.backends.base import (
    LOG_READ_BYTES,
    Backend,
    Capabilities,
    EventSource,
    JobHandle,
    JobIdentity,
    JobRequest,
    JobStatus,
    LogChunk,
    OwnedJob,
    OwnerRead,
    PollResult,
    TaskKey,
    lookup_key,
)
from gpu_provider.backends.batch import known, logs, lookups, options, ownership, requests, status
from gpu_provider.backends.batch.logs import TAIL_STREAMS
from gpu_provider.backends.batch.lookups import ACTIVE_BATCH_STATES
from gpu_provider.backends.batch.mapping import console_log_url
from gpu_provider.backends.batch.requests import (
    DEFAULT_LOG_GROUP,
    DEFAULT_MEMORY_MIB_PER_GPU,
    DEFAULT_VCPUS_PER_GPU,
    MIN_ATTEMPT_SECONDS,
    MULTI_NODE_ENTRY,
)
from gpu_provider.backends.batch.service import DESCRIBE_BATCH, BatchJobs
from gpu_provider.backends.common import (
    keep_bounded,
    port_option,
    run_bounded,
    text_option,
)
from gpu_provider.exceptions import GpuJobError, GpuJobStatusError
from gpu_provider.job import GpuResources, to_bool

__all__ = [
    "ACTIVE_BATCH_STATES",
    "DEFAULT_LOG_GROUP",
    "DEFAULT_MASTER_PORT",
    "DEFAULT_MEMORY_MIB_PER_GPU",
    "DEFAULT_VCPUS_PER_GPU",
    "DEFINITIONS_KEPT",
    "DESCRIBE_BATCH",
    "MIN_ATTEMPT_SECONDS",
    "MULTI_NODE_ENTRY",
    "PRIORITY_RANGE",
    "TAIL_STREAMS",
    "VISIBILITY_GRACE_S",
    "BatchBackend",
]

log = logging.getLogger(__name__)

#: job definitions whose ARN the process remembers per connection (newest kept; one per task and content)
DEFINITIONS_KEPT = 256
#: job queues whose policy the process remembers per connection
QUEUES_KEPT = 256
#: schedulingPriorityOverride range on fair-share queues
PRIORITY_RANGE = (0, 9999)
DEFAULT_MASTER_PORT = 29500


class BatchBackend(Backend):
    """Runs each attempt as an AWS Batch job: spot attempts on one job queue, on-demand on another.

    Every option falls back to the ``[gpu_provider]`` config key named in brackets.

    :param spot_queue: job queue backed by a spot compute environment [``batch_spot_queue``].
    :param on_demand_queue: job queue backed by an on-demand compute environment
        [``batch_on_demand_queue``]. Both queues may be the same queue if you want no capacity split.
    :param aws_conn_id: Airflow AWS connection (credentials, region, endpoint) [``batch_aws_conn_id``,
        default ``aws_default``].
    :param region_name: AWS region; default: the connection's [``batch_region``].
    :param job_role_arn: IAM role the job's container assumes, e.g. to read and write checkpoints
        on S3 [``batch_job_role_arn``].
    :param execution_role_arn: IAM role ECS uses to pull the image and read ``secrets``
        [``batch_execution_role_arn``].
    :param secrets: environment variables filled by Batch from Secrets Manager or SSM Parameter
        Store, as ``{"NAME": "arn:aws:secretsmanager:..."}``: the value never passes through Airflow.
    :param log_group: CloudWatch log group of the jobs [``batch_log_group``, default ``/aws/batch/job``].
    :param share_identifier: fair-share identifier for jobs of tasks without ``team=`` on a queue
        with a scheduling policy [``batch_share_identifier``, default ``default``].
    :param share_identifiers: the fair-share identifier of each team, ``{"team-a": "teamA"}`` (or that
        mapping as JSON text) [``batch_share_identifiers``, JSON]; a team not in it uses its name
        with ``-`` written as ``_``.
    :param queues_by_instance_type: the job queue of each instance type an ordered instance preference
        (``capacity=SpotFallback(instances=InstanceFallback())``) may name: ``{"p5.48xlarge": {"spot":
        "p5-spot", "on-demand": "p5-od"}, "g6e.48xlarge": "g6e"}`` (one queue for both capacities), or that
        as JSON [``batch_queues_by_instance_type``]. Each queue's compute environment runs that type only.
    :param master_port: ``MASTER_PORT`` of multi-node jobs (default 29500).
    :param multi_node_entry: wrap multi-node commands in a ``/bin/sh`` entry that sets ``NODE_RANK``
        and ``MASTER_ADDR`` from Batch's variables (default true). Turn off if the image has no
        ``/bin/sh`` and the job normalises them itself (``gpu_provider.runtime.launch``).
    """

    name: ClassVar[str] = "batch"
    #: who the job runs as, where its secrets come from, which account and endpoint: from the
    #: [gpu_provider] config or literal DAG code, never a template (trigger-form params are untrusted)
    fixed_options: ClassVar[frozenset[str]] = frozenset(
        {"aws_conn_id", "region_name", "job_role_arn", "execution_role_arn", "secrets"}
    )
    service: ClassVar[str] = "AWS Batch"
    capabilities: ClassVar[Capabilities] = Capabilities(
        multi_node_spot=False,  # Batch runs multi-node parallel jobs on EC2 (on-demand) compute environments only
        fractional_gpus=False,
        instance_types=False,  # the compute environment behind the queue decides
        image_required=True,
        unique_names=False,  # Batch accepts two jobs with one name: submit() looks the name up first
        priority_range=PRIORITY_RANGE,  # schedulingPriorityOverride on fair-share queues
        min_runtime_s=MIN_ATTEMPT_SECONDS,  # timeout.attemptDurationSeconds
    )
    default_poll_interval: ClassVar[float] = 30.0
    #: many deferred tasks share one triggerer: reading every job's CloudWatch stream every tick
    #: would cost one call per job per tick, so the worker copies an attempt's log when it ends
    stream_logs_when_deferred: ClassVar[bool] = False
    #: the awslogs driver ships a container's last lines a few seconds after the job has ended
    log_settle_s: ClassVar[float] = 6.0

    def __init__(
        self,
        *,
        spot_queue: str | None = None,
        on_demand_queue: str | None = None,
        aws_conn_id: str | None = None,
        region_name: str | None = None,
        job_role_arn: str | None = None,
        execution_role_arn: str | None = None,
        secrets: Mapping[str, str] | None = None,
        log_group: str | None = None,
        share_identifier: str | None = None,
        share_identifiers: Mapping[str, str] | str | None = None,
        master_port: int | str = DEFAULT_MASTER_PORT,
        multi_node_entry: bool | str = True,
        queues_by_instance_type: Mapping[str, Any] | str | None = None,
    ) -> None:
        self.spot_queue = text_option("spot_queue", spot_queue, config_key="batch_spot_queue")
        self.on_demand_queue = text_option("on_demand_queue", on_demand_queue, config_key="batch_on_demand_queue")
        self.aws_conn_id = text_option(
            "aws_conn_id", aws_conn_id, config_key="batch_aws_conn_id", default="aws_default"
        )
        self.region_name = text_option("region_name", region_name, config_key="batch_region")
        self.job_role_arn = text_option("job_role_arn", job_role_arn, config_key="batch_job_role_arn")
        self.execution_role_arn = text_option(
            "execution_role_arn", execution_role_arn, config_key="batch_execution_role_arn"
        )
        self.secrets = options.secrets(secrets)
        self.log_group: str = text_option("log_group", log_group, config_key="batch_log_group") or DEFAULT_LOG_GROUP
        self.share_identifier = options.share_identifier(share_identifier)
        self.share_identifiers = options.share_identifiers(share_identifiers)
        self.master_port = port_option("master_port", master_port)
        self.multi_node_entry = to_bool("multi_node_entry", multi_node_entry)
        self.queues_by_instance_type = options.queues_by_instance_type(queues_by_instance_type)

        self._clients = Clients(self.aws_conn_id or "aws_default", self.region_name)
        self._jobs = BatchJobs(self._clients)
        # job definitions and queue policies are remembered for the process, not this object (known.py)

    # --- configuration -------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        return {
            "spot_queue": self.spot_queue,
            "on_demand_queue": self.on_demand_queue,
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.region_name,
            "job_role_arn": self.job_role_arn,
            "execution_role_arn": self.execution_role_arn,
            "secrets": dict(self.secrets),
            "log_group": self.log_group,
            "share_identifier": self.share_identifier,
            "share_identifiers": dict(self.share_identifiers),
            "master_port": self.master_port,
            "multi_node_entry": self.multi_node_entry,
            "queues_by_instance_type": {t: dict(q) for t, q in self.queues_by_instance_type.items()},
        }

    def validate_job(self, resources: GpuResources, capacity: str, multi: bool, runtime_s: float | None) -> None:
        other = names.ON_DEMAND if capacity == names.SPOT else names.SPOT
        for needed in sorted({capacity, other} if multi else {capacity}):
            option = "spot_queue" if needed == names.SPOT else "on_demand_queue"
            if not getattr(self, option):
                raise ValueError(
                    f"the batch backend has no {option} but capacity may use {needed}: set "
                    f"[gpu_provider] batch_{option} or pass backend={{'name': 'batch', '{option}': '<job queue>'}}"
                )

    # --- clients ----------------------------------------------------------------------------

    @property
    def region(self) -> str:
        """The region the clients talk to (the option, else the connection's)."""
        return self._clients.region

    def price_region(self) -> str | None:
        return self.region

    # --- queues and job definitions -----------------------------------------------------------

    def validate_instance_fallback(self, instance_types: Sequence[str]) -> None:
        """Each type of an ordered preference needs its job queues (``queues_by_instance_type``)."""
        options.check_instance_queues(instance_types, self.queues_by_instance_type)

    def _queues(self) -> list[str]:
        """Every job queue this backend submits to: the capacity queues and the instance types' queues."""
        every = [self.spot_queue, self.on_demand_queue]
        every += [q for per in self.queues_by_instance_type.values() for q in per.values()]
        return list(dict.fromkeys(q for q in every if q))

    def _queue(self, capacity: str, instance_type: str | None = None) -> str:
        if instance_type:
            queue = self.queues_by_instance_type.get(instance_type, {}).get(capacity)
            if not queue:
                raise ValueError(
                    f"the batch backend has no {capacity} job queue for instance type {instance_type!r}: set it in "
                    "[gpu_provider] batch_queues_by_instance_type"
                )
            return queue
        queue = self.spot_queue if capacity == names.SPOT else self.on_demand_queue
        if not queue:
            option = "spot_queue" if capacity == names.SPOT else "on_demand_queue"
            raise ValueError(f"the batch backend has no {option}; set [gpu_provider] batch_{option}")
        return queue

    def _is_fair_share(self, queue: str) -> bool:
        """Whether the queue has a scheduling policy (then Batch requires shareIdentifier, else rejects it)."""
        remembered = self._known_queues().get(queue)
        if remembered is not None:
            return remembered
        info = self._jobs.describe_queue(queue)
        if info is None:
            raise GpuJobError(
                f"AWS Batch job queue {queue!r} does not exist in {self.region} (check the batch backend's "
                "spot_queue/on_demand_queue and the connection's region)"
            )
        if info.get("state") == "DISABLED":
            raise GpuJobError(f"AWS Batch job queue {queue!r} is DISABLED; enable it or use another queue")
        fair = bool(info.get("schedulingPolicyArn"))
        keep_bounded(self._known_queues(), queue, fair, limit=QUEUES_KEPT)
        return fair

    def _known_queues(self) -> dict[str, bool]:
        """Whether each job queue is fair-share, as this process learned it (:mod:`.batch.known`)."""
        return known.fair_share(self._clients.scope())

    def _known_definitions(self) -> dict[str, str]:
        """The ARN of each job definition, as this process learned it (:mod:`.batch.known`)."""
        return known.definitions(self._clients.scope())

    def job_definition(self, request: JobRequest) -> dict[str, Any]:
        """The RegisterJobDefinition body of a request (:func:`~.batch.requests.job_definition`)."""
        return requests.job_definition(self, request)

    def _definition_arn(self, body: dict[str, Any]) -> str:
        """The ARN of the job definition ``body``: its newest ACTIVE revision, else registered now."""
        name = str(body["jobDefinitionName"])
        arn = self._known_definitions().get(name)
        if arn:
            return arn
        revisions = self._jobs.active_definitions(name)
        if revisions:
            arn = str(revisions[-1]["jobDefinitionArn"])
            log.info("Reusing Batch job definition %s (content unchanged).", arn)
        else:
            arn = self._jobs.register_definition(body)
            log.info("Registered Batch job definition %s.", arn)
        keep_bounded(self._known_definitions(), name, arn, limit=DEFINITIONS_KEPT)
        return arn

    # --- the contract --------------------------------------------------------------------------

    def submit_body(self, request: JobRequest, definition_arn: str, *, priority: int | None = None) -> dict[str, Any]:
        """The SubmitJob body of a request (without looking anything up but the queue's policy)."""
        queue = self._queue(request.capacity, request.instance_type)
        team = request.identity.team
        return requests.submit_body(
            request,
            queue=queue,
            definition_arn=definition_arn,
            master_port=self.master_port,
            share_identifier=(
                requests.share_for(team, default=self.share_identifier, by_team=self.share_identifiers)
                if self._is_fair_share(queue)
                else None
            ),
            priority=priority,
        )

    def submit(self, request: JobRequest) -> JobHandle:
        """Create the attempt's job, or adopt the job of that name if it exists already.

        Batch accepts two jobs with one name and SubmitJob has no client token, so the name is looked
        up first (ListJobs ``JOB_NAME`` on the attempt's queue, tags checked), and again before a
        SubmitJob whose answer was lost is sent a second time.
        """
        self.validate_image(request.image)
        identity = request.identity
        queue = self._queue(request.capacity, request.instance_type)
        queue_known = queue in self._known_queues()
        self._is_fair_share(queue)  # a queue that does not exist or is disabled: a clear error first
        definition = self.job_definition(request)
        name = str(definition["jobDefinitionName"])
        remembered = queue_known or name in self._known_definitions()
        # the job definition is looked up (and registered when no revision exists) while the create-or-adopt
        # lookup runs: neither changes a job, and SubmitJob is sent only after the lookup found none
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-batch-definition") as pool:
            arn = pool.submit(self._definition_arn, definition)
            existing = self._find_attempt(identity, queue)
            if existing is not None:
                log.info(
                    "AWS Batch job %s (id %s) exists already for this attempt: adopting it instead of submitting "
                    "again.",
                    existing.name,
                    existing.job_id,
                )
                return existing.as_adopted()
            body = self.submit_body(request, arn.result(), priority=request.priority)
        try:
            job_id, job_arn = self._send_submit(identity, body)
        except Exception as err:
            if not (remembered and refused(err)):
                raise
            # nothing was created; what the body was built from may be stale (a definition deregistered
            # behind our back, a queue changed): forget it, look it up again and send once more
            log.info(
                "AWS Batch refused SubmitJob for %s (%s); looking its job definition and queue up again and "
                "sending it once more.",
                identity.name,
                err,
            )
            self._known_definitions().pop(name, None)
            self._known_queues().pop(queue, None)
            self._is_fair_share(queue)
            job_id, job_arn = self._send_submit(identity, self._body(request, definition))
        return JobHandle(
            backend=self.name,
            job_id=job_id,
            name=identity.name,
            attempt=identity.attempt,
            capacity=request.capacity,
            submitted_at=time.time(),
            extra={
                "queue": queue,
                "region": self.region,
                "job_definition": definition["jobDefinitionName"],
                "job_arn": job_arn,
                "gpus": request.resources.total_gpus,
                "nodes": request.resources.nodes,
            },
        )

    def _body(self, request: JobRequest, definition: dict[str, Any]) -> dict[str, Any]:
        return self.submit_body(request, self._definition_arn(definition), priority=request.priority)

    def _send_submit(self, identity: JobIdentity, body: dict[str, Any]) -> tuple[str, str]:
        """SubmitJob once per try (no automatic retries); after an error that may have created the job,
        back off and look the name up before sending it again. Returns the job's id and ARN."""
        queue = str(body["jobQueue"])

        def look_again(err: BaseException) -> tuple[str, str] | None:
            found = self._find_attempt(identity, queue)
            if found is None:
                log.info(
                    "SubmitJob for %s failed (%s: %s) and created no job; sending it again.",
                    identity.name,
                    type(err).__name__,
                    err,
                )
                return None
            log.warning(
                "SubmitJob for %s failed (%s: %s) but the job was created (id %s): adopting it instead of "
                "submitting it again.",
                identity.name,
                type(err).__name__,
                err,
                found.job_id,
            )
            return found.job_id, str(found.extra.get("job_arn") or "")

        return self._jobs.submit(identity.name, body, look_again=look_again)

    def _find_attempt(self, identity: JobIdentity, queue: str) -> JobHandle | None:
        """The job of this attempt on ``queue``, if one exists: the newest active one, else the newest."""
        return lookups.find_attempt(self._jobs, identity, queue, self._handle_of)

    def _handle_of(self, job: Mapping[str, Any], queue: str, summary: Mapping[str, Any]) -> JobHandle:
        """The handle of a job found by name (its attempt number is in the name)."""
        return status.handle_of(job, queue, summary, backend=self.name, spot_queue=self.spot_queue, region=self.region)

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        by_id = {h.job_id: h for h in handles}
        found = {str(job.get("jobId")): job for job in self._jobs.describe(list(by_id))}
        now = time.time()
        result: PollResult = {}
        for job_id, handle in by_id.items():
            job = found.get(job_id)
            if job is None:
                result[job_id] = status.missing(handle, now)
                continue
            try:
                result[job_id] = self.status_of(job, handle)
            except ValueError as err:  # e.g. a state this version does not know: this job alone
                result[job_id] = GpuJobStatusError(f"AWS Batch job {handle.name} (id {job_id}): {err}")
        # a read never changes anything: a job that can never start is reported (never_starts), and only
        # the task that owns it terminates it
        return result

    def status_of(self, job: Mapping[str, Any], handle: JobHandle) -> JobStatus:
        """Map one DescribeJobs entry onto a :class:`JobStatus` (:func:`~.batch.status.status_of`)."""
        return status.status_of(job, handle, backend=self.name, region=self.region, log_group=self.log_group)

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """DescribeJobs of this one job now: its owner-try tag (Batch returns a job's tags with it)."""
        return ownership.read_owner(self._jobs, handle)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """TerminateJob with ``reason``; from a SIGTERM handler too (see :func:`~.common.run_bounded`)."""
        run_bounded(f"TerminateJob {handle.job_id}", lambda: self._jobs.terminate(handle.job_id, reason))

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Tag the job (TagResource on its ARN): the try that owns it, or that its outcome was collected."""
        ownership.mark(self._jobs, handle, owner=owner_try, collected=collected)

    # --- lookups (reads only: :mod:`~gpu_provider.backends.batch.lookups`) ---------------------------

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance in either queue, found by job name (ListJobs JOB_NAME filter)."""
        return lookups.find_existing(self._jobs, task, self._queues(), self._handle_of)

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A job by id (DescribeJobs) or by name (ListJobs ``JOB_NAME`` on the configured queues; of
        several jobs with that name, the newest active one, else the newest), else ``None``."""
        field_name, value = lookup_key(job_id, name)
        if field_name == "job_id":
            return lookups.by_id(self._jobs, value, self._queues(), self._handle_of)
        return lookups.by_name(self._jobs, value, self._queues(), self._handle_of)

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        """The task instance in the job's tags (one DescribeJobs); ``None`` for a job without them or one gone."""
        return lookups.task_of(self._jobs, handle)

    def list_owned(self) -> list[OwnedJob]:
        """Every active job in the configured queues that carries this provider's task tags (ListJobs per
        queue and active state, then DescribeJobs for the tags); jobs submitted by something else are not listed."""
        return lookups.list_owned(self._jobs, self._queues(), self._handle_of, self.status_of, region=self.region)

    # --- logs and links --------------------------------------------------------------------------

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Lines of the attempt's CloudWatch stream(s) after ``cursor`` (see :mod:`~gpu_provider.backends.aws.logs`)."""
        return logs.read(self._jobs, self._clients, handle, cursor, group=self.log_group, max_bytes=max_bytes)

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` log lines of the attempt: one GetLogEvents from the end of each node's
        stream (at most :data:`TAIL_STREAMS` nodes), merged by time."""
        return logs.output_tail(self._jobs, self._clients, handle, lines, group=self.log_group)

    def event_source(self) -> EventSource | None:
        """EventBridge state-change events from the SQS queue of ``[gpu_provider] batch_events_queue_url``, if set
        (:mod:`gpu_provider.backends.aws.events`)."""
        from gpu_provider.backends.aws.events import queue_events

        return queue_events("batch_events_queue_url", self._clients)

    def console_url(self, handle: JobHandle) -> str | None:
        region = str(handle.extra.get("region") or self.region)
        return f"https://{region}.console.aws.amazon.com/batch/home?region={region}#jobs/detail/{handle.job_id}"

    def logs_url(self, handle: JobHandle) -> str | None:
        """Before the stream is known: the log group, filtered to this job definition's streams."""
        region = str(handle.extra.get("region") or self.region)
        definition = handle.extra.get("job_definition")
        return console_log_url(region, self.log_group, stream_prefix=f"{definition}/" if definition else None)
