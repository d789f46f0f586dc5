"""The SageMaker backend: each attempt is one SageMaker training job.

An attempt's job is named by its identity (``gp-<dag>-<task>-<runhash>-t<try>-a<attempt>``);
SageMaker refuses a second job of one name, so a re-sent CreateTrainingJob adopts the first.
Spot attempts use managed spot training (``EnableManagedSpotTraining``, ``MaxWaitTimeInSeconds`` =
max runtime + the policy's spot wait) with ``CheckpointConfig``: SageMaker copies
``/opt/ml/checkpoints`` to and from the task's checkpoint URI on S3, so the job writes and reads
checkpoints as local files (``GPU_PROVIDER_CHECKPOINT_URI=file:///opt/ml/checkpoints``).

SageMaker restarts a reclaimed spot job by itself, inside the same training job: the backend reports
each ``Interrupted`` transition as a restart (``JobStatus.restarts``, the attempt stays active), and
the engine stops the job and resubmits it on on-demand once the capacity policy says so.

What SageMaker's answers mean is in :mod:`gpu_provider.backends.sagemaker.mapping`. Status reads
are coalesced: one ListTrainingJobs (by name prefix and ``LastModifiedTimeAfter``) per tick, and a
DescribeTrainingJob only for jobs that changed since the last read (see :meth:`SageMakerBackend.poll`).
"""

from __future__ import annotations

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
    clip_line,
    lookup_key,
    map_state,
    provider_config,
    task_from_tags,
)
from gpu_provider.backends.common import END_OF_LOG_COMMAND, list_option, run_bounded, text_option
from gpu_provider.backends.sagemaker import mapping
from gpu_provider.backends.sagemaker.cache import FULL_DESCRIBE_EVERY, JobCache
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobError, GpuJobStatusError
from gpu_provider.job import GpuResources, to_bool
from gpu_provider.runtime.secrets import check_refs

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

SERVICE = "Amazon SageMaker"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
#: host streams :meth:`SageMakerBackend.output_tail` reads from the end (one GetLogEvents each)
TAIL_STREAMS = 8
#: where SageMaker mirrors CheckpointConfig.S3Uri inside the container
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
#: where the container finds SageMaker's resourceconfig.json (hosts of the job)
INPUT_CONFIG_DIR = "/opt/ml/input/config"
DEFAULT_VOLUME_GB = 100
DEFAULT_MASTER_PORT = 29500
#: MaxRuntimeInSeconds of a job without max_runtime: SageMaker's longest (28 days)
MAX_RUNTIME_S = 28 * 24 * 3600
#: how long a spot attempt may wait for capacity when the policy waits forever
DEFAULT_SPOT_WAIT_S = 7 * 24 * 3600
#: SageMaker's limits on a request (CreateTrainingJob)
MAX_ARGUMENT_CHARS = 256
MAX_ENV_VALUE_CHARS = 512
MAX_ENV_ENTRIES = 100
MAX_TAG_VALUE_CHARS = 256
#: most results of one ListTrainingJobs page
LIST_PAGE = 100
#: up to this many jobs a poll describes each one (cheaper than a list and the describes)
DESCRIBE_EACH_UP_TO = 2
#: a list reads jobs modified since the last list minus this overlap (clock skew, eventual consistency)
LIST_OVERLAP_S = 60.0
#: a job not found this long after its submission is lost (before: not visible yet)
VISIBILITY_GRACE_S = 60.0
#: the tag on a job this provider stopped: why (``CANCEL_PREFIX`` + reason), read back from a Stopped job
TAG_STOP_REASON = names.TAG_PREFIX + "stop-reason"

#: the multi-node entry wrapper: POSIX sh and sed only. SageMaker names its hosts algo-1 ... algo-N and
#: tells each container its own in resourceconfig.json: NODE_RANK = n - 1, and the rendezvous runs on
#: algo-1 (unless the environment names another MASTER_ADDR). Then it execs the command through
#: the end-of-log entry (``END_OF_LOG_COMMAND``), which marks where each node's log ends.
MULTI_NODE_ENTRY = (
    'c="${SM_INPUT_CONFIG_DIR:-/opt/ml/input/config}/resourceconfig.json"; '
    'n=$(sed -n \'s/.*"current_host": *"algo-\\([0-9]*\\)".*/\\1/p\' "$c"); '
    'export NODE_RANK=$((${n:-1} - 1)); export MASTER_ADDR="${MASTER_ADDR:-algo-1}"; exec "$@"'
)

#: the entry that reads ``secrets=`` in the job with the training role (gpu_provider.runtime.secrets)
SECRETS_ENTRY = ("python3", "-m", "gpu_provider.runtime.secrets", "--")

