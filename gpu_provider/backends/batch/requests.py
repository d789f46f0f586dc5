"""What the Batch backend sends for a request: its job definition (RegisterJobDefinition: image, command,
GPU/VCPU/MEMORY, roles, secrets) and the SubmitJob body of an attempt (queue, per-attempt environment,
tags, timeout, fair-share fields).

The definition is named by a hash of its body, so an unchanged task reuses revision 1 and a changed one
gets a new definition; what changes per attempt travels as submit-time overrides.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Protocol

from gpu_provider import names
from gpu_provider.backends.base import JobRequest, _slug
from gpu_provider.backends.common import END_OF_LOG_COMMAND

#: Batch's smallest attempt timeout
MIN_ATTEMPT_SECONDS = 60
#: defaults when a job does not say: vCPUs and MiB of memory per GPU (fit a g4dn/g5/g6 .xlarge)
DEFAULT_VCPUS_PER_GPU = 3
DEFAULT_MEMORY_MIB_PER_GPU = 12 * 1024
DEFAULT_LOG_GROUP = "/aws/batch/job"

#: the multi-node entry wrapper: POSIX sh only, so it works in any image with /bin/sh. It derives
#: NODE_RANK and MASTER_ADDR from Batch's variables (the main node, which Batch does not tell its
#: own address, uses loopback: its rendezvous store listens on every interface), then execs the command
#: through the end-of-log entry (``END_OF_LOG_COMMAND``), which marks where each node's log ends.
MULTI_NODE_ENTRY = (
    'export NODE_RANK="${AWS_BATCH_JOB_NODE_INDEX:-0}"; '
    'export MASTER_ADDR="${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-127.0.0.1}"; '
    'exec "$@"'
)

_SHARE_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class DefinitionOptions(Protocol):
    """The backend's options a job definition is made of (:class:`~gpu_provider.backends.batch.BatchBackend`)."""

    @property
    def multi_node_entry(self) -> bool: ...
    @property
    def job_role_arn(self) -> str | None: ...
    @property
    def execution_role_arn(self) -> str | None: ...
    @property
    def secrets(self) -> Mapping[str, str]: ...
    @property
    def log_group(self) -> str: ...


def job_definition(options: DefinitionOptions, request: JobRequest) -> dict[str, Any]:
    """The RegisterJobDefinition body of a request (named by a hash of its content)."""
    res = request.resources
    gpus = math.ceil(res.gpus)
    vcpus = res.cpu if res.cpu is not None else DEFAULT_VCPUS_PER_GPU * gpus
    memory = res.memory_mib if res.memory_mib is not None else DEFAULT_MEMORY_MIB_PER_GPU * gpus
    command = list(request.command)
    if res.nodes > 1 and options.multi_node_entry:
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
    if options.job_role_arn:
        container["jobRoleArn"] = options.job_role_arn
    if options.execution_role_arn:
        container["executionRoleArn"] = options.execution_role_arn
    if options.secrets:
        container["secrets"] = [{"name": k, "valueFrom": v} for k, v in sorted(options.secrets.items())]
    if options.log_group != DEFAULT_LOG_GROUP:
        container["logConfiguration"] = {"logDriver": "awslogs", "options": {"awslogs-group": options.log_group}}
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


def submit_body(
    request: JobRequest,
    *,
    queue: str,
    definition_arn: str,
    master_port: int,
    share_identifier: str | None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The SubmitJob body of an attempt on ``queue``.

    :param share_identifier: the job's fair-share identifier when ``queue`` has a scheduling policy
        (Batch then requires it and a scheduling priority), ``None`` when it has none (Batch rejects it)
    :param priority: the task's scheduling priority (on a fair-share queue; default the lowest, 0)
    """
    identity = request.identity
    env = dict(request.env)
    env["NNODES"] = str(request.resources.nodes)
    env["MASTER_PORT"] = str(master_port)
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
    if share_identifier is not None:
        # a fair-share queue needs a scheduling priority on every job: the task's, else the lowest
        body["shareIdentifier"] = share_identifier
        body["schedulingPriorityOverride"] = priority if priority is not None else 0
    return body


def share_for(team: str | None, *, default: str, by_team: Mapping[str, str]) -> str:
    """The fair-share identifier of a team's jobs: ``by_team``'s, else the team's name made an identifier;
    ``default`` for a task without a team."""
    if not team:
        return default
    # Batch share identifiers allow letters, digits and underscores: team "ml-infra" -> "ml_infra"
    return by_team.get(team) or _SHARE_UNSAFE.sub("_", team)
