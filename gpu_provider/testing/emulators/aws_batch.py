"""A local AWS Batch: moto in server mode, with each job's container command run as a local process.

What it adds to moto (moto 5.2.5; everything is undone by :meth:`BatchEmulator.stop`):

* **Jobs are real processes.** moto's ``Job.run`` (which would start a Docker container) is replaced:
  the job's command (job definition command, submit-time overrides and ``Ref::`` parameters applied)
  runs with :func:`subprocess.Popen` in its own session, in ``job_cwd``. The image is ignored.
  States advance SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING about ``step_seconds`` apart,
  then SUCCEEDED (exit 0) or FAILED (``statusReason`` "Essential container in task exited",
  ``container.exitCode`` set, ``128 + signal`` for a process killed by a signal).
* **Environment** of a job process: a minimal base (``PATH`` with this interpreter's directory first,
  so ``python`` is the emulator's Python; ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR``, ``PYTHONPATH`` if
  set; ``PYTHONUNBUFFERED=1``, as most Python images set), then, if ``job_aws_env``, what the job's
  task role and region would give it (``AWS_ENDPOINT_URL`` = this emulator, dummy credentials,
  ``AWS_REGION``/``AWS_DEFAULT_REGION``), then the job definition's environment, the submit-time
  overrides, and Batch's own variables (``AWS_BATCH_JOB_ID``, ``AWS_BATCH_JQ_NAME``,
  ``AWS_BATCH_CE_NAME``, ``AWS_BATCH_JOB_ATTEMPT=1``, ``AWS_BATCH_JOB_ARRAY_INDEX`` for array children).
* **Logs** go to moto's CloudWatch Logs, group ``/aws/batch/job``, one stream per container named like
  Batch's ``<jobDefinitionName>/default/<ecs task id>``, line by line while the job runs. The stream is
  ``container.logStreamName`` and ``attempts[-1].container.logStreamName`` of DescribeJobs.
* **Multi-node parallel jobs** run ``numNodes`` processes (``nodeOverrides`` applied, which moto ignores),
  with ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` and,
  on the other nodes only, ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=127.0.0.1``; each node's
  ``AWS_BATCH_JOB_ID`` is ``<jobId>#<node>``. The main node's exit decides the job; when it exits the
  other nodes are stopped (SIGTERM, SIGKILL after ``grace_period``). Each node has its own log stream:
  DescribeJobs on ``<jobId>#<node>`` (and ListJobs ``multiNodeJobId``) shows it; the parent job's
  ``container.logStreamName`` and attempt show the main node's stream.
* **TerminateJob** (any state) and **CancelJob** (SUBMITTED, PENDING, RUNNABLE only, as in real Batch;
  a no-op later) fail the job with the given reason; running processes get SIGTERM to their process
  groups, SIGKILL after ``grace_period``. ``timeout.attemptDurationSeconds`` is enforced the same way.
* **Fault injection:** :meth:`~BatchEmulator.hold` / :meth:`~BatchEmulator.release` (no capacity),
  :meth:`~BatchEmulator.preempt` / :meth:`~BatchEmulator.preempt_after` (spot reclaim: FAILED with
  "Host EC2 (instance i-...) terminated."), :meth:`~BatchEmulator.throttle` and
  :meth:`~BatchEmulator.throttle_bursts` (HTTP 429 ``TooManyRequestsException``, as Batch throttles; any
  action, or ``"*"``), :meth:`~BatchEmulator.lose_response` (the request is carried out, then answered
  with HTTP 500 or a closed connection), :meth:`~BatchEmulator.forget` (a job Batch no
  longer returns), :meth:`~BatchEmulator.report_status` (DescribeJobs answers a state of your choice),
  :meth:`~BatchEmulator.set_status_reason` and ``hold(queue, reason=...)`` (the ``statusReason`` of a
  RUNNABLE job: ``CAPACITY:...``, ``MISCONFIGURATION:...``).
* **Request log:** every Batch and CloudWatch Logs request, parsed, see :meth:`~BatchEmulator.requests`.
* **Real-Batch rules moto does not enforce** are answered with ``ClientException`` (HTTP 400): more than
  100 ids in DescribeJobs; SubmitJob to a fair-share queue without ``shareIdentifier`` or without a
  scheduling priority (job definition ``schedulingPriority`` or ``schedulingPriorityOverride``);
  ``shareIdentifier``/``schedulingPriorityOverride`` on a queue without a scheduling policy; more than one
  ListJobs filter. ListJobs without ``jobStatus`` or filters returns RUNNING jobs only, filtered
  results come newest first and leave out array children (moto: every status, queue order).

The job runner (states, processes, logs, multi-node views) is :mod:`gpu_provider.testing.emulators.aws_batch_jobs`; the
server, the request log and the faults are the shared :mod:`gpu_provider.testing.emulators.core`.

Command line, for ``make demo``::

    python -m gpu_provider.testing.emulators.aws_batch serve --port 0 --job-cwd DIR --ready-file PATH [--fair-share]
        [--preempt-after SECONDS --preempt-queue gpu-spot --preempt-name-contains train --preempt-count 1]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
import botocore.session
from moto.batch import models as batch_models
from moto.batch.exceptions import ClientException
from moto.moto_api import state_manager

from gpu_provider.testing.emulators.aws_batch_jobs import (
    DUMMY_CREDENTIALS,
    JobRun,
    JobRunner,
    env_dict,
    job_state,
    kill_group,
)
from gpu_provider.testing.emulators.core import (
    SERVER_ERROR,
    THROTTLED,
    Faults,
    Middleware,
    Patches,
    RecordingMotoServer,
    RequestLog,
    current_body,
)

logger = logging.getLogger(__name__)

MAX_DESCRIBE_JOBS = 100

SPOT_QUEUE = "gpu-spot"
ON_DEMAND_QUEUE = "gpu-on-demand"
FAIR_SHARE_QUEUE = "gpu-fair-share"

_EPOCH = datetime(1970, 1, 1)  # moto's "not started / not stopped" timestamp
_BATCH_STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
#: moto must never advance a job's state by itself (on reads): the emulator's job thread sets every state.
_NO_AUTOMATIC_PROGRESS = {"progression": "manual", "times": 10**9}

_active_lock = threading.Lock()
_active: BatchEmulator | None = None


@dataclasses.dataclass(frozen=True)
class BatchSetup:
    """What :meth:`BatchEmulator.create_environment` created (queue and compute environment names)."""

    spot_queue: str
    on_demand_queue: str
    fair_share_queue: str | None
    scheduling_policy_arn: str | None
    spot_compute_environment: str
    on_demand_compute_environment: str


@dataclasses.dataclass
class _PreemptRule:
    seconds: float
    queue: str
    remaining: int
    name_contains: str | None


def _error_style(action: str, kind: str) -> tuple[int, str, str]:
    """How Batch (restJson) and CloudWatch Logs (awsJson) word a throttled request and a server error."""
    logs = action.startswith("logs:")
    if kind == THROTTLED:
        if logs:
            return 400, "ThrottlingException", "Rate exceeded"
        return 429, "TooManyRequestsException", "Too Many Requests."
    if kind == SERVER_ERROR:
        return 500, "ServiceUnavailableException" if logs else "ServerException", "Internal error"
    raise ValueError(f"unknown error kind {kind!r}")


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


class BatchEmulator(JobRunner):
    """AWS Batch on moto in server mode, running each job's command as a local process.

    :param port: TCP port on 127.0.0.1; 0 picks a free one (see :attr:`endpoint_url`).
    :param job_cwd: working directory of job processes (default: the current directory at start).
    :param step_seconds: time between two state changes of a job (SUBMITTED ... RUNNING).
    :param grace_period: seconds between SIGTERM and SIGKILL when a job is terminated or preempted.
    :param region: the region jobs and resources live in.
    :param job_aws_env: give job processes ``AWS_ENDPOINT_URL`` (this emulator), dummy credentials and
        the region, as a task role would give a real container access to AWS.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        job_cwd: str | os.PathLike[str] | None = None,
        step_seconds: float = 0.5,
        grace_period: float = 5.0,
        region: str = "us-east-1",
        job_aws_env: bool = True,
    ) -> None:
        self.port = port
        self.job_cwd = Path(job_cwd) if job_cwd is not None else None
        self.step_seconds = step_seconds
        self.grace_period = grace_period
        self.region = region
        self.job_aws_env = job_aws_env
        self.endpoint_url = ""
        self._server: RecordingMotoServer | None = None
        self._patches = Patches()
        self._runs: dict[str, JobRun] = {}
        self._held: set[str] = set()
        self._held_reasons: dict[str, str] = {}  # queue -> statusReason of its RUNNABLE jobs
        self._preempt_rules: list[_PreemptRule] = []
        self._faults = Faults()
        self._reported_status: dict[str, str] = {}  # job id -> the status DescribeJobs answers instead
        self._log = RequestLog()
        self._lock = threading.RLock()
        self._logs_lock = threading.Lock()
        self._images_seen: set[str] = set()
        self._routes: list[tuple[str, re.Pattern[str], str]] = []
        self._saved_transition: dict[str, Any] | None = None
        self._setup: BatchSetup | None = None

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    def running() -> BatchEmulator | None:
        """The emulator started in this process, if any (only one can run at a time: moto's state is global)."""
        return _active

    def start(self) -> BatchEmulator:
        """Start the server on 127.0.0.1 and patch moto; returns ``self``."""
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError(
                    f"another BatchEmulator is running at {_active.endpoint_url}: moto's state and the patches "
                    "are per process, so only one can run at a time; stop it, or use BatchEmulator.running()"
                )
            _active = self
        with self._lock:
            self._runs.clear()
        try:
            self._routes = _batch_routes()
            self._install_patches()
            self._server = RecordingMotoServer(
                self.port,
                lambda app: Middleware(
                    app, action_of=self._action_of, error_style=_error_style, faults=self._faults, log=self._log
                ),
            )
            self._server.start()
            host, port = self._server.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
            self._reset_moto()  # a fresh account: nothing left from an earlier server in this process
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        logger.info("AWS Batch emulator listening on %s (region %s)", self.endpoint_url, self.region)
        return self

    def stop(self) -> None:
        """Kill every job process, stop the server and undo the patches. Idempotent."""
        global _active
        with _active_lock:
            if _active is not self:
                return
        atexit.unregister(self.stop)
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.hurry.set()
            run.request_stop("AWS Batch emulator stopped", "shutdown")
        for run in runs:
            for node in run.nodes:
                kill_group(node.proc, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for run in runs:
            if run.job.is_alive():
                run.job.join(max(0.1, deadline - time.monotonic()))
        for run in runs:  # a thread that did not finish in time: make sure its processes are gone anyway
            for node in run.nodes:
                kill_group(node.proc, signal.SIGKILL)
                if node.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        node.proc.wait(timeout=1)
        if self._server is not None:
            if self.endpoint_url:
                with contextlib.suppress(OSError):
                    self._reset_moto()
            self._server.stop()
            self._server = None
        self._patches.undo()
        if self._saved_transition is not None:
            state_manager.set_transition("batch::job", self._saved_transition)
        else:
            state_manager.unset_transition("batch::job")
        self._setup = None  # moto was reset
        with _active_lock:
            _active = None

    def __enter__(self) -> BatchEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _reset_moto(self) -> None:
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=30):
            pass

    # ------------------------------------------------------------------ clients and setup

    def client(self, service: str, **kwargs: Any) -> Any:
        """A boto3 client for ``service`` pointed at the emulator, with dummy credentials unless ``kwargs``
        give their own (an ``aws_access_key_id`` is recorded as each request's ``client``)."""
        kwargs.setdefault("region_name", self.region)
        return boto3.client(service, endpoint_url=self.endpoint_url, **{**DUMMY_CREDENTIALS, **kwargs})

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

    # ------------------------------------------------------------------ fault injection

    def create_queue(self, name: str, capacity: str = "on-demand") -> str:
        """A job queue ``name`` on the spot or on-demand compute environment of :meth:`create_environment`
        (e.g. one queue per instance type, for ``queues_by_instance_type``); an existing one is kept."""
        setup = self.create_environment(fair_share=False)
        batch = self.client("batch")
        if not batch.describe_job_queues(jobQueues=[name])["jobQueues"]:
            env = setup.spot_compute_environment if capacity == "spot" else setup.on_demand_compute_environment
            _create_queue(batch, name, env)
        return name

    def hold(self, queue: str, reason: str | None = None) -> None:
        """Keep jobs of ``queue`` (name or ARN) RUNNABLE, as with no capacity, until :meth:`release`.

        :param reason: the ``statusReason`` its RUNNABLE jobs show meanwhile, as Batch words it for a
            job blocking its queue, e.g. ``"CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - There is no Spot
            capacity available that meets the job requirements."`` (default: none)
        """
        with self._lock:
            name = _queue_name(queue)
            self._held.add(name)
            if reason is None:
                self._held_reasons.pop(name, None)
            else:
                self._held_reasons[name] = reason

    def release(self, queue: str) -> None:
        """Let held jobs of ``queue`` start."""
        with self._lock:
            self._held.discard(_queue_name(queue))
            self._held_reasons.pop(_queue_name(queue), None)
        self._nudge_held()

    def set_status_reason(self, job_id: str, reason: str | None) -> None:
        """The ``statusReason`` the job shows while it is RUNNABLE (``None``: none), as Batch sets it on a
        job blocking its queue: ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - ...`` (it may start later) or
        ``MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - ...`` (it never will: hold its queue to keep it there)."""
        with self._lock:
            run = self._runs.get(job_id)
            if run is None:
                raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
            run.queue_reason = reason

    def preempt(self, job_id: str, instance_id: str | None = None) -> None:
        """Reclaim the job's spot host now: SIGTERM, SIGKILL after ``grace_period``; the job ends FAILED
        with ``Host EC2 (instance i-...) terminated.`` (``instance_id`` or the job's own host)."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
        if run.job.job_stopped:
            raise ValueError(f"AWS Batch emulator: job {job_id} already ended {job_state(run.job)}; cannot preempt it")
        self._preempt(run, instance_id)

    def fail_host(
        self,
        job_id: str,
        reason: str = "CannotInspectContainerError: Could not transition to inspecting; timed out after waiting 30s",
    ) -> None:
        """The job's host or its GPU fails under it now: SIGTERM, SIGKILL after ``grace_period``; the job ends
        FAILED with ``reason`` as its status reason (Batch's words for a host fault, e.g. a container runtime
        that stopped answering or ``nvidia-container-cli: initialization error``)."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
        run.request_stop(reason, "host_fault")

    def preempt_after(self, seconds: float, *, queue: str, count: int = 1, name_contains: str | None = None) -> None:
        """Preempt the next ``count`` jobs submitted to ``queue`` (with ``name_contains`` in their name,
        if given) ``seconds`` after each reaches RUNNING."""
        with self._lock:
            self._preempt_rules.append(_PreemptRule(seconds, _queue_name(queue), count, name_contains))

    def throttle(self, action: str, every: int) -> None:
        """Answer every ``every``-th request of ``action`` (e.g. ``DescribeJobs``, counted from now; ``"*"``:
        of every Batch and CloudWatch Logs action, each counted on its own) as Batch does when throttling:
        HTTP 429 ``TooManyRequestsException`` (``logs:*`` actions: HTTP 400 ``ThrottlingException``).
        ``every=0`` turns it off."""
        self._faults.throttle(action, every)

    def throttle_bursts(self, action: str, burst: int) -> None:
        """Throttle ``burst`` requests of ``action`` in a row (``"*"``: of every action, each counted on its
        own), then let one through, and so on. With ``burst`` of 4 or more, botocore's own retries give up
        (``retries={"max_attempts": 3}`` is 3 retries, 4 attempts): only a client's own backoff gets a call
        through. 0 turns it off."""
        self._faults.throttle_bursts(action, burst)

    def lose_response(self, action: str, count: int = 1, *, how: str = "error") -> None:
        """Carry out the next ``count`` requests of ``action`` (a SubmitJob creates its job), then lose the
        response: ``how="error"`` answers HTTP 500 ``ServerException``, ``how="disconnect"`` closes the
        connection without an answer. A client that simply sends the request again does it twice."""
        self._faults.lose_response(action, count, how=how)

    def forget(self, job_id: str) -> None:
        """Forget a job, as Batch does some time after it ended (or as if it was deleted): DescribeJobs
        and ListJobs leave it out from now on. A job still active is stopped first, its processes killed."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
        job = run.job
        if not job.job_stopped:
            run.hurry.set()
            run.request_stop("forgotten by the AWS Batch emulator", "shutdown")
            if job.is_alive():
                job.join(10)
        job.backend._jobs.pop(job.job_id, None)
        with contextlib.suppress(ValueError):
            job.job_queue.jobs.remove(job)
        with self._lock:
            self._runs.pop(job_id, None)
            self._reported_status.pop(job_id, None)
        logger.info("job %s (%s) forgotten", job.job_name, job.job_id)

    def report_status(self, job_id: str, status: str | None) -> None:
        """Make DescribeJobs answer ``status`` for the job (e.g. a state a newer Batch might add) instead
        of its own, until called again with ``None``. The job itself carries on as before."""
        with self._lock:
            if status is None:
                self._reported_status.pop(job_id, None)
            else:
                self._reported_status[job_id] = status

    def reset_faults(self) -> None:
        """Release every held queue, drop pending :meth:`preempt_after` rules, turn throttling and lost
        responses off, and stop overriding reported statuses."""
        with self._lock:
            self._held.clear()
            self._held_reasons.clear()
            self._preempt_rules.clear()
            self._reported_status.clear()
        self._faults.reset()
        self._nudge_held()

    # ------------------------------------------------------------------ inspection

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """Batch and CloudWatch Logs requests received, oldest first: ``{"action", "body", "throttled",
        "lost", "time", "status", "client"}``; ``action`` is the API name (``SubmitJob``;
        ``logs:GetLogEvents``); ``lost`` says how the response was lost (:meth:`lose_response`), ``None``
        when it was not; ``client`` is the access key id the request was signed with."""
        return self._log.requests(action, since=since)

    def count(self, action: str) -> int:
        """How many ``action`` requests were received (throttled ones included)."""
        return self._log.count(action)

    def reset_requests(self) -> None:
        """Forget the requests received so far."""
        self._log.reset()

    def job_pids(self, job_id: str) -> list[int]:
        """Pids of the job's live processes (every process in its nodes' process groups)."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            return []
        groups = {node.proc.pid for node in run.nodes if node.proc is not None}
        if not groups:
            return []
        try:
            entries = os.listdir("/proc")
        except OSError:
            return sorted(node.proc.pid for node in run.nodes if node.proc is not None and node.alive())
        pids = []
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) in groups:
                pids.append(int(entry))
        return sorted(pids)

    # ------------------------------------------------------------------ request log and routing

    def _action_of(self, environ: dict[str, Any]) -> str | None:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("Logs_"):
            return "logs:" + target.split(".", 1)[1]
        auth = environ.get("HTTP_AUTHORIZATION", "")
        path = environ.get("PATH_INFO", "")
        is_batch = "/batch/aws4_request" in auth or (not auth and path.startswith("/v1/"))
        if not is_batch:
            return None
        method = environ.get("REQUEST_METHOD", "POST")
        # match the path as sent: PATH_INFO has %2F decoded, so an ARN in the path (TagResource) would
        # look like several segments
        raw = str(environ.get("RAW_URI") or environ.get("REQUEST_URI") or path).split("?", 1)[0]
        for route_method, pattern, name in self._routes:
            if route_method == method and pattern.fullmatch(raw):
                return name
        return f"batch:{method} {path}"

    # ------------------------------------------------------------------ moto patches

    def _install_patches(self) -> None:
        self._saved_transition = state_manager._transitions.get("batch::job")
        state_manager.set_transition("batch::job", _NO_AUTOMATIC_PROGRESS)
        job_cls, backend_cls = batch_models.Job, batch_models.BatchBackend
        emulator = self
        wrap = self._patches.wrap

        def start(original: Callable[..., None]) -> Callable[..., None]:
            def patched(job: batch_models.Job) -> None:
                emulator._register(job)
                original(job)

            return patched

        def run(original: Callable[..., None]) -> Callable[..., None]:
            return lambda job: emulator._run(job)

        def terminate(original: Callable[..., None]) -> Callable[..., None]:
            def patched(job: batch_models.Job, reason: str) -> None:
                record = emulator._runs.get(job.job_id)
                if record is not None:
                    record.request_stop(reason, "terminate")
                    return
                for child in job._child_jobs or []:  # an array parent: Batch ends its children too
                    child.terminate(reason)
                if not job.job_stopped:
                    original(job, reason)

            return patched

        def get_container_property(original: Callable[..., Any]) -> Callable[..., Any]:
            # moto's version appends AWS_BATCH_JOB_ID to the submit request's own list on every call
            def patched(job: batch_models.Job, name: str, default: Any) -> Any:
                if name != "environment":
                    return original(job, name, default)
                env = env_dict(job.job_definition.container_properties.get("environment"))
                env.update(env_dict(job.container_overrides.get("environment")))
                env["AWS_BATCH_JOB_ID"] = job.job_id
                return [{"name": k, "value": v} for k, v in env.items()]

            return patched

        def describe_short(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
            def patched(job: batch_models.Job) -> dict[str, Any]:
                result = original(job)
                record = emulator._runs.get(job.job_id)
                if record is not None and not record.started:
                    result.pop("startedAt", None)  # moto reports 1970 for a job that never ran
                if record is not None and job_state(job) == "RUNNABLE":
                    with emulator._lock:
                        reason = record.queue_reason or emulator._held_reasons.get(job.job_queue.name)
                    if reason:
                        result["statusReason"] = reason
                return result

            return patched

        def describe(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
            return lambda job: emulator._describe(job, original(job))

        def submit_job(original: Callable[..., Any]) -> Callable[..., Any]:
            def patched(
                backend: batch_models.BatchBackend,
                job_name: str,
                job_def_id: str,
                job_queue: str,
                *args: Any,
                **kwargs: Any,
            ) -> Any:
                body = current_body("SubmitJob")
                queue = backend.get_job_queue(job_queue)
                if body is not None and queue is not None:
                    emulator._check_scheduling(backend, queue, job_def_id, body)
                return original(backend, job_name, job_def_id, job_queue, *args, **kwargs)

            return patched

        def register_job_definition(original: Callable[..., Any]) -> Callable[..., Any]:
            def patched(backend: batch_models.BatchBackend, *args: Any, **kwargs: Any) -> Any:
                job_def = original(backend, *args, **kwargs)
                body = current_body("RegisterJobDefinition") or {}
                job_def.emulator_scheduling_priority = body.get("schedulingPriority")
                return job_def

            return patched

        def describe_job_definition(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
            def patched(job_def: batch_models.JobDefinition) -> dict[str, Any]:
                result = original(job_def)
                priority = getattr(job_def, "emulator_scheduling_priority", None)
                if priority is not None:
                    result["schedulingPriority"] = priority
                return result

            return patched

        def describe_jobs(original: Callable[..., Any]) -> Callable[..., Any]:
            return lambda backend, jobs: emulator._describe_jobs(backend, jobs)

        def list_jobs(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
            def patched(
                backend: batch_models.BatchBackend,
                job_queue_name: str | None,
                array_job_id: str | None,
                job_status: str | None = None,
                filters: list[dict[str, Any]] | None = None,
            ) -> list[Any]:
                return emulator._list_jobs(backend, original, job_queue_name, array_job_id, job_status, filters)

            return patched

        wrap(job_cls, "start", start)
        wrap(job_cls, "run", run)
        wrap(job_cls, "terminate", terminate)
        wrap(job_cls, "_get_container_property", get_container_property)
        wrap(job_cls, "describe_short", describe_short)
        wrap(job_cls, "describe", describe)
        wrap(batch_models.JobDefinition, "describe", describe_job_definition)
        wrap(backend_cls, "submit_job", submit_job)
        wrap(backend_cls, "register_job_definition", register_job_definition)
        wrap(backend_cls, "describe_jobs", describe_jobs)
        wrap(backend_cls, "list_jobs", list_jobs)

    def _check_scheduling(
        self, backend: batch_models.BatchBackend, queue: batch_models.JobQueue, job_def_id: str, body: dict[str, Any]
    ) -> None:
        share = body.get("shareIdentifier")
        priority = body.get("schedulingPriorityOverride")
        if queue.schedule_policy:
            if not share:
                raise ClientException("shareIdentifier must be specified.")
            job_def = backend.get_job_definition(job_def_id)
            if priority is None and getattr(job_def, "emulator_scheduling_priority", None) is None:
                raise ClientException(
                    "Either schedulingPriority in job definition or schedulingPriorityOverride should be specified."
                )
        elif share is not None or priority is not None:
            fields = " and ".join(
                f for f in ("shareIdentifier", "schedulingPriorityOverride") if body.get(f) is not None
            )
            raise ClientException(
                f"Job queue {queue.name} has no scheduling policy: {fields} can only be used with a job queue "
                "that has a fair-share scheduling policy."
            )

    def _describe_jobs(self, backend: batch_models.BatchBackend, ids: list[str] | None) -> list[dict[str, Any]]:
        ids = ids or []  # moto: no ids (or an empty list) means every job
        if len(ids) > MAX_DESCRIBE_JOBS:
            raise ClientException(
                f"DescribeJobs accepts at most {MAX_DESCRIBE_JOBS} job IDs in one request; got {len(ids)}."
            )
        by_arn: dict[str, batch_models.Job] | None = None  # built only when an ARN is asked about
        result = []
        for ident in ids:
            base, sep, node = ident.partition("#")
            job = backend._jobs.get(base)
            if job is None and base.startswith("arn:"):
                if by_arn is None:
                    by_arn = {j.arn: j for j in list(backend._jobs.values())}
                job = by_arn.get(base)
            if job is None:
                continue
            if not sep:
                result.append(job.describe())
            elif node.isdigit() and (view := self._node_view(job, int(node))) is not None:
                result.append(view.describe())
        return result

    def _list_jobs(
        self,
        backend: batch_models.BatchBackend,
        original: Callable[..., list[Any]],
        job_queue_name: str | None,
        array_job_id: str | None,
        job_status: str | None,
        filters: list[dict[str, Any]] | None,
    ) -> list[Any]:
        body = current_body("ListJobs") or {}
        if filters and len(filters) > 1:
            raise ClientException("Only one filter can be used at a time.")
        if body.get("multiNodeJobId"):
            base = body["multiNodeJobId"]
            job = backend._jobs.get(base)
            run = self._runs.get(base)
            if job is None or run is None:
                return []
            views = [v for i in range(run.num_nodes) if (v := self._node_view(job, i)) is not None]
            wanted = job_status or "RUNNING"
            return [v for v in views if v.status() == wanted]
        if filters:  # real Batch: jobStatus is ignored, newest first, no array children
            jobs = original(backend, job_queue_name, array_job_id, None, filters)
            if not array_job_id:
                jobs = [j for j in jobs if "index" not in j.array_properties]
            return sorted(jobs, key=lambda j: j.job_created_at, reverse=True)
        return original(backend, job_queue_name, array_job_id, job_status or "RUNNING", None)

    def _describe(self, job: batch_models.Job, result: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            reported = self._reported_status.get(job.job_id)
        if reported is not None:
            result["status"] = reported
        run = self._runs.get(job.job_id)
        if run is None:
            children = job._child_jobs or []
            if children and all(c.job_stopped for c in children) and any(job_state(c) == "FAILED" for c in children):
                result["status"] = "FAILED"  # moto only ever moves an array parent to SUCCEEDED
            return result
        submit = run.submit
        if submit.get("shareIdentifier"):
            result["shareIdentifier"] = submit["shareIdentifier"]
        priority = submit.get("schedulingPriorityOverride")
        if priority is None:
            priority = getattr(job.job_definition, "emulator_scheduling_priority", None)
        if priority is not None:
            result["schedulingPriority"] = priority
        retry = submit.get("retryStrategy") or job.job_definition.retry_strategy
        if retry:
            result["retryStrategy"] = retry
        container = result.get("container")
        if container is not None:
            if container.get("logStreamName") is None:
                container.pop("logStreamName", None)  # moto sends null for a multi-node job not started yet
            if job.exit_code is not None:
                container["exitCode"] = job.exit_code
        if job.job_definition.type == "multinode":
            result["nodeProperties"] = {**(job.job_definition.node_properties or {}), "numNodes": run.num_nodes}
        return result


def _batch_routes() -> list[tuple[str, re.Pattern[str], str]]:
    """(HTTP method, path pattern, API name) of every Batch operation, from botocore's service model."""
    model = botocore.session.get_session().get_service_model("batch")
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        uri = http["requestUri"].split("?", 1)[0]
        pattern = re.sub(r"\\\{[^}]+\\\+\\\}", ".+", re.escape(uri))
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", pattern)
        routes.append((http["method"], re.compile(pattern), name))
    return routes


# ---------------------------------------------------------------------- command line


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logger.setLevel(logging.INFO)
    logging.getLogger("gpu_provider.testing.emulators").setLevel(logging.INFO)  # the job runner's state changes too
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ready = Path(args.ready_file) if args.ready_file else None
    emulator = BatchEmulator(
        port=args.port,
        job_cwd=args.job_cwd,
        step_seconds=args.step_seconds,
        grace_period=args.grace_period,
        region=args.region,
    )
    with emulator:
        setup = emulator.create_environment(fair_share=args.fair_share)
        if args.preempt_after is not None:
            emulator.preempt_after(
                args.preempt_after,
                queue=args.preempt_queue,
                count=args.preempt_count,
                name_contains=args.preempt_name_contains,
            )
        if ready is not None:
            info = {
                "endpoint_url": emulator.endpoint_url,
                "region": emulator.region,
                "spot_queue": setup.spot_queue,
                "on_demand_queue": setup.on_demand_queue,
                "fair_share_queue": setup.fair_share_queue,
                "pid": os.getpid(),
            }
            partial = ready.with_name(ready.name + ".tmp")
            partial.write_text(json.dumps(info))
            partial.replace(ready)
        print(f"AWS Batch emulator ready at {emulator.endpoint_url}", flush=True)
        try:
            stop.wait()
        finally:
            if ready is not None:
                ready.unlink(missing_ok=True)
    print("AWS Batch emulator stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_provider.testing.emulators.aws_batch", description=__doc__.split("\n", 1)[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the emulator with the provider's queues until SIGTERM/SIGINT")
    serve.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: a free one)")
    serve.add_argument("--job-cwd", default=None, help="working directory of job processes")
    serve.add_argument("--ready-file", default=None, help="write endpoint and queues here (JSON) once ready")
    serve.add_argument("--region", default="us-east-1")
    serve.add_argument("--fair-share", action="store_true", help="also create the fair-share queue gpu-fair-share")
    serve.add_argument("--step-seconds", type=float, default=0.5)
    serve.add_argument("--grace-period", type=float, default=5.0)
    serve.add_argument("--preempt-after", type=float, default=None, metavar="SECONDS")
    serve.add_argument("--preempt-queue", default=SPOT_QUEUE)
    serve.add_argument("--preempt-name-contains", default=None)
    serve.add_argument("--preempt-count", type=int, default=1)
    args = parser.parse_args(argv)
    return _serve(args)


if __name__ == "__main__":
    sys.exit(main())
