"""The AWS Batch backend: GPU jobs on a spot and an on-demand job queue.

Each attempt is one Batch job. The job definition (image, command, GPU/VCPU/MEMORY, roles,
secrets) is registered once per distinct content and reused: its name ends in a hash of its
body, so an unchanged task reuses revision 1 and a changed one gets a new definition. What changes
per attempt (the ``GPU_PROVIDER_*`` contract, the job's ``env=``) travels as submit-time overrides.

Capacity is chosen by queue: spot attempts go to ``spot_queue``, on-demand attempts to
``on_demand_queue``. Batch cannot run multi-node parallel jobs on spot compute environments, so a
multi-node job that may run on spot is refused when the DAG is parsed.

States (one table, :data:`STATE_TABLE`): SUBMITTED, PENDING and RUNNABLE are ``QUEUED``; STARTING,
RUNNING, SUCCEEDED and FAILED map to themselves. A FAILED job is read further:

* its status reason starts with :data:`CANCEL_PREFIX` (this provider terminated it): ``CANCELLED``;
* its status reason, or its last attempt's, matches :data:`PREEMPTION_PATTERNS` (the host was
  terminated or reclaimed, e.g. ``Host EC2 (instance i-0abc) terminated.``): ``PREEMPTED``;
* anything else (the container exited non-zero, the attempt timed out): ``FAILED``.

Batch has no structured "spot interruption" field; the status reason is what its own
``evaluateOnExit`` retry rules match on (``onStatusReason: "Host EC2*"``), and so do we.

Status reads are batched: :meth:`BatchBackend.poll` asks DescribeJobs for up to 100 jobs per call.
Throttling (``TooManyRequestsException``) is retried with full-jitter backoff and, if it persists,
reported as :class:`~gpu_provider.exceptions.GpuBackendThrottledError`, which a waiting task
never counts as a failure.

boto3 is imported only when a client is first needed, through the amazon provider's
``AwsBaseHook`` (credentials, region and endpoint from the Airflow connection).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import quote

from gpu_provider.backends.base import (
    Backend,
    JobHandle,
    JobRequest,
    JobState,
    JobStatus,
    TaskKey,
    _slug,
    map_state,
    provider_config,
)
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobError
from gpu_provider.job import GpuResources

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Batch job states and what they mean for the operator (FAILED is refined by :func:`refine_failure`)
STATE_TABLE: dict[str, JobState] = {
    "SUBMITTED": JobState.QUEUED,
    "PENDING": JobState.QUEUED,
    "RUNNABLE": JobState.QUEUED,
    "STARTING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
}

#: status reasons meaning the host went away under the job (spot reclaim, instance terminated):
#: the attempt is PREEMPTED and resumes from its checkpoint instead of failing the task
PREEMPTION_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^Host EC2 \(instance [^)]*\) terminated", re.IGNORECASE),
    re.compile(r"spot instance .*(interrupt|reclaim|terminat)", re.IGNORECASE),
    re.compile(r"^Task failed to start.*(instance|host).*(terminat|reclaim)", re.IGNORECASE),
)

#: prefix of the reason this provider gives TerminateJob; a job that ended with it is CANCELLED
CANCEL_PREFIX = "gpu-provider: "

#: Batch's error codes for request throttling
THROTTLING_CODES = frozenset({"TooManyRequestsException", "ThrottlingException", "Throttling"})

#: most job ids per DescribeJobs call (a Batch limit)
DESCRIBE_BATCH = 100
#: Batch's smallest attempt timeout
MIN_ATTEMPT_SECONDS = 60
#: schedulingPriorityOverride range on fair-share queues
PRIORITY_RANGE = (0, 9999)
#: defaults when a job does not say: vCPUs and MiB of memory per GPU (fit a g4dn/g5/g6 .xlarge)
DEFAULT_VCPUS_PER_GPU = 3
DEFAULT_MEMORY_MIB_PER_GPU = 12 * 1024
DEFAULT_LOG_GROUP = "/aws/batch/job"
DEFAULT_MASTER_PORT = 29500

#: the multi-node entry wrapper: POSIX sh only, so it works in any image with /bin/sh. It derives
#: NODE_RANK and MASTER_ADDR from Batch's variables (the main node, which Batch does not tell its
#: own address, uses loopback: its rendezvous store listens on every interface), then execs the command.
MULTI_NODE_ENTRY = (
    'export NODE_RANK="${AWS_BATCH_JOB_NODE_INDEX:-0}"; '
    'export MASTER_ADDR="${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-127.0.0.1}"; '
    'exec "$@"'
)

_JOB_NAME = re.compile(r"-t(\d+)-a(\d+)$")
_SHARE_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _text_option(option: str, value: Any, *, config_key: str | None = None, default: str | None = None) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{option}={value!r} ({type(value).__name__}) must be a string")
    text = (value or "").strip()
    if not text and config_key:
        text = provider_config(config_key)
    return text or default


def _bool_option(option: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise ValueError(f"{option}={value!r} must be true or false")


def is_preemption(reason: str) -> bool:
    """Whether a Batch status reason says the host was terminated or reclaimed under the job."""
    return any(p.search(reason) for p in PREEMPTION_PATTERNS)


def refine_failure(job: Mapping[str, Any]) -> tuple[JobState, str]:
    """FAILED -> CANCELLED (we terminated it), PREEMPTED (host reclaimed) or FAILED, with the reason."""
    reason = str(job.get("statusReason") or "")
    if reason.startswith(CANCEL_PREFIX):
        return JobState.CANCELLED, reason[len(CANCEL_PREFIX) :]
    attempts = job.get("attempts") or []
    last = attempts[-1] if attempts else {}
    candidates = [reason, str(last.get("statusReason") or ""), str((last.get("container") or {}).get("reason") or "")]
    for candidate in candidates:
        if candidate and is_preemption(candidate):
            return JobState.PREEMPTED, candidate
    container_reason = str((last.get("container") or job.get("container") or {}).get("reason") or "")
    details = [r for r in (reason, container_reason) if r]
    if "attempt duration exceeded timeout" in reason.lower():
        details.append("the attempt ran past max_runtime (timeout.attemptDurationSeconds)")
    # the exit code is reported separately (JobStatus.exit_code)
    return JobState.FAILED, "; ".join(dict.fromkeys(details)) or "no reason given"


def _exit_code(job: Mapping[str, Any]) -> int | None:
    attempts = job.get("attempts") or []
    for source in ((attempts[-1].get("container") if attempts else None), job.get("container")):
        if source and source.get("exitCode") is not None:
            return int(source["exitCode"])
    return None


def _seconds_from_ms(value: Any) -> float | None:
    return float(value) / 1000.0 if value else None


def console_log_url(region: str, group: str, stream: str | None = None, *, stream_prefix: str | None = None) -> str:
    """A CloudWatch console link to a log stream (or to a log group filtered by stream prefix)."""

    def enc(text: str) -> str:
        # the console's fragment encoding: URL-encode twice, then '%' -> '$'
        return quote(quote(text, safe=""), safe="").replace("%", "$")

    base = f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
    if stream:
        return f"{base}{enc(group)}/log-events/{enc(stream)}"
    suffix = "$3FlogStreamNameFilter$3D" + enc(stream_prefix) if stream_prefix else ""
    return f"{base}{enc(group)}{suffix}"


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
    :param master_port: ``MASTER_PORT`` of multi-node jobs (default 29500).
    :param multi_node_entry: wrap multi-node commands in a ``/bin/sh`` entry that sets ``NODE_RANK``
        and ``MASTER_ADDR`` from Batch's variables (default true). Turn off if the image has no
        ``/bin/sh`` and the job normalises them itself (``gpu_provider.runtime.launch``).
    """

    name: ClassVar[str] = "batch"
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
        master_port: int | str = DEFAULT_MASTER_PORT,
        multi_node_entry: bool | str = True,
    ) -> None:
        self.spot_queue = _text_option("spot_queue", spot_queue, config_key="batch_spot_queue")
        self.on_demand_queue = _text_option("on_demand_queue", on_demand_queue, config_key="batch_on_demand_queue")
        self.aws_conn_id = _text_option(
            "aws_conn_id", aws_conn_id, config_key="batch_aws_conn_id", default="aws_default"
        )
        self.region_name = _text_option("region_name", region_name, config_key="batch_region")
        self.job_role_arn = _text_option("job_role_arn", job_role_arn, config_key="batch_job_role_arn")
        self.execution_role_arn = _text_option(
            "execution_role_arn", execution_role_arn, config_key="batch_execution_role_arn"
        )
        self.secrets = self._parse_secrets(secrets)
        self.log_group: str = _text_option("log_group", log_group, config_key="batch_log_group") or DEFAULT_LOG_GROUP
        share = _text_option(
            "share_identifier", share_identifier, config_key="batch_share_identifier", default="default"
        )
        assert share is not None
        if not re.fullmatch(r"[A-Za-z0-9_]{1,255}", share):
            raise ValueError(
                f"share_identifier={share!r} must be 1-255 letters, digits or underscores "
                "(a Batch fair-share identifier)"
            )
        self.share_identifier = share
        try:
            port = int(str(master_port).strip())
        except ValueError:
            port = -1
        if not 1 <= port <= 65535:
            raise ValueError(f"master_port={master_port!r} must be a TCP port number (1-65535)")
        self.master_port = port
        self.multi_node_entry = _bool_option("multi_node_entry", multi_node_entry)

        self._lock = threading.Lock()
        self._clients: dict[str, BaseClient] = {}
        self._resolved_region: str | None = None
        self._fair_share: dict[str, bool] = {}
        self._definitions: dict[str, str] = {}
        self._log_streams: dict[str, list[tuple[str, str]]] = {}
        self._log_cursors: dict[tuple[str, int], dict[str, str | None]] = {}

    @staticmethod
    def _parse_secrets(secrets: Any) -> dict[str, str]:
        if secrets is None or secrets == "":
            return {}
        if isinstance(secrets, str):
            try:
                secrets = json.loads(secrets)
            except json.JSONDecodeError:
                raise ValueError(
                    "secrets must be a mapping of variable names to Secrets Manager or SSM ARNs "
                    '(as a dict, or JSON text like {"HF_TOKEN": "arn:aws:secretsmanager:..."})'
                ) from None
        if not isinstance(secrets, Mapping):
            raise TypeError(f"secrets ({type(secrets).__name__}) must be a mapping of variable names to ARNs")
        out = {}
        for key, value in secrets.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"secrets key {key!r} is not a valid environment variable name")
            if not isinstance(value, str) or not value.startswith("arn:"):
                # an ARN is not secret, but a value passed here by mistake might be: do not echo it
                raise ValueError(
                    f"secrets[{key!r}] must be the ARN of a Secrets Manager secret or SSM parameter "
                    "(arn:aws:...), not the secret itself"
                )
            out[key] = value
        return out

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
            "master_port": self.master_port,
            "multi_node_entry": self.multi_node_entry,
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
        capacities = {capacity, "on-demand" if capacity == "spot" else "spot"} if multi_capacity else {capacity}
        if resources.nodes > 1 and "spot" in capacities:
            raise ValueError(
                f"resources.nodes={resources.nodes} with spot capacity: AWS Batch cannot run multi-node parallel "
                "jobs on spot compute environments. Use capacity='on_demand' for this multi-node job, or "
                "resources.nodes=1 (one node with several GPUs) to run on spot."
            )
        for needed in sorted(capacities):
            option = "spot_queue" if needed == "spot" else "on_demand_queue"
            if not getattr(self, option):
                raise ValueError(
                    f"the batch backend has no {option} but capacity may use {needed}: set "
                    f"[gpu_provider] batch_{option} or pass backend={{'name': 'batch', '{option}': '<job queue>'}}"
                )
        if resources.fractional:
            raise ValueError(
                f"resources.gpus={resources.gpus!r}: AWS Batch gives jobs whole GPUs; use gpus=1 or more "
                "(or the local or kubernetes backend to share a GPU)"
            )
        if resources.instance_types:
            raise ValueError(
                f"resources.instance_types={list(resources.instance_types)!r}: on AWS Batch the compute "
                "environment behind the job queue decides the instance types; choose them there and pick the "
                "queue with spot_queue/on_demand_queue"
            )
        if priority is not None and not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
            raise ValueError(
                f"priority={priority!r}: on the batch backend the priority is Batch's schedulingPriorityOverride "
                f"on fair-share queues, which must be {PRIORITY_RANGE[0]}-{PRIORITY_RANGE[1]}"
            )
        if max_runtime_s is not None and max_runtime_s < MIN_ATTEMPT_SECONDS:
            raise ValueError(
                f"max_runtime={max_runtime_s:g}s: AWS Batch's shortest attempt timeout is {MIN_ATTEMPT_SECONDS}s"
            )

    def validate_image(self, image: str | None) -> None:
        if not image:
            raise ValueError(
                "image=None: the batch backend runs the job in a container; pass image='<registry>/<repo>:<tag>' "
                "(e.g. an ECR image with your code and CUDA)"
            )

    # --- clients ----------------------------------------------------------------------------

    def _client(self, service: str) -> BaseClient:
        with self._lock:
            client = self._clients.get(service)
            if client is None:
                from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
                from botocore.config import Config

                hook = AwsBaseHook(aws_conn_id=self.aws_conn_id, region_name=self.region_name, client_type=service)
                # botocore retries throttled and transient calls itself; poll() adds its own backoff on top
                config = hook.config.merge(Config(retries={"mode": "standard", "max_attempts": 3}))
                client = hook.get_client_type(region_name=hook.region_name, config=config)
                self._clients[service] = client
                self._resolved_region = client.meta.region_name
        return client

    @property
    def region(self) -> str:
        """The region the clients talk to (the option, else the connection's)."""
        if self.region_name:
            return self.region_name
        if self._resolved_region is None:
            self._client("batch")
        return self._resolved_region or "us-east-1"

    def _call(self, what: str, fn: Callable[[], T], *, attempts: int = 6) -> T:
        """Run one API call, backing off with full jitter while Batch throttles it."""
        from botocore.exceptions import ClientError

        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                if code not in THROTTLING_CODES:
                    raise
                if attempt == attempts:
                    raise GpuBackendThrottledError(
                        f"AWS Batch throttled {what} {attempts} times in a row ({code}); will try again"
                    ) from err
                delay = random.uniform(0, min(8.0, 0.25 * 2**attempt))
                log.debug("%s throttled (%s); retrying in %.2fs", what, code, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    # --- queues and job definitions -----------------------------------------------------------

    def _queue(self, capacity: str) -> str:
        queue = self.spot_queue if capacity == "spot" else self.on_demand_queue
        if not queue:
            option = "spot_queue" if capacity == "spot" else "on_demand_queue"
            raise ValueError(f"the batch backend has no {option}; set [gpu_provider] batch_{option}")
        return queue

    def _is_fair_share(self, queue: str) -> bool:
        """Whether the queue has a scheduling policy (then Batch requires shareIdentifier, else rejects it)."""
        with self._lock:
            known = self._fair_share.get(queue)
        if known is not None:
            return known
        client = self._client("batch")
        found = self._call("DescribeJobQueues", lambda: client.describe_job_queues(jobQueues=[queue]))
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
        with self._lock:
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
            command = ["/bin/sh", "-c", MULTI_NODE_ENTRY, "gpu-provider-entry", *command]
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
            "gpu-provider/dag-id": task.dag_id[:256],
            "gpu-provider/task-id": task.task_id[:256],
            "gpu-provider/spec-hash": digest,
        }
        return body

    def _definition_arn(self, body: dict[str, Any]) -> str:
        name = str(body["jobDefinitionName"])
        with self._lock:
            arn = self._definitions.get(name)
        if arn:
            return arn
        client = self._client("batch")
        found = self._call(
            "DescribeJobDefinitions",
            lambda: client.describe_job_definitions(jobDefinitionName=name, status="ACTIVE"),
        )
        revisions = sorted(found.get("jobDefinitions") or [], key=lambda d: int(d.get("revision", 0)))
        if revisions:
            arn = str(revisions[-1]["jobDefinitionArn"])
            log.info("Reusing Batch job definition %s (content unchanged).", arn)
        else:
            registered = self._call("RegisterJobDefinition", lambda: client.register_job_definition(**body))
            arn = str(registered["jobDefinitionArn"])
            log.info("Registered Batch job definition %s.", arn)
        with self._lock:
            self._definitions[name] = arn
        return arn

    # --- the contract --------------------------------------------------------------------------

    def submit_body(self, request: JobRequest, definition_arn: str, *, priority: int | None = None) -> dict[str, Any]:
        """The SubmitJob body of a request (without looking anything up but the queue's policy)."""
        identity = request.identity
        queue = self._queue(request.capacity)
        env = dict(request.env)
        env["NNODES"] = str(request.resources.nodes)
        env["MASTER_PORT"] = str(self.master_port)
        if request.resources.nodes == 1:
            env.update({"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
        environment = [{"name": k, "value": v} for k, v in sorted(env.items())]
        tags = {k: v[:256] for k, v in identity.tags().items()}
        tags["gpu-provider/gpus"] = f"{request.resources.total_gpus:g}"  # all nodes: for GPU-hours and cost
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
        # Batch share identifiers allow letters, digits and underscores: team "ml-infra" -> "ml_infra"
        return _SHARE_UNSAFE.sub("_", team) if team else self.share_identifier

    def submit(self, request: JobRequest) -> JobHandle:
        self.validate_image(request.image)
        definition = self.job_definition(request)
        arn = self._definition_arn(definition)
        body = self.submit_body(request, arn, priority=request.priority)
        client = self._client("batch")
        submitted = client.submit_job(**body)
        return JobHandle(
            backend=self.name,
            job_id=str(submitted["jobId"]),
            name=request.identity.name,
            attempt=request.identity.attempt,
            capacity=request.capacity,
            submitted_at=time.time(),
            extra={
                "queue": body["jobQueue"],
                "region": self.region,
                "job_definition": definition["jobDefinitionName"],
                "gpus": request.resources.total_gpus,
                "nodes": request.resources.nodes,
            },
        )

    def _describe(self, job_ids: Sequence[str]) -> list[dict[str, Any]]:
        client = self._client("batch")
        jobs: list[dict[str, Any]] = []
        unique = list(dict.fromkeys(job_ids))
        for start in range(0, len(unique), DESCRIBE_BATCH):
            chunk = unique[start : start + DESCRIBE_BATCH]
            found = self._call("DescribeJobs", lambda chunk=chunk: client.describe_jobs(jobs=chunk))  # type: ignore[misc]
            jobs.extend(found.get("jobs") or [])
        return jobs

    def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        by_id = {h.job_id: h for h in handles}
        return {
            str(job["jobId"]): self.status_of(job, by_id[str(job["jobId"])])
            for job in self._describe(list(by_id))
            if str(job.get("jobId")) in by_id
        }

    def status_of(self, job: Mapping[str, Any], handle: JobHandle) -> JobStatus:
        """Map one DescribeJobs entry onto a :class:`JobStatus`."""
        state = map_state(STATE_TABLE, str(job.get("status")), backend=self.name)
        reason = str(job.get("statusReason") or "")
        if state is JobState.FAILED:
            state, reason = refine_failure(job)
        elif state is JobState.SUCCEEDED:
            reason = ""  # Batch says "Essential container in task exited" on success too: no news
        started = _seconds_from_ms(job.get("startedAt"))
        ended = _seconds_from_ms(job.get("stoppedAt")) if state.terminal else None
        gpus = float(handle.extra.get("gpus") or _job_gpus(job))
        gpu_seconds = gpus * max(0.0, (ended or time.time()) - started) if started else 0.0
        stream = str((job.get("container") or {}).get("logStreamName") or "")
        log_url = console_log_url(self.region, self.log_group, stream) if stream else None
        return JobStatus(
            state=state,
            reason=reason,
            exit_code=_exit_code(job),
            started_at=started,
            ended_at=ended,
            gpu_seconds=gpu_seconds,
            log_url=log_url,
        )

    def cancel(self, handle: JobHandle, reason: str) -> None:
        client = self._client("batch")
        text = (CANCEL_PREFIX + reason)[:1024]
        self._call("TerminateJob", lambda: client.terminate_job(jobId=handle.job_id, reason=text))

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance in either queue, found by job name (ListJobs JOB_NAME filter)."""
        prefix = f"{task.prefix}-t"
        client = self._client("batch")
        summaries: dict[str, tuple[str, dict[str, Any]]] = {}
        for queue in dict.fromkeys(q for q in (self.spot_queue, self.on_demand_queue) if q):
            token: str | None = None
            while True:
                kwargs: dict[str, Any] = {
                    "jobQueue": queue,
                    "filters": [{"name": "JOB_NAME", "values": [prefix + "*"]}],
                }
                if token:
                    kwargs["nextToken"] = token
                page = self._call("ListJobs", lambda kwargs=kwargs: client.list_jobs(**kwargs))  # type: ignore[misc]
                for summary in page.get("jobSummaryList") or []:
                    name = str(summary.get("jobName") or "")
                    match = _JOB_NAME.search(name)
                    if match and name[: match.start()] == task.prefix:  # not another map index's jobs
                        summaries[str(summary["jobId"])] = (queue, summary)
                token = page.get("nextToken")
                if not token:
                    break
        if not summaries:
            return []
        details = {str(j["jobId"]): j for j in self._describe(list(summaries))}
        handles = []
        for job_id, (queue, summary) in summaries.items():
            match = _JOB_NAME.search(str(summary["jobName"]))
            assert match is not None
            job = details.get(job_id, {})
            tags = job.get("tags") or {}
            if (
                tags.get("gpu-provider/dag-id", task.dag_id[:256]) != task.dag_id[:256]
                or tags.get("gpu-provider/task-id", task.task_id[:256]) != task.task_id[:256]
            ):
                continue  # a name collision with another task (the tags are the full ids)
            capacity = tags.get("gpu-provider/capacity") or ("spot" if queue == self.spot_queue else "on-demand")
            handles.append(
                JobHandle(
                    backend=self.name,
                    job_id=job_id,
                    name=str(summary["jobName"]),
                    attempt=int(match.group(2)),
                    capacity=str(capacity),
                    submitted_at=_seconds_from_ms(summary.get("createdAt")) or time.time(),
                    extra={
                        "queue": queue,
                        "region": self.region,
                        "job_definition": _definition_name(job),
                        "gpus": _tag_number(tags, "gpu-provider/gpus") or _job_gpus(job),
                        "nodes": _job_nodes(job),
                    },
                )
            )
        return sorted(handles, key=lambda h: (h.attempt, h.submitted_at))

    # --- logs and links --------------------------------------------------------------------------

    def _streams(self, handle: JobHandle) -> list[tuple[str, str]]:
        """(label, log stream) of each node of an attempt; empty until the job has started."""
        with self._lock:
            known = self._log_streams.get(handle.job_id)
        if known:
            return known
        nodes = int(handle.extra.get("nodes") or 1)
        ids = [handle.job_id] if nodes == 1 else [f"{handle.job_id}#{i}" for i in range(nodes)]
        streams: list[tuple[str, str]] = []
        for job in sorted(self._describe(ids), key=lambda j: str(j.get("jobId"))):
            stream = (job.get("container") or {}).get("logStreamName")
            if stream:
                label = "" if nodes == 1 else f"node {str(job['jobId']).rpartition('#')[2]}: "
                streams.append((label, str(stream)))
        complete = len(streams) == len(ids)
        if complete:
            with self._lock:
                self._log_streams[handle.job_id] = streams
        return streams

    def logs(self, handle: JobHandle, since: int = 0) -> tuple[list[str], int]:
        """New lines of an attempt's CloudWatch stream(s); ``since`` counts the lines already returned."""
        streams = self._streams(handle)
        if not streams:
            return [], since
        client = self._client("logs")
        with self._lock:
            cursors = self._log_cursors.pop((handle.job_id, since), None)
        skip = 0
        if cursors is None:
            cursors, skip = {}, since  # another process read the first lines: read again and skip them
        lines: list[str] = []
        for label, stream in streams:
            token = cursors.get(stream)
            while True:
                kwargs: dict[str, Any] = {"logGroupName": self.log_group, "logStreamName": stream}
                kwargs.update({"nextToken": token} if token else {"startFromHead": True})
                try:
                    page = self._call("GetLogEvents", lambda kwargs=kwargs: client.get_log_events(**kwargs))  # type: ignore[misc]
                except Exception as err:
                    if "ResourceNotFoundException" in str(err):
                        break  # the stream is created when the container writes its first line
                    raise
                lines.extend(label + str(event.get("message", "")).rstrip("\n") for event in page.get("events") or [])
                new_token = page.get("nextForwardToken")
                if not new_token or new_token == token:
                    break
                token = new_token
            cursors[stream] = token
        lines = lines[skip:]
        position = since + len(lines)
        with self._lock:
            self._log_cursors[(handle.job_id, position)] = cursors
        return lines, position

    def console_url(self, handle: JobHandle) -> str | None:
        region = str(handle.extra.get("region") or self.region)
        return f"https://{region}.console.aws.amazon.com/batch/home?region={region}#jobs/detail/{handle.job_id}"

    def logs_url(self, handle: JobHandle) -> str | None:
        """Before the stream is known: the log group, filtered to this job definition's streams."""
        region = str(handle.extra.get("region") or self.region)
        definition = handle.extra.get("job_definition")
        return console_log_url(region, self.log_group, stream_prefix=f"{definition}/" if definition else None)


def _job_gpus(job: Mapping[str, Any]) -> float:
    """Total GPUs of a described job (all nodes)."""

    def gpus_of(container: Mapping[str, Any] | None) -> float:
        for req in (container or {}).get("resourceRequirements") or []:
            if req.get("type") == "GPU":
                return float(req.get("value") or 0)
        return 0.0

    if job.get("nodeProperties"):
        ranges = job["nodeProperties"].get("nodeRangeProperties") or []
        per_node = gpus_of(ranges[0].get("container")) if ranges else 0.0
        return per_node * _job_nodes(job)
    return gpus_of(job.get("container"))


def _tag_number(tags: Mapping[str, Any], key: str) -> float | None:
    try:
        return float(tags[key])
    except (KeyError, TypeError, ValueError):
        return None


def _job_nodes(job: Mapping[str, Any]) -> int:
    props = job.get("nodeProperties") or {}
    return int(props.get("numNodes") or 1)


def _definition_name(job: Mapping[str, Any]) -> str | None:
    arn = str(job.get("jobDefinition") or "")
    # arn:aws:batch:<region>:<account>:job-definition/<name>:<revision>
    return arn.rpartition("/")[2].rpartition(":")[0] or None
