"""The CreateTrainingJob body of an attempt: command, instances, stopping condition, environment and tags.

Spot attempts use managed spot training (``EnableManagedSpotTraining``, ``MaxWaitTimeInSeconds`` = max
runtime + the policy's spot wait) with ``CheckpointConfig``: SageMaker copies ``/opt/ml/checkpoints`` to
and from the task's checkpoint URI on S3, so the job reads and writes checkpoints as local files.
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from gpu_provider import names
from gpu_provider.backends.base import JobRequest
from gpu_provider.backends.common import END_OF_LOG_COMMAND
from gpu_provider.backends.sagemaker import mapping
from gpu_provider.backends.sagemaker.ownership import tag_value
from gpu_provider.exceptions import GpuJobError

#: where SageMaker mirrors CheckpointConfig.S3Uri inside the container
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
#: where the container finds SageMaker's resourceconfig.json (hosts of the job)
INPUT_CONFIG_DIR = "/opt/ml/input/config"
#: MaxRuntimeInSeconds of a job without max_runtime: SageMaker's longest (28 days)
MAX_RUNTIME_S = 28 * 24 * 3600
#: how long a spot attempt may wait for capacity when the policy waits forever
DEFAULT_SPOT_WAIT_S = 7 * 24 * 3600
#: SageMaker's limits on a request (CreateTrainingJob)
MAX_ARGUMENT_CHARS = 256
MAX_ENV_VALUE_CHARS = 512
MAX_ENV_ENTRIES = 100

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


class RequestOptions(Protocol):
    """The backend's options a request is built from (:class:`~gpu_provider.backends.sagemaker.SageMakerBackend`)."""

    role_arn: str | None
    output_path: str | None
    subnets: list[str]
    security_group_ids: list[str]
    volume_size_gb: int
    instance_type: str | None
    kms_key_id: str | None
    secrets: dict[str, str]
    master_port: int
    multi_node_entry: bool


def environment(options: RequestOptions, request: JobRequest) -> dict[str, str]:
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
    env["MASTER_PORT"] = str(options.master_port)
    env["SM_INPUT_CONFIG_DIR"] = INPUT_CONFIG_DIR
    if options.secrets:  # references only: the entry resolves them in the job (SECRETS_ENTRY)
        env[names.ENV_SECRET_REFS] = json.dumps(options.secrets, separators=(",", ":"), sort_keys=True)
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


def tags(request: JobRequest) -> dict[str, str]:
    """The job's tags: the attempt's identity, its GPUs and GPU type."""
    job_tags = {k: tag_value(v) for k, v in request.identity.tags().items()}
    job_tags[names.TAG_GPUS] = f"{request.resources.total_gpus:g}"
    if request.resources.gpu_type:
        job_tags[names.TAG_PREFIX + "gpu-type"] = request.resources.gpu_type
    return job_tags


def create_body(options: RequestOptions, request: JobRequest) -> dict[str, Any]:
    """The CreateTrainingJob body of a request."""
    if not options.role_arn:
        raise GpuJobError(
            "the sagemaker backend needs role_arn= (or [gpu_provider] sagemaker_role_arn): the IAM role "
            "SageMaker assumes for the training job"
        )
    if not options.output_path:
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
    if options.secrets:
        command = [*SECRETS_ENTRY, *command]
    if request.resources.nodes > 1 and options.multi_node_entry:
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
            else mapping.training_instance_for(request.resources, options.instance_type)
        ),
        "InstanceCount": request.resources.nodes,
        "VolumeSizeInGB": options.volume_size_gb,
    }
    output: dict[str, Any] = {"S3OutputPath": options.output_path}
    if options.kms_key_id:
        output["KmsKeyId"] = options.kms_key_id
        resources["VolumeKmsKeyId"] = options.kms_key_id
    runtime = min(MAX_RUNTIME_S, math.ceil(request.max_runtime_s)) if request.max_runtime_s else MAX_RUNTIME_S
    stopping: dict[str, Any] = {"MaxRuntimeInSeconds": runtime}
    spot = request.capacity == names.SPOT
    if spot:
        wait = request.capacity_wait_s if request.capacity_wait_s is not None else DEFAULT_SPOT_WAIT_S
        stopping["MaxWaitTimeInSeconds"] = runtime + max(1, math.ceil(wait))
    body: dict[str, Any] = {
        "TrainingJobName": request.identity.name,
        "AlgorithmSpecification": algorithm,
        "RoleArn": options.role_arn,
        "OutputDataConfig": output,
        "ResourceConfig": resources,
        "StoppingCondition": stopping,
        "Environment": environment(options, request),
        "EnableNetworkIsolation": False,
        "EnableManagedSpotTraining": spot,
        "Tags": [{"Key": k, "Value": v} for k, v in tags(request).items()],
    }
    if request.checkpoint_uri:
        body["CheckpointConfig"] = {"S3Uri": request.checkpoint_uri, "LocalPath": CHECKPOINT_LOCAL_PATH}
    if options.subnets:
        body["VpcConfig"] = {"SecurityGroupIds": list(options.security_group_ids), "Subnets": list(options.subnets)}
    return body