_JOB_NAME = re.compile(r"-t(\d+)-a(\d+)$")
_TAG_UNSAFE = re.compile(r"[^\w\s.:/=+\-@]", re.UNICODE)
_S3_PATH = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
_GROUP = re.compile(r"^sg-[0-9a-z]+$")
_SUBNET = re.compile(r"^subnet-[0-9a-z]+$")


def _not_found(err: BaseException) -> bool:
    """DescribeTrainingJob's answer for a job SageMaker does not know (ValidationException, 'not found')."""
    code = error_code(err)
    if code == "ResourceNotFound":
        return True
    message = str(getattr(err, "response", {}).get("Error", {}).get("Message", "")).lower()
    return code == "ValidationException" and "not found" in message


def tag_value(text: str) -> str:
    """A tag value SageMaker accepts: letters, digits, spaces and ``_.:/=+-@``, at most 256 characters."""
    return _TAG_UNSAFE.sub(" ", text)[:MAX_TAG_VALUE_CHARS]


#: what a tag value keeps as it is; anything else (``@`` included) is escaped as ``@XX`` per UTF-8 byte
_TAG_PLAIN = re.compile(r"[^\W]|[ .:/=+\-]", re.UNICODE)
_TAG_ESCAPES = re.compile(r"(?:@[0-9A-F]{2})+")


