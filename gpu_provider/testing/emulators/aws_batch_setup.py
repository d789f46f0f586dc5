"""The AWS Batch emulator's environment: the IAM, VPC, compute environments and job queues the provider's
Batch backend uses (:class:`BatchEnvironment`, a mixin of the emulator)."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any

logger = logging.getLogger("gpu_provider.testing.emulators.aws_batch")

SPOT_QUEUE = "gpu-spot"
ON_DEMAND_QUEUE = "gpu-on-demand"
FAIR_SHARE_QUEUE = "gpu-fair-share"


@dataclasses.dataclass(frozen=True)
class BatchSetup:
    """What :meth:`BatchEmulator.create_environment` created (queue and compute environment names)."""

    spot_queue: str
    on_demand_queue: str
    fair_share_queue: str | None
    scheduling_policy_arn: str | None
    spot_compute_environment: str
    on_demand_compute_environment: str


def _queue_name(queue: str) -> str:
    return queue.split(":job-queue/", 1)[1] if ":job-queue/" in queue else queue


def _create_queue(batch: Any, name: str, compute_environment: str, policy_arn: str | None = None) -> None:
    batch.create_job_queue(
        jobQueueName=name,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": compute_environment}],
        **({"schedulingPolicyArn": policy_arn} if policy_arn else {}),
    )


class BatchEnvironment:
    """Creates (and finds again) the queues and compute environments of :class:`BatchSetup` (a mixin over the
    emulator's ``client``, ``_lock`` and ``_setup``)."""

    _lock: threading.RLock
    _setup: BatchSetup | None
    client: Any  # the emulator's boto3 client maker

    def create_environment(self, *, fair_share: bool = True) -> BatchSetup:
        """Create the IAM, VPC, compute environments and job queues the provider's Batch backend uses.

        Queues ``gpu-spot`` (SPOT compute environment) and ``gpu-on-demand`` (EC2), without scheduling
        policy, and, with ``fair_share``, ``gpu-fair-share`` (EC2) with a fair-share scheduling policy.
        Calling it again returns what exists, adding the fair-share queue if it is asked for now, and
        creates it all again if moto's state was reset under the emulator (``moto.mock_aws`` in the same
        process does that).
        """
        batch = self.client("batch")
        with self._lock:
            setup = self._setup
        if setup is not None and not batch.describe_job_queues(jobQueues=[setup.spot_queue])["jobQueues"]:
            logger.warning("the emulator's queues are gone (moto was reset in this process): creating them again")
            setup = None
        if setup is None:
            setup = self._create_base_environment(batch)
        if fair_share and setup.fair_share_queue is None:
            policy_arn = batch.create_scheduling_policy(
                name="gpu-fair-share",
                fairsharePolicy={
                    "shareDecaySeconds": 3600,
                    "computeReservation": 0,
                    "shareDistribution": [{"shareIdentifier": "default", "weightFactor": 1.0}],
                },
            )["arn"]
            _create_queue(batch, FAIR_SHARE_QUEUE, setup.on_demand_compute_environment, policy_arn)
            setup = dataclasses.replace(setup, fair_share_queue=FAIR_SHARE_QUEUE, scheduling_policy_arn=policy_arn)
        with self._lock:
            self._setup = setup
        return setup

    def _create_base_environment(self, batch: Any) -> BatchSetup:
        iam, ec2 = self.client("iam"), self.client("ec2")
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "batch.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
        role = iam.create_role(RoleName="gpu-batch-service-role", AssumeRolePolicyDocument=json.dumps(trust))
        profile = iam.create_instance_profile(InstanceProfileName="gpu-batch-instance-profile")
        iam.add_role_to_instance_profile(
            InstanceProfileName="gpu-batch-instance-profile", RoleName="gpu-batch-service-role"
        )
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="gpu-batch", Description="GPU Batch jobs", VpcId=vpc)["GroupId"]

        def compute_environment(name: str, kind: str, allocation: str) -> None:
            batch.create_compute_environment(
                computeEnvironmentName=name,
                type="MANAGED",
                state="ENABLED",
                serviceRole=role["Role"]["Arn"],
                computeResources={
                    "type": kind,
                    "allocationStrategy": allocation,
                    "minvCpus": 0,  # keeps moto from launching fake EC2 instances
                    "desiredvCpus": 0,
                    "maxvCpus": 256,
                    "instanceTypes": ["g5.xlarge", "g5.12xlarge"],
                    "subnets": [subnet],
                    "securityGroupIds": [group],
                    "instanceRole": profile["InstanceProfile"]["Arn"],
                },
            )

        compute_environment("gpu-spot-ce", "SPOT", "SPOT_PRICE_CAPACITY_OPTIMIZED")
        compute_environment("gpu-on-demand-ce", "EC2", "BEST_FIT_PROGRESSIVE")
        _create_queue(batch, SPOT_QUEUE, "gpu-spot-ce")
        _create_queue(batch, ON_DEMAND_QUEUE, "gpu-on-demand-ce")
        return BatchSetup(
            spot_queue=SPOT_QUEUE,
            on_demand_queue=ON_DEMAND_QUEUE,
            fair_share_queue=None,
            scheduling_policy_arn=None,
            spot_compute_environment="gpu-spot-ce",
            on_demand_compute_environment="gpu-on-demand-ce",
        )

    def create_queue(self, name: str, capacity: str = "on-demand") -> str:
        """A job queue ``name`` on the spot or on-demand compute environment of :meth:`create_environment`
        (e.g. one queue per instance type, for ``queues_by_instance_type``); an existing one is kept."""
        setup = self.create_environment(fair_share=False)
        batch = self.client("batch")
        if not batch.describe_job_queues(jobQueues=[name])["jobQueues"]:
            env = setup.spot_compute_environment if capacity == "spot" else setup.on_demand_compute_environment
            _create_queue(batch, name, env)
        return name
