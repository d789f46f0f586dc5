"""The AWS Batch backend: GPU jobs on a spot and an on-demand job queue.

Each attempt is one Batch job. The job definition (image, command, GPU/VCPU/MEMORY, roles,
secrets) is registered once per distinct content and reused: its name ends in a hash of its
body, so an unchanged task reuses revision 1 and a changed one gets a new definition. What changes
per attempt (the ``GPU_PROVIDER_*`` contract, the job's ``env=``) travels as submit-time overrides.

Capacity is chosen by queue: spot attempts go to ``spot_queue``, on-demand attempts to
``on_demand_queue``. Batch cannot run multi-node parallel jobs on spot compute environments, so a
multi-node job that may run on spot is refused when the DAG is parsed.

What Batch's answers mean is in :mod:`gpu_provider.backends.batch.mapping`. Status reads are
batched: :meth:`BatchBackend.poll` asks DescribeJobs for up to 100 jobs per call. Throttling
(``TooManyRequestsException``) is retried with full-jitter backoff and, if it persists, reported as
:class:`~gpu_provider.exceptions.GpuBackendThrottledError`, which a waiting task never counts as a
failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.aws.calls import (
    PATIENT_ATTEMPTS,
    POLL_ATTEMPTS,
    Clients,
    backoff,
    call,
    error_code,
    is_throttling,
    may_have_happened,
)
from gpu_provider.backends.aws.logs import LogCursor, StreamNotFoundError, log_chunk, read_streams
from gpu_provider.backends.base import (
    LOG_READ_BYTES,
    Backend,
    Capabilities,
    EventSource,
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
    _slug,
    clip_line,
    lookup_key,
    map_state,
    task_from_tags,
)
from gpu_provider.backends.batch import options
from gpu_provider.backends.batch.mapping import (
    CANCEL_PREFIX,
    STATE_TABLE,
    console_log_url,
    definition_name,
    exit_code,
    job_gpus,
    job_nodes,
    node_fault,
    refine_failure,
    seconds_from_ms,
    tag_number,
    unrunnable,
)
from gpu_provider.backends.common import END_OF_LOG_COMMAND, keep_bounded, run_bounded, text_option
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobError, GpuJobStatusError
from gpu_provider.job import GpuResources, to_bool

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

#: most job ids per DescribeJobs call (a Batch limit)
DESCRIBE_BATCH = 100
#: job definitions whose ARN a backend object remembers (newest kept; one per task and content)
DEFINITIONS_KEPT = 256
#: Batch states of jobs that have not ended (what :meth:`BatchBackend.list_owned` lists)
ACTIVE_BATCH_STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
#: a job DescribeJobs does not return this long after its submission is lost (before: not visible yet)
VISIBILITY_GRACE_S = 60.0
#: Batch's smallest attempt timeout
MIN_ATTEMPT_SECONDS = 60
#: schedulingPriorityOverride range on fair-share queues
PRIORITY_RANGE = (0, 9999)
#: defaults when a job does not say: vCPUs and MiB of memory per GPU (fit a g4dn/g5/g6 .xlarge)
DEFAULT_VCPUS_PER_GPU = 3
DEFAULT_MEMORY_MIB_PER_GPU = 12 * 1024
DEFAULT_LOG_GROUP = "/aws/batch/job"
DEFAULT_MASTER_PORT = 29500
#: node streams :meth:`BatchBackend.output_tail` reads from the end (one GetLogEvents each)
TAIL_STREAMS = 8

#: the multi-node entry wrapper: POSIX sh only, so it works in any image with /bin/sh. It derives
#: NODE_RANK and MASTER_ADDR from Batch's variables (the main node, which Batch does not tell its
#: own address, uses loopback: its rendezvous store listens on every interface), then execs the command
#: through the end-of-log entry (``END_OF_LOG_COMMAND``), which marks where each node's log ends.
MULTI_NODE_ENTRY = (
    'export NODE_RANK="${AWS_BATCH_JOB_NODE_INDEX:-0}"; '
    'export MASTER_ADDR="${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-127.0.0.1}"; '
    'exec "$@"'
)

_JOB_NAME = re.compile(r"-t(\d+)-a(\d+)$")
_SHARE_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _owned_by(job: Mapping[str, Any], task: TaskKey) -> bool:
    """Whether a job found by name belongs to the task (names shorten the ids; the tags hold them whole)."""
    tags = job.get("tags") or {}
    return bool(
        tags.get(names.TAG_DAG_ID, task.dag_id[:256]) == task.dag_id[:256]
        and tags.get(names.TAG_TASK_ID, task.task_id[:256]) == task.task_id[:256]
    )


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
        share = text_option(
            "share_identifier", share_identifier, config_key="batch_share_identifier", default="default"
        )
        assert share is not None
        if not options.SHARE_IDENTIFIER.fullmatch(share):
            raise ValueError(
                f"share_identifier={share!r} must be 1-255 letters, digits or underscores "
                "(a Batch fair-share identifier)"
            )
        self.share_identifier = share
        self.share_identifiers = options.share_identifiers(share_identifiers)
        try:
            port = int(str(master_port).strip())
        except ValueError:
            port = -1
        if not 1 <= port <= 65535:
            raise ValueError(f"master_port={master_port!r} must be a TCP port number (1-65535)")
        self.master_port = port
        self.multi_node_entry = to_bool("multi_node_entry", multi_node_entry)
        self.queues_by_instance_type = options.queues_by_instance_type(queues_by_instance_type)

        self._clients = Clients(self.aws_conn_id or "aws_default", self.region_name)
        # caches of facts that never change; plain dict reads and writes (atomic), no lock: cancel()
        # runs in a signal handler and must never wait for one
        self._fair_share: dict[str, bool] = {}
        self._definitions: dict[str, str] = {}

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

    def validate(
        self,
        resources: GpuResources,
        capacity: str,
        *,
        multi_capacity: bool,
        priority: int | None = None,
        max_runtime_s: float | None = None,
    ) -> None:
        super().validate(
            resources, capacity, multi_capacity=multi_capacity, priority=priority, max_runtime_s=max_runtime_s
        )
        other = names.ON_DEMAND if capacity == names.SPOT else names.SPOT
        for needed in sorted({capacity, other} if multi_capacity else {capacity}):
            option = "spot_queue" if needed == names.SPOT else "on_demand_queue"
            if not getattr(self, option):
                raise ValueError(
                    f"the batch backend has no {option} but capacity may use {needed}: set "
                    f"[gpu_provider] batch_{option} or pass backend={{'name': 'batch', '{option}': '<job queue>'}}"
                )

    # --- clients ----------------------------------------------------------------------------

    def _client(self, service: str) -> BaseClient:
        return self._clients.get(service)

    @property
    def region(self) -> str:
        """The region the clients talk to (the option, else the connection's)."""
        return self._clients.region

    # --- queues and job definitions -----------------------------------------------------------

    def validate_instance_fallback(self, instance_types: Sequence[str]) -> None:
        """Each type of an ordered preference needs its job queues (``queues_by_instance_type``)."""
        for instance_type in instance_types:
            if instance_type not in self.queues_by_instance_type:
                known = ", ".join(sorted(self.queues_by_instance_type)) or "none configured"
                raise ValueError(
                    f"resources.instance_types: {instance_type!r} has no Batch job queue; set "
                    f"[gpu_provider] batch_queues_by_instance_type (or the backend's queues_by_instance_type) to "
                    f'name its queue, e.g. {{"{instance_type}": {{"spot": "<queue>", "on-demand": "<queue>"}}}}; '
                    f"allowed now: {known}"
                )

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
        known = self._fair_share.get(queue)
        if known is not None:
            return known
        client = self._client("batch")
        found = call("DescribeJobQueues", lambda: client.describe_job_queues(jobQueues=[queue]))
        queues = found.get("jobQueues") or []
        if not queues:
            raise GpuJobError(
                f"AWS Batch job queue {queue!r} does not exist in {self.region} (check the batch backend's "
                "spot_queue/on_demand_queue and the connection's region)"
            )
        info = queues[0]
        if info.get("state") == "DISABLED":
            raise GpuJobError(f"AWS Batch job queue {queue!r} is DISABLED; enable it or use another queue")
        fair = bool(info.get("schedulingPolicyArn"))
        self._fair_share[queue] = fair
        return fair

    def job_definition(self, request: JobRequest) -> dict[str, Any]:
        """The RegisterJobDefinition body of a request (named by a hash of its content)."""
        res = request.resources
        gpus = math.ceil(res.gpus)
        vcpus = res.cpu if res.cpu is not None else DEFAULT_VCPUS_PER_GPU * gpus
        memory = res.memory_mib if res.memory_mib is not None else DEFAULT_MEMORY_MIB_PER_GPU * gpus
        command = list(request.command)
        if res.nodes > 1 and self.multi_node_entry:
            command = ["/bin/sh", "-c", MULTI_NODE_ENTRY, "gpu-provider-entry", *END_OF_LOG_COMMAND, *command]
        container: dict[str, Any] = {
            "image": request.image,
            "command": command,
            "resourceRequirements": [
                {"type": "GPU", "value": str(gpus)},
                {"type": "VCPU", "value": f"{vcpus:g}"},
                {"type": "MEMORY", "value": str(memory)},
            ],
        }
        if self.job_role_arn:
            container["jobRoleArn"] = self.job_role_arn
        if self.execution_role_arn:
            container["executionRoleArn"] = self.execution_role_arn
        if self.secrets:
            container["secrets"] = [{"name": k, "valueFrom": v} for k, v in sorted(self.secrets.items())]
        if self.log_group != DEFAULT_LOG_GROUP:
            container["logConfiguration"] = {"logDriver": "awslogs", "options": {"awslogs-group": self.log_group}}
        body: dict[str, Any] = {"platformCapabilities": ["EC2"], "propagateTags": True}
        if res.nodes > 1:
            body["type"] = "multinode"
            body["nodeProperties"] = {
                "numNodes": res.nodes,
                "mainNode": 0,
                "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
            }
        else:
            body["type"] = "container"
            body["containerProperties"] = container
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
        task = request.identity.task
        body["jobDefinitionName"] = f"gp-{_slug(task.dag_id, 40)}-{_slug(task.task_id, 40)}-{digest}"
        body["tags"] = {
            names.TAG_DAG_ID: task.dag_id[:256],
            names.TAG_TASK_ID: task.task_id[:256],
            "gpu-provider/spec-hash": digest,
        }
        return body

    def _definition_arn(self, body: dict[str, Any]) -> str:
        name = str(body["jobDefinitionName"])
        arn = self._definitions.get(name)
        if arn:
            return arn
        client = self._client("batch")
        found = call(
            "DescribeJobDefinitions",
            lambda: client.describe_job_definitions(jobDefinitionName=name, status="ACTIVE"),
        )
        revisions = sorted(found.get("jobDefinitions") or [], key=lambda d: int(d.get("revision", 0)))
        if revisions:
            arn = str(revisions[-1]["jobDefinitionArn"])
            log.info("Reusing Batch job definition %s (content unchanged).", arn)
        else:
            registered = call("RegisterJobDefinition", lambda: client.register_job_definition(**body))
            arn = str(registered["jobDefinitionArn"])
            log.info("Registered Batch job definition %s.", arn)
        keep_bounded(self._definitions, name, arn, limit=DEFINITIONS_KEPT)
        return arn

    # --- the contract --------------------------------------------------------------------------

    def submit_body(self, request: JobRequest, definition_arn: str, *, priority: int | None = None) -> dict[str, Any]:
        """The SubmitJob body of a request (without looking anything up but the queue's policy)."""
        identity = request.identity
        queue = self._queue(request.capacity, request.instance_type)
        env = dict(request.env)
        env["NNODES"] = str(request.resources.nodes)
        env["MASTER_PORT"] = str(self.master_port)
        if request.resources.nodes == 1:
            env.update({"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
        environment = [{"name": k, "value": v} for k, v in sorted(env.items())]
        tags = {k: v[:256] for k, v in identity.tags().items()}
        tags[names.TAG_GPUS] = f"{request.resources.total_gpus:g}"  # all nodes: for GPU-hours and cost
        if request.resources.gpu_type:
            tags["gpu-provider/gpu-type"] = request.resources.gpu_type
        body: dict[str, Any] = {
            "jobName": identity.name,
            "jobQueue": queue,
            "jobDefinition": definition_arn,
            "tags": tags,
            "propagateTags": True,
        }
        if request.resources.nodes > 1:
            body["nodeOverrides"] = {
                "nodePropertyOverrides": [{"targetNodes": "0:", "containerOverrides": {"environment": environment}}]
            }
        else:
            body["containerOverrides"] = {"environment": environment}
        if request.max_runtime_s:
            body["timeout"] = {"attemptDurationSeconds": max(MIN_ATTEMPT_SECONDS, math.ceil(request.max_runtime_s))}
        if self._is_fair_share(queue):
            # a fair-share queue needs a scheduling priority on every job: the task's, else the lowest
            body["shareIdentifier"] = self._share(identity.team)
            body["schedulingPriorityOverride"] = priority if priority is not None else 0
        return body

    def _share(self, team: str | None) -> str:
        if not team:
            return self.share_identifier
        # Batch share identifiers allow letters, digits and underscores: team "ml-infra" -> "ml_infra"
        return self.share_identifiers.get(team) or _SHARE_UNSAFE.sub("_", team)

    def submit(self, request: JobRequest) -> JobHandle:
        """Create the attempt's job, or adopt the job of that name if it exists already.

        Batch accepts two jobs with one name and SubmitJob has no client token, so the name is looked
        up first (ListJobs ``JOB_NAME`` on the attempt's queue, tags checked), and again before a
        SubmitJob whose answer was lost is sent a second time.
        """
        self.validate_image(request.image)
        identity = request.identity
        queue = self._queue(request.capacity, request.instance_type)
        self._is_fair_share(queue)  # a queue that does not exist or is disabled: a clear error first
        existing = self._find_attempt(identity, queue)
        if existing is not None:
            log.info(
                "AWS Batch job %s (id %s) exists already for this attempt: adopting it instead of submitting again.",
                existing.name,
                existing.job_id,
            )
            return existing
        definition = self.job_definition(request)
        arn = self._definition_arn(definition)
        body = self.submit_body(request, arn, priority=request.priority)
        job_id, job_arn = self._send_submit(identity, body)
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

    def _send_submit(self, identity: JobIdentity, body: dict[str, Any]) -> tuple[str, str]:
        """SubmitJob once per try (no automatic retries); after an error that may have created the job,
        back off and look the name up before sending it again. Returns the job's id and ARN."""
        client = self._clients.get("batch", automatic_retries=False)
        queue = str(body["jobQueue"])
        for attempt in range(1, PATIENT_ATTEMPTS + 1):
            try:
                answer = client.submit_job(**body)
                return str(answer["jobId"]), str(answer.get("jobArn") or "")
            except Exception as err:
                if not may_have_happened(err):
                    raise  # a definite refusal (bad request, unknown queue...): no job was created
                if attempt == PATIENT_ATTEMPTS:
                    if is_throttling(err):
                        raise GpuBackendThrottledError(
                            f"AWS Batch throttled SubmitJob for {identity.name} {attempt} times in a row; "
                            "no job of that name exists (looked up after each try)"
                        ) from err
                    raise GpuJobError(
                        f"AWS Batch SubmitJob for {identity.name} on job queue {queue!r} failed {attempt} times "
                        f"({type(err).__name__}: {err}); no job of that name exists (looked up after each try)"
                    ) from err
                time.sleep(backoff(attempt))
                found = self._find_attempt(identity, queue)
                if found is not None:
                    log.warning(
                        "SubmitJob for %s failed (%s: %s) but the job was created (id %s): adopting it instead of "
                        "submitting it again.",
                        identity.name,
                        type(err).__name__,
                        err,
                        found.job_id,
                    )
                    return found.job_id, str(found.extra.get("job_arn") or "")
                log.info(
                    "SubmitJob for %s failed (%s: %s) and created no job; sending it again.",
                    identity.name,
                    type(err).__name__,
                    err,
                )
        raise AssertionError("unreachable")

    def _find_attempt(self, identity: JobIdentity, queue: str) -> JobHandle | None:
        """The job of this attempt on ``queue``, if one exists: the newest active one, else the newest."""
        task = identity.task
        summaries = {str(s["jobId"]): s for s in self._list_by_name(queue, identity.name)}
        if not summaries:
            return None
        jobs = [j for j in self._describe(list(summaries), attempts=PATIENT_ATTEMPTS) if _owned_by(j, task)]
        if not jobs:
            return None
        jobs.sort(key=lambda j: (str(j.get("status")) not in ("SUCCEEDED", "FAILED"), int(j.get("createdAt") or 0)))
        job = jobs[-1]
        return self._handle_of(job, queue, summaries[str(job["jobId"])])

    def _list_by_name(self, queue: str, pattern: str) -> list[dict[str, Any]]:
        """ListJobs on ``queue`` with a ``JOB_NAME`` filter (every state; a trailing ``*`` matches a prefix)."""
        client = self._client("batch")
        summaries: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"jobQueue": queue, "filters": [{"name": "JOB_NAME", "values": [pattern]}]}
            if token:
                kwargs["nextToken"] = token
            page = call("ListJobs", lambda kwargs=kwargs: client.list_jobs(**kwargs))  # type: ignore[misc]
            summaries.extend(page.get("jobSummaryList") or [])
            token = page.get("nextToken")
            if not token:
                return summaries

    def _handle_of(self, job: Mapping[str, Any], queue: str, summary: Mapping[str, Any]) -> JobHandle:
        """The handle of a job found by name (its attempt number is in the name)."""
        name = str(summary.get("jobName") or job.get("jobName") or "")
        match = _JOB_NAME.search(name)
        tags = job.get("tags") or {}
        capacity = tags.get(names.TAG_CAPACITY) or (names.SPOT if queue == self.spot_queue else names.ON_DEMAND)
        return JobHandle(
            backend=self.name,
            job_id=str(job["jobId"]),
            name=name,
            attempt=int(match.group(2)) if match else int(tag_number(tags, names.TAG_ATTEMPT) or 1),
            capacity=str(capacity),
            submitted_at=seconds_from_ms(summary.get("createdAt") or job.get("createdAt")) or time.time(),
            extra={
                "queue": queue,
                "region": self.region,
                "job_definition": definition_name(job),
                "job_arn": str(job.get("jobArn") or summary.get("jobArn") or ""),
                "gpus": tag_number(tags, names.TAG_GPUS) or job_gpus(job),
                "nodes": job_nodes(job),
            },
        )

    def _describe(self, job_ids: Sequence[str], *, attempts: int = POLL_ATTEMPTS) -> list[dict[str, Any]]:
        client = self._client("batch")
        jobs: list[dict[str, Any]] = []
        unique = list(dict.fromkeys(job_ids))
        for start in range(0, len(unique), DESCRIBE_BATCH):
            chunk = unique[start : start + DESCRIBE_BATCH]
            found = call(
                "DescribeJobs",
                lambda chunk=chunk: client.describe_jobs(jobs=chunk),  # type: ignore[misc]
                attempts=attempts,
            )
            jobs.extend(found.get("jobs") or [])
        return jobs

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        by_id = {h.job_id: h for h in handles}
        found = {str(job.get("jobId")): job for job in self._describe(list(by_id))}
        now = time.time()
        result: PollResult = {}
        for job_id, handle in by_id.items():
            job = found.get(job_id)
            if job is None:
                result[job_id] = self._missing(handle, now)
                continue
            try:
                result[job_id] = self.status_of(job, handle)
            except ValueError as err:  # e.g. a state this version does not know: this job alone
                result[job_id] = GpuJobStatusError(f"AWS Batch job {handle.name} (id {job_id}): {err}")
        # a read never changes anything: a job that can never start is reported (never_starts), and only
        # the task that owns it terminates it
        return result

    def _missing(self, handle: JobHandle, now: float) -> JobStatus | GpuJobStatusError:
        """What a job DescribeJobs did not return means: not visible yet, or gone for good."""
        age = now - handle.submitted_at
        if age < VISIBILITY_GRACE_S:
            return GpuJobStatusError(
                f"AWS Batch does not list job {handle.name} (id {handle.job_id}) yet, {age:.0f}s after it was "
                "submitted (its API is eventually consistent); reading it again on the next poll"
            )
        return JobStatus(
            state=JobState.FAILED,
            reason=(
                f"AWS Batch no longer knows job {handle.job_id} (expired or deleted): DescribeJobs did not return "
                f"{handle.name}, so how it ended cannot be known (Batch keeps ended jobs for a limited time). "
                "Treated as lost: the capacity policy decides whether a new attempt runs, resuming from the "
                "latest checkpoint."
            ),
            interruption=names.LOST,
            capacity=handle.capacity,
        )

    def status_of(self, job: Mapping[str, Any], handle: JobHandle) -> JobStatus:
        """Map one DescribeJobs entry onto a :class:`JobStatus`."""
        state = map_state(STATE_TABLE, str(job.get("status")), backend=self.name)
        reason = str(job.get("statusReason") or "")
        interruption = None
        if state is JobState.FAILED:
            state, reason, interruption = refine_failure(job)
        elif state is JobState.SUCCEEDED:
            reason = ""  # Batch says "Essential container in task exited" on success too: no news
        started = seconds_from_ms(job.get("startedAt"))
        ended = seconds_from_ms(job.get("stoppedAt")) if state.terminal else None
        gpus = float(handle.extra.get("gpus") or job_gpus(job))
        gpu_seconds = gpus * max(0.0, (ended or time.time()) - started) if started else 0.0
        stream = str((job.get("container") or {}).get("logStreamName") or "")
        log_url = console_log_url(self.region, self.log_group, stream) if stream else None
        tags = job.get("tags") or {}
        owner = str(tags.get(names.TAG_OWNER_TRY) or "")
        return JobStatus(
            state=state,
            reason=reason,
            exit_code=exit_code(job),
            started_at=started,
            ended_at=ended,
            gpu_seconds=gpu_seconds,
            log_url=log_url,
            interruption=interruption,
            fault=node_fault(job) if interruption == names.NODE_FAULT else None,
            capacity=handle.capacity,  # the attempt's queue decides it (Batch does not report it per job)
            owner_try=int(owner) if owner.isdigit() else None,
            collected=str(tags.get(names.TAG_COLLECTED) or "").lower() == "true",
            never_starts=unrunnable(job),
        )

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """DescribeJobs of this one job now: its owner-try tag (Batch returns a job's tags with it)."""
        for job in self._describe([handle.job_id], attempts=PATIENT_ATTEMPTS):
            if str(job.get("jobId")) == handle.job_id:
                tags = job.get("tags") or {}
                owner = str(tags.get(names.TAG_OWNER_TRY) or tags.get(names.TAG_TRY_NUMBER) or "")
                return OwnerRead(owner_try=int(owner) if owner.isdigit() else None)
        return OwnerRead(owner_try=None, exists=False)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """TerminateJob with ``reason``; from a SIGTERM handler too (see :func:`~.common.run_bounded`)."""
        run_bounded(f"TerminateJob {handle.job_id}", lambda: self._terminate(handle.job_id, reason))

    def _terminate(self, job_id: str, reason: str) -> None:
        """TerminateJob (any state; Batch ignores it for an ended job) with the reason marked as ours."""
        client = self._client("batch")
        text = (CANCEL_PREFIX + reason)[:1024]
        call("TerminateJob", lambda: client.terminate_job(jobId=job_id, reason=text))

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Tag the job (TagResource on its ARN): the try that owns it, or that its outcome was collected."""
        tags: dict[str, str] = {}
        if owner_try is not None:
            if isinstance(owner_try, bool) or not isinstance(owner_try, int) or owner_try < 1:
                raise ValueError(f"owner_try={owner_try!r} must be an Airflow try number (an integer, 1 or more)")
            tags[names.TAG_OWNER_TRY] = str(owner_try)
        if collected:
            tags[names.TAG_COLLECTED] = "true"
        if not tags:
            return
        arn = str(handle.extra.get("job_arn") or "") or self._job_arn(handle)
        client = self._client("batch")
        call("TagResource", lambda: client.tag_resource(resourceArn=arn, tags=tags))

    def _job_arn(self, handle: JobHandle) -> str:
        """The ARN of a job whose handle does not carry it (a handle from an older version)."""
        for job in self._describe([handle.job_id], attempts=PATIENT_ATTEMPTS):
            if job.get("jobArn"):
                return str(job["jobArn"])
        raise GpuJobError(
            f"AWS Batch no longer knows job {handle.job_id} ({handle.name}): it cannot be tagged (expired or deleted)"
        )

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance in either queue, found by job name (ListJobs JOB_NAME filter)."""
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        for queue in self._queues():
            for summary in self._list_by_name(queue, f"{task.prefix}-t*"):
                name = str(summary.get("jobName") or "")
                match = _JOB_NAME.search(name)
                if match and name[: match.start()] == task.prefix:  # not another map index's jobs
                    found[str(summary["jobId"])] = (queue, summary)
        if not found:
            return []
        details = {str(j["jobId"]): j for j in self._describe(list(found), attempts=PATIENT_ATTEMPTS)}
        handles = [
            self._handle_of(details[job_id], queue, summary)
            for job_id, (queue, summary) in found.items()
            if job_id in details and _owned_by(details[job_id], task)
        ]
        return sorted(handles, key=lambda h: (h.attempt, h.submitted_at))

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A job by id (DescribeJobs) or by name (ListJobs ``JOB_NAME`` on the configured queues; of
        several jobs with that name, the newest active one, else the newest), else ``None``."""
        field_name, value = lookup_key(job_id, name)
        if field_name == "job_id":
            for job in self._describe([value], attempts=PATIENT_ATTEMPTS):
                if str(job.get("jobId")) == value:
                    # DescribeJobs names the queue by its ARN; handles carry the name the queues were given as
                    ref = str(job.get("jobQueue") or "")
                    short = ref.rpartition("job-queue/")[2]
                    queue = next((q for q in self._queues() if q in (ref, short)), short)
                    return self._handle_of(job, queue, {})
            return None
        if "*" in value:
            raise ValueError(f"name={value!r}: a job name, not a pattern ('*' is not allowed)")
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        for queue in self._queues():
            for summary in self._list_by_name(queue, value):
                if str(summary.get("jobName") or "") == value:
                    found[str(summary["jobId"])] = (queue, summary)
        if not found:
            return None
        jobs = self._describe(list(found), attempts=PATIENT_ATTEMPTS)
        jobs.sort(key=lambda j: (str(j.get("status")) not in ("SUCCEEDED", "FAILED"), int(j.get("createdAt") or 0)))
        if not jobs:
            return None
        queue, summary = found[str(jobs[-1]["jobId"])]
        return self._handle_of(jobs[-1], queue, summary)

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        """The task instance in the job's tags (one DescribeJobs); ``None`` for a job without them or one gone."""
        for job in self._describe([handle.job_id], attempts=PATIENT_ATTEMPTS):
            if str(job.get("jobId")) == handle.job_id:
                return task_from_tags(job.get("tags") or {})
        return None

    def price_region(self) -> str | None:
        return self.region

    def list_owned(self) -> list[OwnedJob]:
        """Every active job in the configured queues that carries this provider's task tags.

        ListJobs per queue and active Batch state (SUBMITTED to RUNNING; a listing by state returns
        no ended jobs), then DescribeJobs 100 at a time for the tags, the timeout and the start time.
        Jobs without the task tags (submitted by something else) are not listed.
        """
        client = self._client("batch")
        found: dict[str, str] = {}
        for queue in self._queues():
            for status in ACTIVE_BATCH_STATES:
                token: str | None = None
                while True:
                    kwargs: dict[str, Any] = {"jobQueue": queue, "jobStatus": status}
                    if token:
                        kwargs["nextToken"] = token
                    page = call("ListJobs", lambda kwargs=kwargs: client.list_jobs(**kwargs))  # type: ignore[misc]
                    for summary in page.get("jobSummaryList") or []:
                        found.setdefault(str(summary["jobId"]), queue)
                    token = page.get("nextToken")
                    if not token:
                        break
        owned: list[OwnedJob] = []
        for job in self._describe(list(found), attempts=PATIENT_ATTEMPTS):
            tags = job.get("tags") or {}
            if names.TAG_DAG_ID not in tags:
                continue
            handle = self._handle_of(job, found[str(job["jobId"])], {})
            try:
                state = self.status_of(job, handle).state
            except ValueError:  # a state this version does not know: it may be running
                state = JobState.RUNNING
            if state.terminal:
                continue
            owner = tag_number(tags, names.TAG_OWNER_TRY) or tag_number(tags, names.TAG_TRY_NUMBER)
            timeout = (job.get("timeout") or {}).get("attemptDurationSeconds")
            nodes = int(handle.extra.get("nodes") or 1)
            owned.append(
                OwnedJob(
                    handle=handle,
                    task=task_from_tags(tags),
                    state=state,
                    try_number=int(owner) if owner else None,
                    team=str(tags.get(names.TAG_TEAM) or "") or None,
                    started_at=seconds_from_ms(job.get("startedAt")),
                    nodes=nodes,
                    gpus=float(handle.extra.get("gpus") or 0.0) / nodes,
                    max_runtime_s=float(timeout) if timeout else None,
                    region=self.region,
                    # Batch's timeout counts from the attempt's startedAt; a RUNNABLE job has no wait limit
                    max_wait_s=None,
                    training_seconds=None,
                )
            )
        return sorted(owned, key=lambda o: (o.handle.submitted_at, o.handle.job_id))

    # --- logs and links --------------------------------------------------------------------------

    def _streams(self, handle: JobHandle) -> tuple[list[tuple[str, str]], bool]:
        """(label, log stream) of each node of an attempt whose stream is known yet, and whether all are."""
        nodes = int(handle.extra.get("nodes") or 1)
        ids = [handle.job_id] if nodes == 1 else [f"{handle.job_id}#{i}" for i in range(nodes)]
        streams: list[tuple[str, str]] = []
        for job in sorted(self._describe(ids), key=lambda j: int(str(j.get("jobId")).partition("#")[2] or 0)):
            stream = (job.get("container") or {}).get("logStreamName")
            if stream:
                label = "" if nodes == 1 else f"node {str(job['jobId']).rpartition('#')[2]}: "
                streams.append((label, str(stream)))
        return streams, len(streams) == len(ids)

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Lines of the attempt's CloudWatch stream(s) after ``cursor`` (see :mod:`~gpu_provider.backends.aws.logs`)."""
        state = LogCursor.load(cursor)
        streams = state.streams
        if not streams:  # not all known yet: ask Batch (one DescribeJobs), and keep them once complete
            streams, complete = self._streams(handle)
            if not streams:
                return LogChunk(lines=[], cursor=cursor, more=False)  # not started: no stream yet
            if complete:
                state.streams = streams
        client = self._client("logs")

        def get_page(kwargs: dict[str, Any]) -> dict[str, Any]:
            try:
                return call("GetLogEvents", lambda: client.get_log_events(**kwargs), attempts=POLL_ATTEMPTS)
            except Exception as err:
                if error_code(err) == "ResourceNotFoundException":
                    raise StreamNotFoundError(str(kwargs["logStreamName"])) from err
                raise

        lines, more = read_streams(get_page, self.log_group, streams, state, max_bytes)
        return log_chunk(lines, state, more)

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` log lines of the attempt: one GetLogEvents from the end of each node's
        stream (at most :data:`TAIL_STREAMS` nodes), merged by time."""
        streams, _ = self._streams(handle)
        if not streams or lines <= 0:
            return []
        client = self._client("logs")
        events: list[tuple[int, str]] = []
        for label, stream in streams[:TAIL_STREAMS]:
            try:
                page = call(
                    "GetLogEvents",
                    lambda stream=stream: client.get_log_events(  # type: ignore[misc]
                        logGroupName=self.log_group, logStreamName=stream, startFromHead=False, limit=lines
                    ),
                    attempts=POLL_ATTEMPTS,
                )
            except Exception as err:
                if error_code(err) == "ResourceNotFoundException":
                    continue
                raise
            for event in page.get("events") or []:
                message = clip_line(str(event.get("message", "")).rstrip("\n"))
                events.append((int(event.get("timestamp") or 0), label + message))
        events.sort(key=lambda item: item[0])  # stable: each stream's own order is kept within a tick
        return [line for _, line in events[-lines:]]

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
