"""The SageMaker backend: each attempt is one SageMaker training job; :class:`SageMakerBackend` orchestrates.

An attempt's job is named by its identity (``gp-<dag>-<task>-<runhash>-t<try>-a<attempt>``);
SageMaker refuses a second job of one name, so a re-sent CreateTrainingJob adopts the first.
Spot attempts use managed spot training with ``CheckpointConfig``
(:mod:`~gpu_provider.backends.sagemaker.requests`): the job writes and reads checkpoints as local files
(``GPU_PROVIDER_CHECKPOINT_URI=file:///opt/ml/checkpoints``).

SageMaker restarts a reclaimed spot job by itself, inside the same training job: the backend reports
each ``Interrupted`` transition as a restart (``JobStatus.restarts``, the attempt stays active), and
the engine stops the job and resubmits it on on-demand once the capacity policy says so.

What SageMaker's answers mean is in :mod:`gpu_provider.backends.sagemaker.mapping`. Status reads
are coalesced: one ListTrainingJobs (by name prefix and ``LastModifiedTimeAfter``) per tick, and a
DescribeTrainingJob only for jobs that changed since the last read (see :meth:`SageMakerBackend.poll`).
The rest lives by concern beside this module: ``options``, ``requests`` (the CreateTrainingJob body),
``service`` (the calls), ``status`` (describe -> JobStatus), ``ownership`` (tags, mark, the stop),
``logs``, ``cache`` (what polls saw).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.aws.calls import PATIENT_ATTEMPTS, Clients
from gpu_provider.backends.aws.status import VISIBILITY_GRACE_S
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
    lookup_key,
    task_from_tags,
)
from gpu_provider.backends.common import ATTEMPT_NAME_END, port_option, run_bounded, text_option
from gpu_provider.backends.sagemaker import logs as job_logs
from gpu_provider.backends.sagemaker import mapping, ownership, requests, status
from gpu_provider.backends.sagemaker.cache import JobCache
from gpu_provider.backends.sagemaker.logs import LOG_GROUP, TAIL_STREAMS
from gpu_provider.backends.sagemaker.options import (
    DEFAULT_MASTER_PORT,
    DEFAULT_VOLUME_GB,
    full_describe_every_option,
    instance_type_option,
    output_path_option,
    role_arn_option,
    volume_size_option,
    vpc_options,
)
from gpu_provider.backends.sagemaker.ownership import (
    MAX_TAG_VALUE_CHARS,
    TAG_STOP_REASON,
    decode_tag_text,
    encode_tag_text,
    tag_value,
)
from gpu_provider.backends.sagemaker.requests import (
    CHECKPOINT_LOCAL_PATH,
    DEFAULT_SPOT_WAIT_S,
    INPUT_CONFIG_DIR,
    MAX_ARGUMENT_CHARS,
    MAX_ENV_ENTRIES,
    MAX_ENV_VALUE_CHARS,
    MAX_RUNTIME_S,
    MULTI_NODE_ENTRY,
    SECRETS_ENTRY,
)
from gpu_provider.backends.sagemaker.service import LIST_PAGE, SERVICE, TrainingJobs
from gpu_provider.exceptions import GpuJobError, GpuJobStatusError
from gpu_provider.job import GpuResources, to_bool
from gpu_provider.runtime.secrets import check_refs

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = [  # what this module held before it was split by concern; importable from here still
    "CHECKPOINT_LOCAL_PATH",
    "DEFAULT_MASTER_PORT",
    "DEFAULT_SPOT_WAIT_S",
    "DEFAULT_VOLUME_GB",
    "DESCRIBE_EACH_UP_TO",
    "INPUT_CONFIG_DIR",
    "LIST_OVERLAP_S",
    "LIST_PAGE",
    "LOG_GROUP",
    "MAX_ARGUMENT_CHARS",
    "MAX_ENV_ENTRIES",
    "MAX_ENV_VALUE_CHARS",
    "MAX_RUNTIME_S",
    "MAX_TAG_VALUE_CHARS",
    "MULTI_NODE_ENTRY",
    "SECRETS_ENTRY",
    "SERVICE",
    "TAG_STOP_REASON",
    "TAIL_STREAMS",
    "VISIBILITY_GRACE_S",
    "SageMakerBackend",
    "decode_tag_text",
    "encode_tag_text",
    "tag_value",
]

log = logging.getLogger(__name__)

#: up to this many jobs a poll describes each one (cheaper than a list and the describes)
DESCRIBE_EACH_UP_TO = 2
#: a list reads jobs modified since the last list minus this overlap (clock skew, eventual consistency)
LIST_OVERLAP_S = 60.0


class SageMakerBackend(Backend):
    """Runs each attempt as a SageMaker training job: managed spot for spot attempts, plain for on-demand.

    Every option falls back to the ``[gpu_provider]`` config key named in brackets.

    :param role_arn: IAM role SageMaker assumes for the job (pull the image, read and write S3, write
        logs) [``sagemaker_role_arn``]; required to submit.
    :param output_path: S3 prefix of the model artifacts (``OutputDataConfig.S3OutputPath``)
        [``sagemaker_output_path``]; required to submit.
    :param aws_conn_id: Airflow AWS connection [``sagemaker_aws_conn_id``, default ``aws_default``].
    :param region_name: AWS region; default: the connection's [``sagemaker_region``].
    :param subnets: VPC subnets of the job (``VpcConfig``), a list or comma-separated [``sagemaker_subnets``].
    :param security_group_ids: its security groups [``sagemaker_security_group_ids``]; both or neither.
    :param volume_size_gb: storage volume per instance in GB [``sagemaker_volume_size_gb``, default 100].
    :param instance_type: the instance of jobs that name neither ``gpu_type`` nor ``instance_types``
        [``sagemaker_instance_type``]; default: the instance table's ``a10g`` row for the GPU count.
    :param kms_key_id: KMS key for the output and the instances' volumes [``sagemaker_kms_key_id``].
    :param secrets: environment variables read at the job's start from Secrets Manager or SSM Parameter
        Store, as ``{"NAME": "arn:aws:secretsmanager:..."}`` (the shape of the Batch backend's; a JSON text
        works too). The request carries only the references (in
        ``GPU_PROVIDER_SECRET_REFS``); the command runs through ``python3 -m gpu_provider.runtime.secrets``,
        which reads them with the training role, so the image needs this package and boto3, and the role
        ``secretsmanager:GetSecretValue`` / ``ssm:GetParameter``. Values passed through ``env=`` instead are
        readable by anyone allowed ``DescribeTrainingJob``.
    :param master_port: ``MASTER_PORT`` of multi-node jobs (default 29500).
    :param multi_node_entry: wrap multi-node commands in a ``/bin/sh`` entry that sets ``NODE_RANK`` and
        ``MASTER_ADDR`` from SageMaker's ``resourceconfig.json`` (default true). Turn off if the image
        has no ``/bin/sh`` and the job normalises them itself (``gpu_provider.runtime.launch``).
    :param full_describe_every: a batched poll describes every running managed-spot job in full at
        least every this many ticks, whether or not ListTrainingJobs lists it as modified, so a spot
        interruption is seen within that bound [``sagemaker_full_describe_every``, default 10].
    """

    name: ClassVar[str] = "sagemaker"
    #: who the job runs as, where its secrets come from, which account, endpoint, network, key and
    #: bucket: from the [gpu_provider] config or literal DAG code, never a template (trigger-form
    #: params are untrusted)
    fixed_options: ClassVar[frozenset[str]] = frozenset(
        {
            "aws_conn_id",
            "region_name",
            "role_arn",
            "secrets",
            "output_path",
            "kms_key_id",
            "subnets",
            "security_group_ids",
        }
    )
    service: ClassVar[str] = SERVICE
    capabilities: ClassVar[Capabilities] = Capabilities(
        multi_node=True,
        multi_node_spot=True,  # managed spot training runs InstanceCount > 1
        fractional_gpus=False,
        instance_types=True,
        image_required=True,
        restarts_inside_job=True,  # managed spot restarts a reclaimed job inside the same training job
        unique_names=True,  # CreateTrainingJob refuses a name in use (ResourceInUse): submit adopts it
        min_runtime_s=1,
    )
    default_poll_interval: ClassVar[float] = 30.0
    #: one GetLogEvents per host per job: the worker copies an attempt's log when it ends
    stream_logs_when_deferred: ClassVar[bool] = False
    #: SageMaker ships a container's last lines to CloudWatch a few seconds after the job ended
    log_settle_s: ClassVar[float] = 6.0
    #: a succeeded job's output is its model artifacts, unless the job declared its own
    service_output: ClassVar[bool] = True
    #: ``ml.`` instance types, sold at SageMaker's prices (:mod:`gpu_provider.spend.prices`)
    price_catalog: ClassVar[str] = "sagemaker"

    def __init__(
        self,
        *,
        role_arn: str | None = None,
        output_path: str | None = None,
        aws_conn_id: str | None = None,
        region_name: str | None = None,
        subnets: Sequence[str] | str | None = None,
        security_group_ids: Sequence[str] | str | None = None,
        volume_size_gb: int | str | None = None,
        instance_type: str | None = None,
        kms_key_id: str | None = None,
        secrets: Mapping[str, str] | str | None = None,
        master_port: int | str = DEFAULT_MASTER_PORT,
        multi_node_entry: bool | str = True,
        full_describe_every: int | str | None = None,
    ) -> None:
        self.role_arn = role_arn_option(role_arn)
        self.output_path = output_path_option(output_path)
        self.aws_conn_id = text_option(
            "aws_conn_id", aws_conn_id, config_key="sagemaker_aws_conn_id", default="aws_default"
        )
        self.region_name = text_option("region_name", region_name, config_key="sagemaker_region")
        self.subnets, self.security_group_ids = vpc_options(subnets, security_group_ids)
        self.volume_size_gb = volume_size_option(volume_size_gb)
        self.instance_type = instance_type_option(instance_type)
        self.kms_key_id = text_option("kms_key_id", kms_key_id, config_key="sagemaker_kms_key_id")
        self.secrets = check_refs(secrets)
        self.master_port = port_option("master_port", master_port)
        self.multi_node_entry = to_bool("multi_node_entry", multi_node_entry)
        self._full_describe_every_arg = full_describe_every
        self.full_describe_every = full_describe_every_option(full_describe_every)

        self._clients = Clients(self.aws_conn_id or "aws_default", self.region_name, main_service="sagemaker")
        self._jobs = TrainingJobs(self._clients)
        # what the polls saw, per job name, for polling only (bounded; see the cache module). Plain dict
        # reads and writes, no lock: cancel() runs in a signal handler.
        self._seen = JobCache(full_describe_every=self.full_describe_every)
        self._listed_at: float | None = None

    # --- options --------------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "role_arn": self.role_arn,
            "output_path": self.output_path,
            "aws_conn_id": self.aws_conn_id,
            "region_name": self.region_name,
            "subnets": list(self.subnets) or None,
            "security_group_ids": list(self.security_group_ids) or None,
            "volume_size_gb": self.volume_size_gb,
            "instance_type": self.instance_type,
            "kms_key_id": self.kms_key_id,
            "secrets": dict(self.secrets) or None,
            "master_port": self.master_port,
            "multi_node_entry": self.multi_node_entry,
            "full_describe_every": self._full_describe_every_arg,
        }
        return {k: v for k, v in opts.items() if v is not None}

    def _client(self, service: str = "sagemaker") -> BaseClient:
        return self._clients.get(service)

    @property
    def region(self) -> str:
        return self._clients.region

    def price_region(self) -> str | None:
        return self.region

    # --- parse time ---------------------------------------------------------------------------

    def instance_type_for(self, resources: GpuResources) -> str:
        """The training instance of a job: ``instance_types=``, else the table (``gpu_type`` x GPUs per node)."""
        return mapping.training_instance_for(resources, self.instance_type)

    def validate_instance_fallback(self, instance_types: Sequence[str]) -> None:
        """Each type of an ordered preference must be a training instance SageMaker prices (``ml.`` added
        where missing)."""
        mapping.check_instance_fallback(instance_types)

    def validate_job(self, resources: GpuResources, capacity: str, multi: bool, runtime_s: float | None) -> None:
        self.instance_type_for(resources)
        if runtime_s is not None and runtime_s > MAX_RUNTIME_S:
            raise ValueError(
                f"max_runtime={runtime_s:g}s (or execution_timeout): SageMaker training jobs run at most "
                f"{MAX_RUNTIME_S}s (28 days)"
            )

    # --- the request (:mod:`~gpu_provider.backends.sagemaker.requests`) ------------------------

    def environment(self, request: JobRequest) -> dict[str, str]:
        """The job's ``Environment``: the contract, with checkpoints at SageMaker's local mirror."""
        return requests.environment(self, request)

    def tags(self, request: JobRequest) -> dict[str, str]:
        return requests.tags(request)

    def create_body(self, request: JobRequest) -> dict[str, Any]:
        """The CreateTrainingJob body of a request."""
        return requests.create_body(self, request)

    # --- the contract -------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> JobHandle:
        """CreateTrainingJob; a name already in use (a re-sent or lost-answer submit) adopts that job."""
        self.validate_image(request.image)
        body = self.create_body(request)
        identity = request.identity
        arn, existed = self._jobs.create(identity, body)
        if arn is None:
            found = self._adopt(identity)
            log.info("SageMaker training job %s exists already for this attempt: adopting it.", identity.name)
            return found.as_adopted() if existed else found
        return JobHandle(
            backend=self.name,
            job_id=identity.name,
            name=identity.name,
            attempt=identity.attempt,
            capacity=request.capacity,
            submitted_at=time.time(),
            extra={
                "region": self.region,
                "job_arn": arn,
                "gpus": request.resources.total_gpus,
                "nodes": request.resources.nodes,
            },
        )

    def _adopt(self, identity: JobIdentity) -> JobHandle:
        job = self._jobs.describe(identity.name, attempts=PATIENT_ATTEMPTS)
        if job is None:
            raise GpuJobError(f"{SERVICE} says training job {identity.name} exists but does not describe it")
        tags = self._tags(job, refresh=True)
        task = task_from_tags(tags)
        if task is not None and (task.dag_id, task.task_id) != (identity.task.dag_id, identity.task.task_id):
            raise GpuJobError(
                f"{SERVICE} training job {identity.name} exists and belongs to {task.dag_id}.{task.task_id}, not "
                f"{identity.task.dag_id}.{identity.task.task_id}: training job names are unique per account and region"
            )
        return self._handle_of(job, tags)

    def _handle_of(self, job: Mapping[str, Any], tags: Mapping[str, str]) -> JobHandle:
        return status.handle_of(job, tags, backend=self.name, region=self.region)

    def _tags(self, job: Mapping[str, Any], *, refresh: bool = False) -> dict[str, str]:
        """The job's tags: those the cache holds, unless ``refresh`` (then ListTags now)."""
        seen = self._seen.get(str(job["TrainingJobName"]))
        if seen is not None and not refresh:
            return seen.tags
        return self._jobs.list_tags(str(job["TrainingJobArn"]))

    def _read(self, name: str, *, cached: bool = False) -> tuple[dict[str, Any], dict[str, str]] | None:
        """Describe a job and read its tags.

        :param cached: a poll's read: the tags the cache holds serve while ``TrainingJobStatus`` is
            unchanged, and what was read is kept for the next poll. Otherwise both are read now and
            nothing is kept (lookups, the reaper's listing: no poll evicts what they would leave).
        """
        job = self._jobs.describe(name)
        if job is None:
            self._seen.pop(name)
            return None
        previous = self._seen.get(name) if cached else None
        tags = (
            previous.tags
            if previous is not None and previous.job.get("TrainingJobStatus") == job.get("TrainingJobStatus")
            else self._tags(job, refresh=True)
        )
        if cached:
            self._seen.put(name, mapping.seconds(job.get("LastModifiedTime")), job, tags)
        return job, tags

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        """Statuses of many jobs: one ListTrainingJobs (by name prefix, modified since the last list) per
        call, and DescribeTrainingJob (with ListTags when the status changed) only for jobs that changed
        or were never read, and for every active managed-spot job not described in the last
        ``full_describe_every`` calls (so an interruption is seen within that bound even if SageMaker
        did not move its ``LastModifiedTime``). Up to :data:`DESCRIBE_EACH_UP_TO` jobs are described
        directly. Each call is a tick of the cache: jobs no call asked about for a few ticks are forgotten."""
        by_name = {h.job_id: h for h in handles}
        self._seen.next_tick()
        for name in by_name:
            self._seen.ask(name)
        changed: set[str]
        if len(by_name) <= DESCRIBE_EACH_UP_TO:
            changed = set(by_name)
        else:
            started = time.time()
            since = (
                self._listed_at - LIST_OVERLAP_S
                if self._listed_at is not None
                else min(h.submitted_at for h in handles) - LIST_OVERLAP_S
            )
            prefix = _common_prefix(list(by_name))
            listed = {
                str(s["TrainingJobName"]): mapping.seconds(s.get("LastModifiedTime"))
                for s in self._jobs.list_jobs(name_contains=prefix, LastModifiedTimeAfter=since)
            }
            self._listed_at = started
            changed = set()
            for name in by_name:
                seen = self._seen.get(name)
                if seen is None or (name in listed and listed[name] != seen.modified) or self._seen.due(name):
                    changed.add(name)
        now = time.time()
        result: PollResult = {}
        for name, handle in by_name.items():
            seen = None if name in changed else self._seen.get(name)
            read = self._read(name, cached=True) if seen is None else (seen.job, seen.tags)
            if read is None:
                result[name] = status.missing(handle, now)
                continue
            try:
                result[name] = self.status_of(read[0], handle, read[1])
            except ValueError as err:
                result[name] = GpuJobStatusError(f"{SERVICE} training job {name}: {err}")
        return result

    def status_of(self, job: Mapping[str, Any], handle: JobHandle, tags: Mapping[str, str]) -> JobStatus:
        """Map one DescribeTrainingJob answer (and the job's tags) onto a :class:`JobStatus`
        (:func:`gpu_provider.backends.sagemaker.status.status_of`)."""
        return status.status_of(job, handle, tags, backend=self.name, region=self._region_of(handle))

    # --- ownership and the stop (:mod:`~gpu_provider.backends.sagemaker.ownership`) ------------

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """ListTags on the job now (DescribeTrainingJob first when the handle lacks its ARN); never the
        tags :meth:`poll` keeps, which stay as they were while ``TrainingJobStatus`` does not change."""
        return ownership.read_owner(self._jobs, self._seen, handle)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Tag the job with the reason, then StopTrainingJob; from a SIGTERM handler too (bounded wait)."""
        run_bounded(f"StopTrainingJob {handle.job_id}", lambda: ownership.stop(self._jobs, handle, reason))

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Tag the job (AddTags): the try that owns it, or that its outcome was collected."""
        ownership.mark(self._jobs, self._seen, handle, owner=owner_try, collected=collected)

    # --- lookups ------------------------------------------------------------------------------

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance: ListTrainingJobs by the name prefix, tags checked."""
        handles = []
        for summary in self._jobs.list_jobs(name_contains=f"{task.prefix}-t"):
            name = str(summary.get("TrainingJobName") or "")
            match = ATTEMPT_NAME_END.search(name)
            if not match or name[: match.start()] != task.prefix:
                continue  # another map index's jobs
            read = self._read(name)
            if read is None:
                continue
            owner = task_from_tags(read[1])
            if owner is not None and owner != task:
                continue
            handles.append(self._handle_of(*read))
        return sorted(handles, key=lambda h: (h.attempt, h.submitted_at))

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A training job by name (``job_id`` is its name, or its ARN), else ``None``."""
        _, value = lookup_key(job_id, name)
        value = value.rpartition(":training-job/")[2] or value
        if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", value):
            raise ValueError(f"{value!r} is not a SageMaker training job name (1-63 letters, digits and hyphens)")
        read = self._read(value)
        return None if read is None else self._handle_of(*read)

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        read = self._read(handle.job_id)
        return None if read is None else task_from_tags(read[1])

    def list_owned(self) -> list[OwnedJob]:
        """Active training jobs (InProgress, Stopping) carrying this provider's tags, in the backend's region."""
        owned = []
        for training_status in ("InProgress", "Stopping"):
            for summary in self._jobs.list_jobs(name_contains="gp-", StatusEquals=training_status):
                read = self._read(str(summary["TrainingJobName"]))
                if read is None:
                    continue
                job, tags = read
                if names.TAG_DAG_ID not in tags:
                    continue
                handle = self._handle_of(job, tags)
                try:
                    state = self.status_of(job, handle, tags).state
                except ValueError:
                    state = JobState.RUNNING
                if state.terminal:
                    continue
                owned.append(status.owned_job(job, tags, handle, state))
        return owned

    # --- logs and links -----------------------------------------------------------------------

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Every host's CloudWatch stream (``<job>/algo-<n>-<epoch>``), each line prefixed with its host."""
        return job_logs.read(self._clients, handle.job_id, cursor, max_bytes)

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` log lines of the attempt: one GetLogEvents from the end of each of the
        last :data:`~gpu_provider.backends.sagemaker.logs.TAIL_STREAMS` host streams (those of its last
        run), merged by time."""
        return job_logs.tail(self._clients, handle.job_id, lines)

    def event_source(self) -> EventSource | None:
        """EventBridge state-change events from the SQS queue of ``[gpu_provider] sagemaker_events_queue_url``, if set
        (:mod:`gpu_provider.backends.aws.events`)."""
        from gpu_provider.backends.aws.events import queue_events

        return queue_events("sagemaker_events_queue_url", self._clients)

    def console_url(self, handle: JobHandle) -> str | None:
        return mapping.console_url(self._region_of(handle), handle.name)

    def logs_url(self, handle: JobHandle) -> str | None:
        return mapping.logs_console_url(self._region_of(handle), handle.name)

    def _region_of(self, handle: JobHandle) -> str:
        """The job's region: the handle's, else the backend's (which may build a client to learn it)."""
        return str(handle.extra.get("region") or self.region)


def _common_prefix(job_names: Sequence[str]) -> str:
    """The longest prefix all names share (``NameContains`` of one ListTrainingJobs for all of them)."""
    first, last = min(job_names), max(job_names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size] or "gp-"
