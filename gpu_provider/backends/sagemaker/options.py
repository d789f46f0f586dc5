"""The SageMaker backend's options: each read from its argument or its ``[gpu_provider]`` key, and checked.

Each function takes what the DAG gave (``None`` or ``""`` where it gave nothing) and returns the value
the backend keeps, or raises :class:`ValueError` naming the option, the value and what it may be.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpu_provider.backends.base import provider_config
from gpu_provider.backends.common import list_option, text_option
from gpu_provider.backends.sagemaker import mapping
from gpu_provider.backends.sagemaker.cache import FULL_DESCRIBE_EVERY

DEFAULT_VOLUME_GB = 100
DEFAULT_MASTER_PORT = 29500

_S3_PATH = re.compile(r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
_GROUP = re.compile(r"^sg-[0-9a-z]+$")
_SUBNET = re.compile(r"^subnet-[0-9a-z]+$")


def role_arn_option(value: str | None) -> str | None:
    """The IAM role the job runs as [``sagemaker_role_arn``]; an IAM role ARN when set."""
    role_arn = text_option("role_arn", value, config_key="sagemaker_role_arn")
    if role_arn and not _ROLE_ARN.fullmatch(role_arn):
        raise ValueError(f"role_arn={role_arn!r} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
    return role_arn


def output_path_option(value: str | None) -> str | None:
    """The S3 prefix of the model artifacts [``sagemaker_output_path``]; an ``s3://`` URI when set."""
    output_path = text_option("output_path", value, config_key="sagemaker_output_path")
    if output_path and not _S3_PATH.fullmatch(output_path):
        raise ValueError(f"output_path={output_path!r} must be an s3://bucket/prefix URI")
    return output_path


def vpc_options(
    subnets: Sequence[str] | str | None, security_group_ids: Sequence[str] | str | None
) -> tuple[list[str], list[str]]:
    """The job's VPC subnets and security groups [``sagemaker_subnets``, ``sagemaker_security_group_ids``]:
    both or neither."""
    subnet_ids = list_option("subnets", subnets, config_key="sagemaker_subnets", pattern=_SUBNET, what="subnet ids")
    group_ids = list_option(
        "security_group_ids",
        security_group_ids,
        config_key="sagemaker_security_group_ids",
        pattern=_GROUP,
        what="security group ids",
    )
    if bool(subnet_ids) != bool(group_ids):
        raise ValueError(
            f"subnets={subnet_ids!r} and security_group_ids={group_ids!r}: a job in a VPC "
            "needs both (VpcConfig), or give neither"
        )
    return subnet_ids, group_ids


def volume_size_option(volume_size_gb: int | str | None) -> int:
    """The storage volume per instance in GB [``sagemaker_volume_size_gb``], 1 to 16384 (default 100)."""
    volume = volume_size_gb if volume_size_gb not in (None, "") else provider_config("sagemaker_volume_size_gb")
    try:
        size = int(str(volume).strip()) if volume not in (None, "") else DEFAULT_VOLUME_GB
    except ValueError:
        size = -1
    if not 1 <= size <= 16384:
        raise ValueError(f"volume_size_gb={volume!r} must be a whole number of GB from 1 to 16384")
    return size


def instance_type_option(value: str | None) -> str | None:
    """The default training instance [``sagemaker_instance_type``], ``ml.`` added where missing."""
    chosen = text_option("instance_type", value, config_key="sagemaker_instance_type")
    return mapping.training_instance(chosen) if chosen else None


def full_describe_every_option(full_describe_every: int | str | None) -> int:
    """Poll ticks between full describes of a running managed-spot job [``sagemaker_full_describe_every``]."""
    every: Any = full_describe_every
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
    return ticks