def encode_tag_text(text: str) -> str:
    """``text`` as a tag value SageMaker accepts, reversibly (:func:`decode_tag_text`): punctuation SageMaker
    refuses becomes ``@XX`` per UTF-8 byte (``,`` -> ``@2C``), cut at a whole character within 256."""
    out: list[str] = []
    size = 0
    for char in text:
        piece = char if _TAG_PLAIN.fullmatch(char) else "".join(f"@{b:02X}" for b in char.encode())
        if size + len(piece) > MAX_TAG_VALUE_CHARS:
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def decode_tag_text(value: str) -> str:
    """The text :func:`encode_tag_text` encoded (a value written before the encoding reads as it is)."""
    return _TAG_ESCAPES.sub(lambda m: bytes.fromhex(m.group(0).replace("@", "")).decode("utf-8", "replace"), value)


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
        self.role_arn = text_option("role_arn", role_arn, config_key="sagemaker_role_arn")
        if self.role_arn and not _ROLE_ARN.fullmatch(self.role_arn):
            raise ValueError(f"role_arn={self.role_arn!r} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
        self.output_path = text_option("output_path", output_path, config_key="sagemaker_output_path")
        if self.output_path and not _S3_PATH.fullmatch(self.output_path):
            raise ValueError(f"output_path={self.output_path!r} must be an s3://bucket/prefix URI")
        self.aws_conn_id = text_option(
            "aws_conn_id", aws_conn_id, config_key="sagemaker_aws_conn_id", default="aws_default"
        )
        self.region_name = text_option("region_name", region_name, config_key="sagemaker_region")
        self.subnets = list_option(
            "subnets", subnets, config_key="sagemaker_subnets", pattern=_SUBNET, what="subnet ids"
        )
        self.security_group_ids = list_option(
            "security_group_ids",
            security_group_ids,
            config_key="sagemaker_security_group_ids",
            pattern=_GROUP,
            what="security group ids",
        )
        if bool(self.subnets) != bool(self.security_group_ids):
            raise ValueError(
                f"subnets={self.subnets!r} and security_group_ids={self.security_group_ids!r}: a job in a VPC "
                "needs both (VpcConfig), or give neither"
            )
        volume = volume_size_gb if volume_size_gb not in (None, "") else provider_config("sagemaker_volume_size_gb")
        try:
            size = int(str(volume).strip()) if volume not in (None, "") else DEFAULT_VOLUME_GB
        except ValueError:
            size = -1
        if not 1 <= size <= 16384:
            raise ValueError(f"volume_size_gb={volume!r} must be a whole number of GB from 1 to 16384")
        self.volume_size_gb = size
        chosen = text_option("instance_type", instance_type, config_key="sagemaker_instance_type")
        self.instance_type = mapping.training_instance(chosen) if chosen else None
        self.kms_key_id = text_option("kms_key_id", kms_key_id, config_key="sagemaker_kms_key_id")
        self.secrets = check_refs(secrets)
        try:
            port = int(str(master_port).strip())
        except ValueError:
            port = -1
        if not 1 <= port <= 65535:
            raise ValueError(f"master_port={master_port!r} must be a TCP port number (1-65535)")
        self.master_port = port
        self.multi_node_entry = to_bool("multi_node_entry", multi_node_entry)

        self._full_describe_every_arg = full_describe_every
        every = full_describe_every
        if every is None or every == "":
            every = provider_config("sagemaker_full_describe_every") or FULL_DESCRIBE_EVERY
        try:
            ticks = int(str(every).strip())
        except ValueError:
            ticks = 0
        if ticks < 1:
            raise ValueError(
                f"full_describe_every={every!r} (or [gpu_provider] sagemaker_full_describe_every) must be a whole "
                "number of poll ticks, 1 or more"
            )
        self.full_describe_every = ticks

        self._clients = Clients(self.aws_conn_id or "aws_default", self.region_name, main_service="sagemaker")
        # what the polls saw, per job name, for polling only (bounded; see the cache module). Plain dict
        # reads and writes, no lock: cancel() runs in a signal handler.
        self._seen = JobCache(full_describe_every=ticks)
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
        if resources.instance_types:
            if len(resources.instance_types) > 1:
                raise ValueError(
                    f"resources.instance_types={list(resources.instance_types)!r}: a SageMaker training job runs on "
                    "one instance type; give one"
                )
            return mapping.training_instance(resources.instance_types[0])
        gpus = math.ceil(resources.gpus)
        if self.instance_type and not resources.gpu_type:
            return self.instance_type
        return mapping.instance_type_for(resources.gpu_type, gpus)

    def validate_instance_fallback(self, instance_types: Sequence[str]) -> None:
        """Each type of an ordered preference must be a training instance SageMaker prices (``ml.`` added
        where missing)."""
        from gpu_provider.capacity.instances import known_instance_types

        known = known_instance_types()
        for instance_type in instance_types:
            if mapping.training_instance(instance_type) not in known:
                allowed = ", ".join(sorted(t for t in known if t.startswith("ml.")))
                raise ValueError(
                    f"resources.instance_types: {instance_type!r} is not a SageMaker training instance of the "
                    f"price table; allowed: {allowed}"
                )

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
        self.instance_type_for(resources)
        if max_runtime_s is not None and max_runtime_s > MAX_RUNTIME_S:
            raise ValueError(
                f"max_runtime={max_runtime_s:g}s (or execution_timeout): SageMaker training jobs run at most "
                f"{MAX_RUNTIME_S}s (28 days)"
            )

    # --- the request ----------------------------------------------------------------------------

    def environment(self, request: JobRequest) -> dict[str, str]:
        """The job's ``Environment``: the contract, with checkpoints at SageMaker's local mirror."""
        env = dict(request.env)
        uri = request.checkpoint_uri
        if uri:
            env[names.ENV_CHECKPOINT_URI] = "file://" + CHECKPOINT_LOCAL_PATH
            resume = request.resume_from or env.get(names.ENV_RESUME_FROM) or ""
            if resume:
                if not resume.startswith(uri.rstrip("/") + "/"):
                    raise GpuJobError(
                        f"resume_from={resume!r} is not under the checkpoint URI {uri!r}: SageMaker restores only "
                        "CheckpointConfig.S3Uri into the job"
                    )
                env[names.ENV_RESUME_FROM] = "file://" + CHECKPOINT_LOCAL_PATH + resume[len(uri.rstrip("/")) :]
        env["NNODES"] = str(request.resources.nodes)
        env["MASTER_PORT"] = str(self.master_port)
        env["SM_INPUT_CONFIG_DIR"] = INPUT_CONFIG_DIR
        if self.secrets:  # references only: the entry resolves them in the job (SECRETS_ENTRY)
            env[names.ENV_SECRET_REFS] = json.dumps(self.secrets, separators=(",", ":"), sort_keys=True)
        if request.resources.nodes == 1:
            env.update({"NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
        if len(env) > MAX_ENV_ENTRIES:
            raise ValueError(f"env: {len(env)} variables; SageMaker takes at most {MAX_ENV_ENTRIES} per training job")
        for key, value in env.items():
            if len(value) > MAX_ENV_VALUE_CHARS:
                raise ValueError(
                    f"env[{key!r}] is {len(value)} characters long; SageMaker allows {MAX_ENV_VALUE_CHARS} per value"
                )
        return env

    def tags(self, request: JobRequest) -> dict[str, str]:
        tags = {k: tag_value(v) for k, v in request.identity.tags().items()}
        tags[names.TAG_GPUS] = f"{request.resources.total_gpus:g}"
        if request.resources.gpu_type:
            tags[names.TAG_PREFIX + "gpu-type"] = request.resources.gpu_type
        return tags

    def create_body(self, request: JobRequest) -> dict[str, Any]:
        """The CreateTrainingJob body of a request."""
        if not self.role_arn:
            raise GpuJobError(
                "the sagemaker backend needs role_arn= (or [gpu_provider] sagemaker_role_arn): the IAM role "
                "SageMaker assumes for the training job"
            )
        if not self.output_path:
            raise GpuJobError(
                "the sagemaker backend needs output_path= (or [gpu_provider] sagemaker_output_path): the s3:// "
                "prefix where SageMaker writes the model artifacts"
            )
        if request.checkpoint_uri and not request.checkpoint_uri.startswith("s3://"):
            raise GpuJobError(
                f"checkpoint URI {request.checkpoint_uri!r}: SageMaker copies checkpoints to and from S3 only; "
                "use an s3:// checkpoint location with the sagemaker backend"
            )
        command = list(request.command)
        if self.secrets:
            command = [*SECRETS_ENTRY, *command]
        if request.resources.nodes > 1 and self.multi_node_entry:
            command = ["/bin/sh", "-c", MULTI_NODE_ENTRY, "gpu-provider-entry", *END_OF_LOG_COMMAND, *command]
        for i, arg in enumerate(command):
            if len(arg) > MAX_ARGUMENT_CHARS:
                raise ValueError(
                    f"command[{i}] is {len(arg)} characters long; SageMaker allows {MAX_ARGUMENT_CHARS} per "
                    "ContainerEntrypoint/ContainerArguments item: move long code into a script in the image"
                )
        algorithm: dict[str, Any] = {
            "TrainingImage": request.image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": command[:1],
        }
        if command[1:]:
            algorithm["ContainerArguments"] = command[1:]
        resources: dict[str, Any] = {
            "InstanceType": (
                mapping.training_instance(request.instance_type)
                if request.instance_type
                else self.instance_type_for(request.resources)
            ),
            "InstanceCount": request.resources.nodes,
            "VolumeSizeInGB": self.volume_size_gb,
        }
        output: dict[str, Any] = {"S3OutputPath": self.output_path}
        if self.kms_key_id:
            output["KmsKeyId"] = self.kms_key_id
            resources["VolumeKmsKeyId"] = self.kms_key_id
        runtime = min(MAX_RUNTIME_S, math.ceil(request.max_runtime_s)) if request.max_runtime_s else MAX_RUNTIME_S
        stopping: dict[str, Any] = {"MaxRuntimeInSeconds": runtime}
        spot = request.capacity == names.SPOT
        if spot:
            wait = request.capacity_wait_s if request.capacity_wait_s is not None else DEFAULT_SPOT_WAIT_S
            stopping["MaxWaitTimeInSeconds"] = runtime + max(1, math.ceil(wait))
        body: dict[str, Any] = {
            "TrainingJobName": request.identity.name,
            "AlgorithmSpecification": algorithm,
            "RoleArn": self.role_arn,
            "OutputDataConfig": output,
            "ResourceConfig": resources,
            "StoppingCondition": stopping,
            "Environment": self.environment(request),
            "EnableNetworkIsolation": False,
            "EnableManagedSpotTraining": spot,
            "Tags": [{"Key": k, "Value": v} for k, v in self.tags(request).items()],
        }
        if request.checkpoint_uri:
            body["CheckpointConfig"] = {"S3Uri": request.checkpoint_uri, "LocalPath": CHECKPOINT_LOCAL_PATH}
        if self.subnets:
            body["VpcConfig"] = {"SecurityGroupIds": list(self.security_group_ids), "Subnets": list(self.subnets)}
        return body

    # --- the contract -------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> JobHandle:
        """CreateTrainingJob; a name already in use (a re-sent or lost-answer submit) adopts that job."""
        self.validate_image(request.image)
        body = self.create_body(request)
        identity = request.identity
        arn = self._send_create(identity, body)
        if arn is None:
            found = self._adopt(identity)
            log.info("SageMaker training job %s exists already for this attempt: adopting it.", identity.name)
            return found
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

    def _send_create(self, identity: JobIdentity, body: dict[str, Any]) -> str | None:
        """CreateTrainingJob, sent again after throttling or a lost answer; ``None`` when the name is in use."""
        client = self._clients.get("sagemaker", automatic_retries=False)
        for attempt in range(1, PATIENT_ATTEMPTS + 1):
            try:
                return str(client.create_training_job(**body)["TrainingJobArn"])
            except Exception as err:
                if error_code(err) == "ResourceInUse":
                    return None  # this name exists: an earlier send created it
                if not may_have_happened(err):
                    raise
                if attempt == PATIENT_ATTEMPTS:
                    if is_throttling(err):
                        raise GpuBackendThrottledError(
                            f"{SERVICE} throttled CreateTrainingJob for {identity.name} {attempt} times in a row"
                        ) from err
                    raise GpuJobError(
                        f"{SERVICE} CreateTrainingJob for {identity.name} failed {attempt} times "
                        f"({type(err).__name__}: {err})"
                    ) from err
                time.sleep(backoff(attempt))
        raise AssertionError("unreachable")

    def _adopt(self, identity: JobIdentity) -> JobHandle:
        job = self._describe_job(identity.name, attempts=PATIENT_ATTEMPTS)
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
        name = str(job["TrainingJobName"])
        match = _JOB_NAME.search(name)
        resources = job.get("ResourceConfig") or {}
        nodes = int(resources.get("InstanceCount") or 1)
        try:
            gpus = float(tags.get(names.TAG_GPUS) or 0)
        except ValueError:
            gpus = 0.0
        return JobHandle(
            backend=self.name,
            job_id=name,
            name=name,
            attempt=int(match.group(2)) if match else int(tags.get(names.TAG_ATTEMPT) or 1),
            capacity=names.SPOT if job.get("EnableManagedSpotTraining") else names.ON_DEMAND,
            submitted_at=mapping.seconds(job.get("CreationTime")) or time.time(),
            extra={
                "region": self.region,
                "job_arn": str(job.get("TrainingJobArn") or ""),
                "gpus": gpus,
                "nodes": nodes,
            },
        )

    def _describe_job(self, name: str, *, attempts: int = POLL_ATTEMPTS) -> dict[str, Any] | None:
        client = self._client()
        try:
            return dict(
                call(
                    "DescribeTrainingJob",
                    lambda: client.describe_training_job(TrainingJobName=name),
                    attempts=attempts,
                    service=SERVICE,
                )
            )
        except Exception as err:
            if _not_found(err):
                return None
            raise

    def _tags(self, job: Mapping[str, Any], *, refresh: bool = False) -> dict[str, str]:
        name = str(job["TrainingJobName"])
        seen = self._seen.get(name)
        if seen is not None and not refresh:
            return seen.tags
        client = self._client()
        arn = str(job["TrainingJobArn"])
        tags: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"ResourceArn": arn, "MaxResults": 100}
            if token:
                kwargs["NextToken"] = token
            page = call("ListTags", lambda kwargs=kwargs: client.list_tags(**kwargs), service=SERVICE)  # type: ignore[misc]
            tags.extend(page.get("Tags") or [])
            token = page.get("NextToken")
            if not token:
                return mapping.tag_map(tags)

    def _list(self, *, name_contains: str, **filters: Any) -> list[dict[str, Any]]:
        """ListTrainingJobs summaries (every page) of jobs whose name contains ``name_contains``."""
        client = self._client()
        summaries: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"NameContains": name_contains, "MaxResults": LIST_PAGE, **filters}
            if token:
                kwargs["NextToken"] = token
            page = call(
                "ListTrainingJobs",
                lambda kwargs=kwargs: client.list_training_jobs(**kwargs),  # type: ignore[misc]
                attempts=POLL_ATTEMPTS,
                service=SERVICE,
            )
            summaries.extend(page.get("TrainingJobSummaries") or [])
            token = page.get("NextToken")
            if not token:
                return summaries

    def _read(self, name: str, *, cached: bool = False) -> tuple[dict[str, Any], dict[str, str]] | None:
        """Describe a job and read its tags.

        :param cached: a poll's read: the tags the cache holds serve while ``TrainingJobStatus`` is
            unchanged, and what was read is kept for the next poll. Otherwise both are read now and
            nothing is kept (lookups, the reaper's listing: no poll evicts what they would leave).
        """
        job = self._describe_job(name)
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
                for s in self._list(name_contains=prefix, LastModifiedTimeAfter=since)
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
                result[name] = self._missing(handle, now)
                continue
            try:
                result[name] = self.status_of(read[0], handle, read[1])
            except ValueError as err:
                result[name] = GpuJobStatusError(f"{SERVICE} training job {name}: {err}")
        return result

    def _missing(self, handle: JobHandle, now: float) -> JobStatus | GpuJobStatusError:
        age = now - handle.submitted_at
        if age < VISIBILITY_GRACE_S:
            return GpuJobStatusError(
                f"{SERVICE} does not describe training job {handle.name} yet, {age:.0f}s after it was submitted; "
                "reading it again on the next poll"
            )
        return JobStatus(
            state=JobState.FAILED,
            reason=(
                f"{SERVICE} no longer knows training job {handle.name} (deleted): how it ended cannot be known. "
                "Treated as lost: the capacity policy decides whether a new attempt runs, resuming from the "
                "latest checkpoint."
            ),
            interruption=names.LOST,
            capacity=handle.capacity,
        )

    def status_of(self, job: Mapping[str, Any], handle: JobHandle, tags: Mapping[str, str]) -> JobStatus:
        """Map one DescribeTrainingJob answer (and the job's tags) onto a :class:`JobStatus`."""
        state = map_state(mapping.STATE_TABLE, mapping.state_key(job), backend=self.name)
        secondary = str(job.get("SecondaryStatus") or "")
        seen = mapping.transitions(job)
        last_message = str(seen[-1].get("StatusMessage") or "") if seen else ""
        failure = str(job.get("FailureReason") or "")
        reason, interruption, code, fault = "", None, None, None
        if state is JobState.FAILED:
            code = mapping.exit_code(failure)
            reason = failure or last_message or "no reason given"
            nodes = int((job.get("ResourceConfig") or {}).get("InstanceCount") or 1)
            interruption = mapping.failure_interruption(failure, nodes=nodes)
            fault = mapping.failure_fault(failure, nodes=nodes) if interruption == names.NODE_FAULT else None
            if fault is not None:
                reason = (
                    f"SageMaker reports a GPU hardware or instance fault ({fault}), not the job's own error: {reason}"
                )
            if interruption == names.CAPACITY_TIMEOUT:
                instance = (job.get("ResourceConfig") or {}).get("InstanceType")
                reason = (
                    f"SageMaker could not provision {handle.capacity} {instance} capacity ({failure}): a capacity "
                    "problem, not the job's own error"
                )
            if secondary == mapping.MAX_RUNTIME_EXCEEDED:
                limit = (job.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
                reason = f"{last_message or secondary}: the job ran past max_runtime (MaxRuntimeInSeconds={limit})"
        elif state is JobState.CANCELLED:
            ours = decode_tag_text(str(tags.get(TAG_STOP_REASON) or ""))
            ours = ours[len(names.CANCEL_PREFIX) :] if ours.startswith(names.CANCEL_PREFIX) else ours
            if secondary == mapping.MAX_WAIT_EXCEEDED:
                wait = (job.get("StoppingCondition") or {}).get("MaxWaitTimeInSeconds")
                reason = (
                    f"SageMaker: {failure or last_message or secondary} (MaxWaitTimeInSeconds={wait}): managed spot "
                    "capacity did not come in time"
                )
                interruption = names.CAPACITY_TIMEOUT
            elif ours:
                reason = ours
                if ours.startswith(names.CAPACITY_TIMEOUT_MARK):
                    interruption = names.CAPACITY_TIMEOUT
                elif ours.startswith(names.RESTART_LIMIT_MARK):
                    interruption = names.PREEMPTED  # restarted too often on spot: the policy's next attempt runs
            else:
                reason = (
                    f"stopped outside Airflow (StopTrainingJob by someone else, e.g. in the console): "
                    f"{last_message or 'no reason given'}"
                )
        elif state is JobState.PREEMPTED:
            reason, interruption = f"SageMaker: {failure or last_message}", names.PREEMPTED
        elif state.active and secondary in mapping._REQUEUE:
            reason = last_message
        restarts = mapping.restarts(job)
        if restarts and state.active and (secondary == mapping.INTERRUPTED or mapping.queued_since(job) is not None):
            words = mapping.interruption_messages(job)[-1] or "spot capacity reclaimed"
            reason = f"managed spot interruption {restarts} (SageMaker restarts the job itself): {words}"
        started = mapping.seconds(job.get("TrainingStartTime"))
        ended = mapping.seconds(job.get("TrainingEndTime")) if state.terminal else None
        gpus = float(handle.extra.get("gpus") or 0) or float(tags.get(names.TAG_GPUS) or 0)
        trained = job.get("TrainingTimeInSeconds")
        if trained:  # whole seconds: a job shorter than one second reads its start and end instead
            gpu_seconds = gpus * float(trained)
        elif started:
            gpu_seconds = gpus * max(0.0, (ended or time.time()) - started)
        else:
            gpu_seconds = 0.0
        billable = job.get("BillableTimeInSeconds")
        owner = str(tags.get(names.TAG_OWNER_TRY) or "")
        output = (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts") if state is JobState.SUCCEEDED else None
        return JobStatus(
            state=state,
            reason=reason,
            exit_code=0 if state is JobState.SUCCEEDED else code,
            started_at=started,
            ended_at=ended,
            gpu_seconds=gpu_seconds,
            output_uri=str(output) if output else None,
            log_url=mapping.logs_console_url(str(handle.extra.get("region") or self.region), handle.name),
            interruption=interruption,
            fault=fault,
            restarts=restarts,
            queued_since=mapping.queued_since(job) if state is JobState.QUEUED else None,
            billable_seconds=float(billable) if billable is not None else None,
            training_seconds=float(trained) if trained is not None else None,
            instance_type=str((job.get("ResourceConfig") or {}).get("InstanceType") or "") or None,
            capacity=names.SPOT if job.get("EnableManagedSpotTraining") else names.ON_DEMAND,
            owner_try=int(owner) if owner.isdigit() else None,
            collected=str(tags.get(names.TAG_COLLECTED) or "").lower() == "true",
        )

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """ListTags on the job now (DescribeTrainingJob first when the handle lacks its ARN); never the
        tags :meth:`poll` keeps, which stay as they were while ``TrainingJobStatus`` does not change."""
        arn = str(handle.extra.get("job_arn") or "")
        if not arn:
            job = self._describe_job(handle.job_id, attempts=PATIENT_ATTEMPTS)
            if job is None:
                return OwnerRead(owner_try=None, exists=False)
            arn = str(job["TrainingJobArn"])
        try:
            tags = self._tags({"TrainingJobName": handle.job_id, "TrainingJobArn": arn}, refresh=True)
        except Exception as err:
            if _not_found(err):
                return OwnerRead(owner_try=None, exists=False)
            raise
        self._seen.set_tags(handle.job_id, tags)  # what was read fresh serves the next poll too
        owner = str(tags.get(names.TAG_OWNER_TRY) or tags.get(names.TAG_TRY_NUMBER) or "")
        return OwnerRead(owner_try=int(owner) if owner.isdigit() else None)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Tag the job with the reason, then StopTrainingJob; from a SIGTERM handler too (bounded wait)."""
        run_bounded(f"StopTrainingJob {handle.job_id}", lambda: self._stop(handle, reason))

    def _stop(self, handle: JobHandle, reason: str) -> None:
        client = self._client()
        arn = str(handle.extra.get("job_arn") or "") or self._job_arn(handle)
        text = encode_tag_text(names.CANCEL_PREFIX + reason)
        call(
            "AddTags",
            lambda: client.add_tags(ResourceArn=arn, Tags=[{"Key": TAG_STOP_REASON, "Value": text}]),
            service=SERVICE,
        )
        try:
            call("StopTrainingJob", lambda: client.stop_training_job(TrainingJobName=handle.job_id), service=SERVICE)
        except Exception as err:
            if error_code(err) != "ValidationException":
                raise
            job = self._describe_job(handle.job_id, attempts=PATIENT_ATTEMPTS)
            if job is not None and job.get("TrainingJobStatus") == "InProgress":
                raise
            # stopping or ended already (StopTrainingJob refuses a job that is not InProgress): nothing to do

    def _job_arn(self, handle: JobHandle) -> str:
        job = self._describe_job(handle.job_id, attempts=PATIENT_ATTEMPTS)
        if job is None:
            raise GpuJobError(f"{SERVICE} no longer knows training job {handle.job_id}: it cannot be tagged or stopped")
        return str(job["TrainingJobArn"])

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Tag the job (AddTags): the try that owns it, or that its outcome was collected."""
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
        client = self._client()
        call(
            "AddTags",
            lambda: client.add_tags(ResourceArn=arn, Tags=[{"Key": k, "Value": v} for k, v in tags.items()]),
            service=SERVICE,
        )
        seen = self._seen.get(handle.job_id)
        if seen is not None:  # the next poll reports the mark without reading the tags again
            self._seen.set_tags(handle.job_id, {**seen.tags, **tags})

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance: ListTrainingJobs by the name prefix, tags checked."""
        handles = []
        for summary in self._list(name_contains=f"{task.prefix}-t"):
            name = str(summary.get("TrainingJobName") or "")
            match = _JOB_NAME.search(name)
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
        for status in ("InProgress", "Stopping"):
            for summary in self._list(name_contains="gp-", StatusEquals=status):
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
                resources = job.get("ResourceConfig") or {}
                nodes = int(resources.get("InstanceCount") or 1)
                owner = str(tags.get(names.TAG_OWNER_TRY) or tags.get(names.TAG_TRY_NUMBER) or "")
                total = float(handle.extra.get("gpus") or 0)
                owned.append(
                    OwnedJob(
                        handle=handle,
                        task=task_from_tags(tags),
                        state=state,
                        try_number=int(owner) if owner.isdigit() else None,
                        team=tags.get(names.TAG_TEAM) or None,
                        started_at=mapping.seconds(job.get("TrainingStartTime")),
                        instance_type=str(resources.get("InstanceType") or "") or None,
                        nodes=nodes,
                        gpus=total / nodes if nodes else total,
                        max_runtime_s=(job.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds"),
                        # managed spot: MaxRuntime counts training time only, MaxWait the wall time since creation
                        max_wait_s=(job.get("StoppingCondition") or {}).get("MaxWaitTimeInSeconds"),
                        training_seconds=mapping.training_seconds(job, time.time()),
                    )
                )
        return owned

    # --- logs and links ---------------------------------------------------------------------------

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Every host's CloudWatch stream (``<job>/algo-<n>-<epoch>``), each line prefixed with its host."""
        state = LogCursor.load(cursor)
        client = self._client("logs")
        streams = self._host_streams(handle)
        if not streams:
            return LogChunk(lines=[], cursor=cursor, more=False)

        def get_page(kwargs: dict[str, Any]) -> dict[str, Any]:
            try:
                return call(
                    "GetLogEvents",
                    lambda: client.get_log_events(**kwargs),
                    attempts=POLL_ATTEMPTS,
                    service="CloudWatch Logs",
                )
            except Exception as err:
                if error_code(err) == "ResourceNotFoundException":
                    raise StreamNotFoundError(str(kwargs["logStreamName"])) from err
                raise

        lines, more = read_streams(get_page, LOG_GROUP, streams, state, max_bytes)
        return log_chunk(lines, state, more)

    def _host_streams(self, handle: JobHandle) -> list[tuple[str, str]]:
        """The job's CloudWatch streams as ``(prefix, stream)``, in the order they began (a restart inside
        the job adds new streams), host order within one run; ``[]`` before the log group exists."""
        client = self._client("logs")
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{handle.job_id}/"}
            if token:
                kwargs["nextToken"] = token
            try:
                page = call(
                    "DescribeLogStreams",
                    lambda kwargs=kwargs: client.describe_log_streams(**kwargs),  # type: ignore[misc]
                    attempts=POLL_ATTEMPTS,
                    service="CloudWatch Logs",
                )
            except Exception as err:
                if error_code(err) == "ResourceNotFoundException":
                    return []  # no log group yet
                raise
            found.extend(page.get("logStreams") or [])
            token = page.get("nextToken")
            if not token:
                break
        found.sort(key=lambda s: (int(s.get("creationTime") or 0), str(s.get("logStreamName"))))
        streams = []
        for stream in found:
            stream_name = str(stream["logStreamName"])
            host = stream_name[len(handle.job_id) + 1 :].rpartition("-")[0] or stream_name
            streams.append((f"[{host}] ", stream_name))
        return streams

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` log lines of the attempt: one GetLogEvents from the end of each of the
        last :data:`TAIL_STREAMS` host streams (those of its last run), merged by time."""
        if lines <= 0:
            return []
        client = self._client("logs")
        events: list[tuple[int, int, str]] = []
        for label, stream in self._host_streams(handle)[-TAIL_STREAMS:]:
            try:
                page = call(
                    "GetLogEvents",
                    lambda stream=stream: client.get_log_events(  # type: ignore[misc]
                        logGroupName=LOG_GROUP, logStreamName=stream, startFromHead=False, limit=lines
                    ),
                    attempts=POLL_ATTEMPTS,
                    service="CloudWatch Logs",
                )
            except Exception as err:
                if error_code(err) == "ResourceNotFoundException":
                    continue
                raise
            for event in page.get("events") or []:
                message = clip_line(str(event.get("message", "")).rstrip("\n"))
                events.append((int(event.get("timestamp") or 0), len(events), label + message))
        events.sort()
        return [line for _, _, line in events[-lines:]]

    def event_source(self) -> EventSource | None:
        """EventBridge state-change events from the SQS queue of ``[gpu_provider] sagemaker_events_queue_url``, if set
        (:mod:`gpu_provider.backends.aws.events`)."""
        from gpu_provider.backends.aws.events import queue_events

        return queue_events("sagemaker_events_queue_url", self._clients)

    def console_url(self, handle: JobHandle) -> str | None:
        return mapping.console_url(str(handle.extra.get("region") or self.region), handle.name)

    def logs_url(self, handle: JobHandle) -> str | None:
        return mapping.logs_console_url(str(handle.extra.get("region") or self.region), handle.name)


def _common_prefix(job_names: Sequence[str]) -> str:
    """The longest prefix all names share (``NameContains`` of one ListTrainingJobs for all of them)."""
    first, last = min(job_names), max(job_names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size] or "gp-"
