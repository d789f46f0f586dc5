"""A local SageMaker (training jobs): each job's hosts run the job's command as local processes.

moto's SageMaker creates every training job already ``Completed``, never progresses it and has no
StopTrainingJob, so this emulator answers the training-job API itself (in front of moto, on the
shared :mod:`gpu_provider.testing.emulators.core` server: request log, faults) and leaves S3 and
CloudWatch Logs to moto:

* **CreateTrainingJob, DescribeTrainingJob, ListTrainingJobs, StopTrainingJob, AddTags, ListTags,
  DeleteTags** as SageMaker answers them (JSON 1.1), with the rules moto does not enforce answered
  ``ValidationException`` (HTTP 400): managed spot without ``MaxWaitTimeInSeconds`` or with one below
  ``MaxRuntimeInSeconds`` (or ``MaxWaitTimeInSeconds`` without spot); a ``ContainerEntrypoint``/
  ``ContainerArguments`` item over 256 characters; an ``Environment`` value over 512 characters or more
  than 100 variables; more than 50 tags or a tag value with characters SageMaker refuses; a
  ``CheckpointConfig.S3Uri`` that is not ``s3://``; StopTrainingJob of a job that is not InProgress.
  A name in use is ``ResourceInUse``. ListTrainingJobs filters (``NameContains``, ``StatusEquals``,
  ``LastModifiedTimeAfter``/``Before``, ``CreationTimeAfter``/``Before``), sorts (``SortBy``,
  ``SortOrder``) and then pages (``MaxResults``, default 10), as SageMaker does (moto pages first).
* **Time-based progression** with ``SecondaryStatusTransitions``: Starting -> Downloading -> Training
  -> Uploading -> Completed (or Failed with ``FailureReason`` ``AlgorithmError: , exit code: N``),
  about ``step_seconds`` apart; ``TrainingStartTime``/``TrainingEndTime``, ``TrainingTimeInSeconds``
  and ``BillableTimeInSeconds`` (spot: the training time less ``spot_discount``, which is how
  SageMaker reports the spot saving).
* **Hosts are processes**: ``InstanceCount`` processes (``algo-1``...), each with its own
  ``/opt/ml`` mapped to ``<job_root>/<job>/<host>/opt/ml`` (every ``/opt/ml`` in the command and the
  environment is rewritten), ``resourceconfig.json`` in ``/opt/ml/input/config``, ``SM_HOSTS``,
  ``SM_CURRENT_HOST``, ``TRAINING_JOB_NAME``, ``TRAINING_JOB_ARN`` and, as the stand-in for DNS of
  ``algo-1``, ``MASTER_ADDR=127.0.0.1`` where the request sets none. Any host exiting non-zero
  fails the job (the others are stopped). Each host's output goes, line by line, to CloudWatch Logs
  group ``/aws/sagemaker/TrainingJobs``, stream ``<job>/algo-<n>-<epoch>`` (a new one per restart).
* **CheckpointConfig**: the S3 URI is copied into every host's checkpoint folder before the
  training starts, and each host's folder is copied to S3 while it trains and when it stops (files
  that changed, ``LATEST`` last). The model folder of ``algo-1`` is uploaded as
  ``<S3OutputPath>/<job>/output/model.tar.gz`` (``ModelArtifacts``).
* **StopTrainingJob** stops the hosts (SIGTERM, SIGKILL after ``grace_period``): Stopping -> Stopped.
  ``MaxRuntimeInSeconds`` (training time) ends the job Stopped/MaxRuntimeExceeded; a spot job still
  not done ``MaxWaitTimeInSeconds`` after its creation ends Stopped/MaxWaitTimeExceeded.
* **Faults** (from tests): :meth:`~SageMakerEmulator.hold` / :meth:`~SageMakerEmulator.release`
  (no capacity: jobs wait in Starting), :meth:`~SageMakerEmulator.interrupt` and
  :meth:`~SageMakerEmulator.interrupt_after` (a managed-spot reclaim: the hosts are stopped, the
  checkpoints synced, an ``Interrupted`` transition added, and the job restarts from Starting, as
  SageMaker does), :meth:`~SageMakerEmulator.fail` (Failed with a given ``FailureReason``, e.g. ``CapacityError: ...``),
  :meth:`~SageMakerEmulator.forget`, :meth:`~SageMakerEmulator.modified_with_status_only` (``LastModifiedTime``
  moves only with ``TrainingJobStatus``),
  :meth:`~SageMakerEmulator.report_status`, and the core's throttling and lost responses.

Command line, for ``make demo``::

    python -m gpu_provider.testing.emulators.aws_sagemaker serve --port 0 --job-root DIR --job-cwd DIR --ready-file PATH
        [--interrupt-after SECONDS --interrupt-name-contains train --interrupt-count 1]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from moto.core import DEFAULT_ACCOUNT_ID

from gpu_provider.testing.emulators.aws_sagemaker_jobs import DUMMY_CREDENTIALS, JobRunner, TrainingJob, kill_process
from gpu_provider.testing.emulators.core import (
    SERVER_ERROR,
    THROTTLED,
    Faults,
    Middleware,
    RecordingMotoServer,
    RequestLog,
)

logger = logging.getLogger(__name__)

ROLE_ARN = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/gpu-sagemaker-job"
HANDLED = frozenset(
    {
        "CreateTrainingJob",
        "DescribeTrainingJob",
        "ListTrainingJobs",
        "StopTrainingJob",
        "AddTags",
        "ListTags",
        "DeleteTags",
    }
)
_LOG_READS = frozenset({"GetLogEvents", "DescribeLogStreams", "FilterLogEvents"})
_TAG_VALUE = re.compile(r"^[\w\s.:/=+\-@]*$", re.UNICODE)
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


_active_lock = threading.Lock()
_active: SageMakerEmulator | None = None


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def _validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


class SageMakerEmulator(JobRunner):
    """SageMaker training jobs on a moto server, each host a local process.

    :param port: TCP port on 127.0.0.1; 0 picks a free one (see :attr:`endpoint_url`).
    :param job_root: folder under which each job's hosts get their ``/opt/ml``.
    :param job_cwd: working directory of the host processes (default: the current directory).
    :param step_seconds: time between two secondary statuses before and after training.
    :param grace_period: seconds between SIGTERM and SIGKILL when hosts are stopped.
    :param spot_discount: the share of a spot job's training time SageMaker does not bill.
    """

    def __init__(
        self,
        *,
        job_root: str | os.PathLike[str],
        port: int = 0,
        job_cwd: str | os.PathLike[str] | None = None,
        step_seconds: float = 0.3,
        grace_period: float = 3.0,
        region: str = "us-east-1",
        spot_discount: float = 0.7,
    ) -> None:
        self.job_root = Path(job_root)
        self.port = port
        self.job_cwd = Path(job_cwd) if job_cwd is not None else None
        self.step_seconds = step_seconds
        self.grace_period = grace_period
        self.region = region
        self.spot_discount = spot_discount
        self.endpoint_url = ""
        self._server: RecordingMotoServer | None = None
        self._faults = Faults()
        self._log = RequestLog()
        self._lock = threading.RLock()
        self._jobs: dict[str, TrainingJob] = {}
        self._held: set[str] = set()  # "spot", "on-demand"
        self._reported: dict[str, tuple[str, str]] = {}
        self._interrupt_rules: list[dict[str, Any]] = []
        self._s3: Any = None
        self._wait_clock = 1.0
        self._status_only_modified = False

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    def running() -> SageMakerEmulator | None:
        return _active

    def start(self) -> SageMakerEmulator:
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError(f"another SageMakerEmulator is running at {_active.endpoint_url}")
            _active = self
        try:
            self._server = RecordingMotoServer(
                self.port,
                lambda app: Middleware(
                    _SageMakerApp(self, app),
                    action_of=_action_of,
                    error_style=_error_style,
                    faults=self._faults,
                    log=self._log,
                ),
            )
            self._server.start()
            host, port = self._server.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
            self._s3 = self.client("s3")
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        logger.info("SageMaker emulator listening on %s (region %s)", self.endpoint_url, self.region)
        return self

    def stop(self) -> None:
        """Kill every host process and stop the server. Idempotent. Leaves moto's other state alone."""
        global _active
        with _active_lock:
            if _active is not self:
                return
        atexit.unregister(self.stop)
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.hurry.set()
            job.stop_kind = job.stop_kind or "stop"
            job.alert()
        for job in jobs:
            for host in job.hosts:
                kill_process(host.proc, signal.SIGKILL)
        for job in jobs:
            if job.thread is not None:
                job.thread.join(10)
        if self._server is not None:
            self._server.stop()
            self._server = None
        with _active_lock:
            _active = None

    def __enter__(self) -> SageMakerEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def client(self, service: str, **kwargs: Any) -> Any:
        kwargs.setdefault("region_name", self.region)
        return boto3.client(service, endpoint_url=self.endpoint_url, **DUMMY_CREDENTIALS, **kwargs)

    def create_bucket(self, bucket: str) -> None:
        with contextlib.suppress(self._s3.exceptions.BucketAlreadyOwnedByYou):
            self._s3.create_bucket(Bucket=bucket)

    # ------------------------------------------------------------------ faults and inspection

    def hold(self, capacity: str = "spot", *, instance_type: str | None = None) -> None:
        """Jobs of ``capacity`` (``spot``, ``on-demand``, or ``"*"`` for both) wait in Starting until
        :meth:`release`; with ``instance_type`` (``ml.p5.48xlarge``), only jobs on that instance type."""
        with self._lock:
            self._held.add(f"{capacity}|{instance_type}" if instance_type else capacity)

    def release(self, capacity: str | None = None, *, instance_type: str | None = None) -> None:
        with self._lock:
            if capacity is None:
                self._held.clear()
            else:
                self._held.discard(f"{capacity}|{instance_type}" if instance_type else capacity)
        self._nudge_waiting()

    def interrupt(self, name: str, *, restart: bool = True) -> None:
        """Reclaim a managed-spot job's instances now: SageMaker restarts it from its checkpoint, or with
        ``restart=False`` the job ends there (Stopped/Interrupted), as when it cannot come back."""
        job = self._job(name)
        if not job.spot:
            raise ValueError(f"training job {name} is not a managed spot job: nothing reclaims its instances")
        with self._lock:
            if job.stop_kind is None:
                job.stop_kind = "interrupt" if restart else "reclaim"
        job.alert()

    def interrupt_after(
        self, seconds: float, *, name_contains: str | None = None, count: int = 1, checkpointed: bool = False
    ) -> None:
        """Interrupt the next ``count`` spot jobs (named with ``name_contains``) ``seconds`` into their training;
        with ``checkpointed``, not before the job's first checkpoint (a ``LATEST`` file) was copied to S3, so
        a test of resuming does not depend on how fast a loaded machine starts the training."""
        with self._lock:
            self._interrupt_rules.append(
                {"after": seconds, "contains": name_contains, "left": count, "checkpointed": checkpointed}
            )

    def wait_clock(self, factor: float) -> None:
        """Run the clock of ``MaxWaitTimeInSeconds`` ``factor`` times faster (1: real time), so a test sees
        SageMaker give a spot job up (MaxWaitTimeExceeded) without waiting its limit out."""
        with self._lock:
            self._wait_clock = float(factor)
        self._nudge_waiting()

    def modified_with_status_only(self, on: bool = True) -> None:
        """While on, ``LastModifiedTime`` (DescribeTrainingJob, ListTrainingJobs and its
        ``LastModifiedTimeAfter`` filter) moves only when ``TrainingJobStatus`` changes, not with
        ``SecondaryStatus`` alone (an ``Interrupted`` inside ``InProgress``): AWS does not document
        which it does, so a client must work either way."""
        with self._lock:
            self._status_only_modified = bool(on)

    def _modified(self, job: TrainingJob) -> float:
        return job.status_modified if self._status_only_modified else job.last_modified

    def fail(self, name: str, reason: str) -> None:
        """End a job Failed now with ``reason`` as its FailureReason (an internal error, say)."""
        job = self._job(name)
        with self._lock:
            job.stop_kind, job.fail_reason = "fail", reason
        job.alert()

    def backdate(self, name: str, seconds: float) -> None:
        """Move a job's clock ``seconds`` back: it was created, and started training, that much earlier
        (a long job seen without waiting it out)."""
        job = self._job(name)
        with self._lock:
            job.created -= seconds
            if job.training_start is not None:
                job.training_start -= seconds
            job.training_seconds += seconds if job.training_start is not None else 0.0
            for transition in job.transitions:
                for key in ("StartTime", "EndTime"):
                    if key in transition:
                        transition[key] -= seconds
        job.nudge.set()

    def forget(self, name: str) -> None:
        with self._lock:
            self._jobs.pop(name, None)

    def report_status(self, name: str, status: str | None, secondary: str | None = None) -> None:
        """DescribeTrainingJob answers this status pair for the job (``None``: the truth again)."""
        with self._lock:
            if status is None:
                self._reported.pop(name, None)
            else:
                self._reported[name] = (status, secondary or status)

    def throttle(self, action: str, every: int) -> None:
        self._faults.throttle(action, every)

    def throttle_bursts(self, action: str, burst: int) -> None:
        self._faults.throttle_bursts(action, burst)

    def lose_response(self, action: str, count: int = 1, *, how: str = "error") -> None:
        self._faults.lose_response(action, count, how=how)

    def reset_faults(self) -> None:
        self._faults.reset()
        with self._lock:
            self._held.clear()
            self._reported.clear()
            self._interrupt_rules.clear()
            self._wait_clock = 1.0
            self._status_only_modified = False
        self._nudge_waiting()

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """SageMaker and CloudWatch Logs requests received, oldest first: ``{"action", "body", "throttled", "lost",
        "time", "status", "client"}``; ``client`` is the access key id the request was signed with."""
        return self._log.requests(action, since=since)

    def count(self, action: str) -> int:
        return self._log.count(action)

    def reset_requests(self) -> None:
        self._log.reset()

    def job(self, name: str) -> TrainingJob:
        return self._job(name)

    def host_pids(self, name: str) -> list[int]:
        return [h.proc.pid for h in self._job(name).hosts if h.proc is not None and h.alive()]

    def stop_all(self, reason: str = "test teardown") -> None:
        """Stop every job still in progress (a fixture's teardown)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.status == "InProgress"]
            for job in jobs:
                job.stop_kind = job.stop_kind or "stop"
                job.alert()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(self.grace_period + 5)

    def _job(self, name: str) -> TrainingJob:
        with self._lock:
            job = self._jobs.get(name)
        if job is None:
            raise KeyError(f"no training job {name!r} in the SageMaker emulator")
        return job

    # ------------------------------------------------------------------ the API

    def handle(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        handler: Callable[[dict[str, Any]], dict[str, Any]] = getattr(self, f"_api_{action}")
        return handler(body)

    def _api_CreateTrainingJob(self, body: dict[str, Any]) -> dict[str, Any]:
        _check_create(body)
        name = str(body["TrainingJobName"])
        arn = f"arn:aws:sagemaker:{self.region}:{DEFAULT_ACCOUNT_ID}:training-job/{name.lower()}"
        with self._lock:
            if name in self._jobs:
                raise ApiError(
                    "ResourceInUse",
                    f"Training job names must be unique within an AWS account and region, "
                    f"and a training job with this name already exists ({arn})",
                )
            job = TrainingJob(body, arn)
            job.transition("Starting", message="Starting the training job")
            self._jobs[name] = job
        job.thread = threading.Thread(target=self._lifecycle, args=(job,), name=f"sagemaker-{name}", daemon=True)
        job.thread.start()
        return {"TrainingJobArn": arn}

    def _api_DescribeTrainingJob(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("TrainingJobName") or "")
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                raise _validation(f"Requested resource not found: training job {name!r}")
            return self._describe(job)

    def _describe(self, job: TrainingJob) -> dict[str, Any]:
        req = job.request
        status, secondary = self._reported.get(job.name, (job.status, job.secondary))
        out: dict[str, Any] = {
            "TrainingJobName": job.name,
            "TrainingJobArn": job.arn,
            "TrainingJobStatus": status,
            "SecondaryStatus": secondary,
            "AlgorithmSpecification": req["AlgorithmSpecification"],
            "RoleArn": req["RoleArn"],
            "OutputDataConfig": req["OutputDataConfig"],
            "ResourceConfig": req["ResourceConfig"],
            "StoppingCondition": req["StoppingCondition"],
            "CreationTime": job.created,
            "LastModifiedTime": self._modified(job),
            "SecondaryStatusTransitions": [dict(t) for t in job.transitions],
            "EnableNetworkIsolation": bool(req.get("EnableNetworkIsolation")),
            "EnableInterContainerTrafficEncryption": bool(req.get("EnableInterContainerTrafficEncryption")),
            "EnableManagedSpotTraining": job.spot,
            "ModelArtifacts": {"S3ModelArtifacts": job.artifacts or ""},
        }
        for key in ("Environment", "CheckpointConfig", "VpcConfig", "HyperParameters"):
            if key in req:
                out[key] = req[key]
        if job.failure_reason:
            out["FailureReason"] = job.failure_reason
        if job.training_start is not None:
            out["TrainingStartTime"] = job.training_start
        if job.training_end is not None:
            out["TrainingEndTime"] = job.training_end
        if job.status in ("Completed", "Failed", "Stopped"):
            out["TrainingTimeInSeconds"] = round(job.training_seconds)
            out["BillableTimeInSeconds"] = job.billable(self.spot_discount)
        return out

    def _api_ListTrainingJobs(self, body: dict[str, Any]) -> dict[str, Any]:
        limit = int(body.get("MaxResults") or 10)
        if not 1 <= limit <= 100:
            raise _validation(f"MaxResults {limit} must be between 1 and 100")
        contains = str(body.get("NameContains") or "").lower()
        status = body.get("StatusEquals")
        bounds = {
            k: float(body[k])
            for k in ("LastModifiedTimeAfter", "LastModifiedTimeBefore", "CreationTimeAfter", "CreationTimeBefore")
            if k in body
        }
        with self._lock:
            jobs = [j for j in self._jobs.values() if contains in j.name.lower()]
            jobs = [j for j in jobs if status is None or j.status == status]
            jobs = [
                j
                for j in jobs
                if self._modified(j) > bounds.get("LastModifiedTimeAfter", float("-inf"))
                and self._modified(j) < bounds.get("LastModifiedTimeBefore", float("inf"))
                and j.created > bounds.get("CreationTimeAfter", float("-inf"))
                and j.created < bounds.get("CreationTimeBefore", float("inf"))
            ]
            sort_by = body.get("SortBy") or "CreationTime"
            key: Callable[[TrainingJob], Any] = {
                "Name": lambda j: j.name,
                "CreationTime": lambda j: j.created,
                "Status": lambda j: j.status,
            }[sort_by]
            jobs.sort(key=key, reverse=(body.get("SortOrder") or "Descending") == "Descending")
            start = int(body.get("NextToken") or 0)
            page = jobs[start : start + limit]
            summaries = [
                {
                    "TrainingJobName": j.name,
                    "TrainingJobArn": j.arn,
                    "CreationTime": j.created,
                    "LastModifiedTime": self._modified(j),
                    "TrainingJobStatus": j.status,
                    "SecondaryStatus": j.secondary,
                    **({"TrainingEndTime": j.training_end} if j.training_end else {}),
                }
                for j in page
            ]
        out: dict[str, Any] = {"TrainingJobSummaries": summaries}
        if start + limit < len(jobs):
            out["NextToken"] = str(start + limit)
        return out

    def _api_StopTrainingJob(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("TrainingJobName") or "")
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                raise _validation(f"Requested resource not found: training job {name!r}")
            if job.status != "InProgress":
                raise _validation(f"The request was rejected because the training job is in status {job.status}.")
            job.stop_kind = "stop"
            job.transition("Stopping", status="Stopping")
        job.alert()
        return {}

    def _job_by_arn(self, arn: str) -> TrainingJob:
        with self._lock:
            for job in self._jobs.values():
                if job.arn == arn:
                    return job
        raise _validation(f"Requested resource not found: {arn}")

    def _api_AddTags(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job_by_arn(str(body.get("ResourceArn")))
        tags = body.get("Tags") or []
        _check_tags(tags)
        with self._lock:
            merged = {**job.tags, **{t["Key"]: t.get("Value", "") for t in tags}}
            if len(merged) > 50:
                raise _validation("A resource can have at most 50 tags")
            job.tags = merged
        return {"Tags": tags}

    def _api_ListTags(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job_by_arn(str(body.get("ResourceArn")))
        with self._lock:
            return {"Tags": [{"Key": k, "Value": v} for k, v in job.tags.items()]}

    def _api_DeleteTags(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job_by_arn(str(body.get("ResourceArn")))
        with self._lock:
            for key in body.get("TagKeys") or []:
                job.tags.pop(key, None)
        return {}

    # ------------------------------------------------------------------ a job's life


class _SageMakerApp:
    """Answers the training-job API; everything else goes to moto."""

    def __init__(self, emulator: SageMakerEmulator, app: Any) -> None:
        self._emulator = emulator
        self._app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        service, _, action = target.partition(".")
        if service != "SageMaker" or action not in HANDLED:
            return self._app(environ, start_response)
        stream = environ["wsgi.input"]
        raw = stream.read()
        try:
            body = json.loads(raw) if raw else {}
            status, payload = 200, self._emulator.handle(action, body)
        except ApiError as err:
            status, payload = err.status, {"__type": err.code, "message": err.message}
            headers_extra = [("x-amzn-ErrorType", err.code)]
        else:
            headers_extra = []
        data = json.dumps(payload, default=str).encode()
        start_response(
            f"{status} {'OK' if status == 200 else 'Bad Request'}",
            [
                ("Content-Type", "application/x-amz-json-1.1"),
                ("Content-Length", str(len(data))),
                ("x-amzn-RequestId", str(uuid.uuid4())),
                *headers_extra,
            ],
        )
        return [data]


def _action_of(environ: dict[str, Any]) -> str | None:
    target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
    service, _, action = target.partition(".")
    if service == "SageMaker":
        return action
    if service.startswith("Logs_") and action in _LOG_READS:
        return "logs:" + action
    return None


def _error_style(action: str, kind: str) -> tuple[int, str, str]:
    if kind == THROTTLED:
        return 400, "ThrottlingException", "Rate exceeded"
    if kind == SERVER_ERROR:
        return 500, "InternalFailure", "An internal error occurred"
    raise ValueError(f"unknown error kind {kind!r}")


def _check_tags(tags: list[dict[str, Any]]) -> None:
    if len(tags) > 50:
        raise _validation(f"{len(tags)} tags: at most 50 are allowed")
    for tag in tags:
        key, value = str(tag.get("Key", "")), str(tag.get("Value", ""))
        if not 1 <= len(key) <= 128 or len(value) > 256 or not _TAG_VALUE.match(value) or not _TAG_VALUE.match(key):
            raise _validation(
                f"1 validation error detected: Value {value!r} at 'tags.{key}.value' failed to satisfy constraint: "
                "Member must satisfy regular expression pattern: ^([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)$ and length <= 256"
            )


def _check_create(body: dict[str, Any]) -> None:
    """The rules of CreateTrainingJob that moto (and botocore's client-side checks) do not enforce."""
    name = str(body.get("TrainingJobName") or "")
    if not _NAME.match(name):
        raise _validation(f"TrainingJobName {name!r} must match ^[a-zA-Z0-9](-*[a-zA-Z0-9]){{0,62}}$")
    algorithm = body.get("AlgorithmSpecification") or {}
    for field in ("ContainerEntrypoint", "ContainerArguments"):
        items = algorithm.get(field) or []
        if len(items) > 100:
            raise _validation(f"AlgorithmSpecification.{field}: at most 100 items")
        for i, item in enumerate(items):
            if len(item) > 256:
                raise _validation(
                    f"Value at 'algorithmSpecification.{field[0].lower()}{field[1:]}.{i + 1}' failed to satisfy "
                    "constraint: Member must have length less than or equal to 256"
                )
    env = body.get("Environment") or {}
    if len(env) > 100:
        raise _validation(f"Environment has {len(env)} entries: at most 100 are allowed")
    for key, value in env.items():
        if len(key) > 512 or len(str(value)) > 512:
            raise _validation(f"Environment[{key!r}]: keys and values are at most 512 characters")
    _check_tags(body.get("Tags") or [])
    stopping = body.get("StoppingCondition") or {}
    runtime = stopping.get("MaxRuntimeInSeconds")
    wait = stopping.get("MaxWaitTimeInSeconds")
    if body.get("EnableManagedSpotTraining"):
        if wait is None:
            raise _validation("MaxWaitTimeInSeconds is required for managed spot training")
        if runtime is not None and int(wait) < int(runtime):
            raise _validation(
                f"MaxWaitTimeInSeconds ({wait}) must be greater than or equal to MaxRuntimeInSeconds ({runtime})"
            )
    elif wait is not None:
        raise _validation("MaxWaitTimeInSeconds can be set only with EnableManagedSpotTraining")
    checkpoint = body.get("CheckpointConfig")
    if checkpoint and not str(checkpoint.get("S3Uri", "")).startswith("s3://"):
        raise _validation(f"CheckpointConfig.S3Uri {checkpoint.get('S3Uri')!r} must be an s3:// URI")
    vpc = body.get("VpcConfig")
    if vpc and not (vpc.get("Subnets") and vpc.get("SecurityGroupIds")):
        raise _validation("VpcConfig needs Subnets and SecurityGroupIds")


# ---------------------------------------------------------------------- command line


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logger.setLevel(logging.INFO)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ready = Path(args.ready_file) if args.ready_file else None
    emulator = SageMakerEmulator(
        port=args.port,
        job_root=args.job_root,
        job_cwd=args.job_cwd,
        step_seconds=args.step_seconds,
        grace_period=args.grace_period,
        region=args.region,
    )
    with emulator:
        for bucket in args.bucket:
            emulator.create_bucket(bucket)
        if args.interrupt_after is not None:
            emulator.interrupt_after(
                args.interrupt_after, name_contains=args.interrupt_name_contains, count=args.interrupt_count
            )
        if ready is not None:
            info = {
                "endpoint_url": emulator.endpoint_url,
                "region": emulator.region,
                "role_arn": ROLE_ARN,
                "pid": os.getpid(),
            }
            partial = ready.with_name(ready.name + ".tmp")
            partial.write_text(json.dumps(info))
            partial.replace(ready)
        print(f"SageMaker emulator ready at {emulator.endpoint_url}", flush=True)
        try:
            stop.wait()
        finally:
            emulator.stop_all("emulator stopped")
            if ready is not None:
                ready.unlink(missing_ok=True)
    print("SageMaker emulator stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_provider.testing.emulators.aws_sagemaker", description=__doc__.split("\n", 1)[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the emulator until SIGTERM/SIGINT")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--job-root", required=True, help="folder of the jobs' /opt/ml folders")
    serve.add_argument("--job-cwd", default=None, help="working directory of host processes")
    serve.add_argument("--ready-file", default=None, help="write the endpoint here (JSON) once ready")
    serve.add_argument("--region", default="us-east-1")
    serve.add_argument("--bucket", action="append", default=[], help="create this S3 bucket (repeatable)")
    serve.add_argument("--step-seconds", type=float, default=0.5)
    serve.add_argument("--grace-period", type=float, default=5.0)
    serve.add_argument("--interrupt-after", type=float, default=None, metavar="SECONDS")
    serve.add_argument("--interrupt-name-contains", default=None)
    serve.add_argument("--interrupt-count", type=int, default=1)
    return _serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
