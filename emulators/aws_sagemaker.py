"""A local SageMaker (training jobs): each job's hosts run the job's command as local processes.

moto's SageMaker creates every training job already ``Completed``, never progresses it and has no
StopTrainingJob, so this emulator answers the training-job API itself (in front of moto, on the
shared :mod:`emulators.core` server: request log, faults) and leaves S3 and CloudWatch Logs to moto:

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
  SageMaker does), :meth:`~SageMakerEmulator.fail`, :meth:`~SageMakerEmulator.forget`,
  :meth:`~SageMakerEmulator.report_status`, and the core's throttling and lost responses.

Command line, for ``make demo``::

    python -m emulators.aws_sagemaker serve --port 0 --job-root DIR --job-cwd DIR --ready-file PATH
        [--interrupt-after SECONDS --interrupt-name-contains train --interrupt-count 1]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.logs.models import logs_backends

from emulators.core import SERVER_ERROR, THROTTLED, Faults, Middleware, RecordingMotoServer, RequestLog

logger = logging.getLogger(__name__)

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
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
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
_TAG_VALUE = re.compile(r"^[\w\s.:/=+\-@]*$", re.UNICODE)
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_TICK = 0.05
_HELD_TICK = 0.2  # a job waiting for held capacity looks again this often (many may wait at once)
#: how often a training host's checkpoint folder is copied to S3
SYNC_EVERY_S = 0.25

MESSAGES = {
    "Starting": "Launching requested ML instances",
    "Downloading": "Downloading input data",
    "Training": "Training image download completed. Training in progress.",
    "Uploading": "Uploading generated training model",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopping": "Stopping the training job",
    "Stopped": "Training job stopped",
    "Interrupted": "Training job interrupted: the managed spot instances were reclaimed (spot interruption); "
    "SageMaker restarts the job from its checkpoint",
    "Reclaimed": "Training job interrupted: the managed spot instances were reclaimed and the job could not be "
    "restarted",
    "MaxWaitTimeExceeded": "Training job exceeded MaxWaitTimeInSeconds: spot capacity did not come in time",
    "MaxRuntimeExceeded": "Training job exceeded MaxRuntimeInSeconds",
}

_active_lock = threading.Lock()
_active: SageMakerEmulator | None = None


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def _validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


@dataclasses.dataclass
class Host:
    name: str
    root: Path  # the host's /opt/ml lives under root/opt/ml
    stream: str = ""
    proc: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None
    synced: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)

    @property
    def opt_ml(self) -> Path:
        return self.root / "opt" / "ml"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class TrainingJob:
    """The emulator's state of one training job (guarded by the emulator's lock)."""

    def __init__(self, request: dict[str, Any], arn: str) -> None:
        self.request = request
        self.name = str(request["TrainingJobName"])
        self.arn = arn
        self.created = self.last_modified = time.time()
        self.status, self.secondary = "InProgress", "Starting"
        self.transitions: list[dict[str, Any]] = []
        self.failure_reason: str | None = None
        self.training_start: float | None = None
        self.training_end: float | None = None
        self.training_seconds = 0.0
        self.tags = {t["Key"]: t.get("Value", "") for t in request.get("Tags") or []}
        self.hosts: list[Host] = []
        self.artifacts: str | None = None
        self.stop_kind: str | None = None  # stop | interrupt | fail
        self.fail_reason: str | None = None
        self.wake = threading.Event()
        self.hurry = threading.Event()
        self.thread: threading.Thread | None = None
        self.runs = 0

    @property
    def spot(self) -> bool:
        return bool(self.request.get("EnableManagedSpotTraining"))

    @property
    def stopping(self) -> dict[str, Any]:
        return dict(self.request.get("StoppingCondition") or {})

    def transition(self, secondary: str, status: str | None = None, message: str | None = None) -> None:
        now = time.time()
        if self.transitions and "EndTime" not in self.transitions[-1]:
            self.transitions[-1]["EndTime"] = now
        self.transitions.append(
            {"Status": secondary, "StartTime": now, "StatusMessage": message or MESSAGES[secondary]}
        )
        self.secondary = secondary
        if status is not None:
            self.status = status
        self.last_modified = now

    def billable(self, discount: float) -> int:
        trained = round(self.training_seconds)
        if not self.spot:
            return trained
        return max(1, round(trained * (1 - discount))) if trained else 0


class SageMakerEmulator:
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
            job.wake.set()
        for job in jobs:
            for host in job.hosts:
                _kill(host.proc, signal.SIGKILL)
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

    def hold(self, capacity: str = "spot") -> None:
        """Jobs of ``capacity`` (``spot``, ``on-demand``) wait in Starting until :meth:`release`."""
        with self._lock:
            self._held.add(capacity)

    def release(self, capacity: str | None = None) -> None:
        with self._lock:
            if capacity is None:
                self._held.clear()
            else:
                self._held.discard(capacity)

    def interrupt(self, name: str, *, restart: bool = True) -> None:
        """Reclaim a managed-spot job's instances now: SageMaker restarts it from its checkpoint, or with
        ``restart=False`` the job ends there (Stopped/Interrupted), as when it cannot come back."""
        job = self._job(name)
        if not job.spot:
            raise ValueError(f"training job {name} is not a managed spot job: nothing reclaims its instances")
        with self._lock:
            if job.stop_kind is None:
                job.stop_kind = "interrupt" if restart else "reclaim"
        job.wake.set()

    def interrupt_after(self, seconds: float, *, name_contains: str | None = None, count: int = 1) -> None:
        """Interrupt the next ``count`` spot jobs (named with ``name_contains``) ``seconds`` into their training."""
        with self._lock:
            self._interrupt_rules.append({"after": seconds, "contains": name_contains, "left": count})

    def wait_clock(self, factor: float) -> None:
        """Run the clock of ``MaxWaitTimeInSeconds`` ``factor`` times faster (1: real time), so a test sees
        SageMaker give a spot job up (MaxWaitTimeExceeded) without waiting its limit out."""
        with self._lock:
            self._wait_clock = float(factor)

    def fail(self, name: str, reason: str) -> None:
        """End a job Failed now with ``reason`` as its FailureReason (an internal error, say)."""
        job = self._job(name)
        with self._lock:
            job.stop_kind, job.fail_reason = "fail", reason
        job.wake.set()

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

    def requests(self, action: str | None = None) -> list[dict[str, Any]]:
        return self._log.requests(action)

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
                job.wake.set()
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
            "LastModifiedTime": job.last_modified,
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
                if j.last_modified > bounds.get("LastModifiedTimeAfter", float("-inf"))
                and j.last_modified < bounds.get("LastModifiedTimeBefore", float("inf"))
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
                    "LastModifiedTime": j.last_modified,
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
        job.wake.set()
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

    def _set(self, job: TrainingJob, secondary: str, status: str | None = None, message: str | None = None) -> None:
        with self._lock:
            job.transition(secondary, status, message)
        logger.info("training job %s: %s/%s", job.name, job.status, secondary)

    def _pause(self, job: TrainingJob, seconds: float) -> bool:
        """Wait ``seconds``; ``True`` when a stop, interruption or failure came meanwhile."""
        return job.wake.wait(seconds) or job.stop_kind is not None

    def _waited_too_long(self, job: TrainingJob) -> bool:
        wait = job.stopping.get("MaxWaitTimeInSeconds")
        return bool(job.spot and wait and (time.time() - job.created) * self._wait_clock > float(wait))

    def _lifecycle(self, job: TrainingJob) -> None:
        try:
            self._run_job(job)
        except Exception as err:  # the emulator's own failure: the job fails with it, never hangs
            logger.exception("training job %s: emulator error", job.name)
            self._end(job, "Failed", "Failed", f"InternalServerError: emulator error: {err}")

    def _run_job(self, job: TrainingJob) -> None:
        capacity = "spot" if job.spot else "on-demand"
        while True:
            job.runs += 1
            # waiting for instances (the spot wait)
            while True:
                if self._waited_too_long(job):
                    self._end(job, "Stopped", "MaxWaitTimeExceeded", MESSAGES["MaxWaitTimeExceeded"])
                    return
                with self._lock:
                    held = capacity in self._held
                if not held:
                    break
                if self._pause(job, _HELD_TICK):
                    break
            if job.stop_kind is not None or self._pause(job, self.step_seconds):
                if self._stopped_early(job):
                    return
                continue
            self._set(job, "Downloading")
            failure = self._download_checkpoints(job)
            if failure:
                self._end(job, "Failed", "Failed", failure)
                return
            if self._pause(job, self.step_seconds):
                if self._stopped_early(job):
                    return
                continue
            with self._lock:
                if job.training_start is None:
                    job.training_start = time.time()
            self._set(job, "Training")
            outcome = self._train(job)
            if outcome == "interrupted":
                continue  # SageMaker restarts the job itself, from its checkpoint
            return

    def _stopped_early(self, job: TrainingJob) -> bool:
        """A stop or failure before training: end the job; an interruption before training restarts it."""
        kind = job.stop_kind
        if kind == "interrupt":
            self._interrupted(job)
            return False
        if kind == "fail":
            self._end(job, "Failed", "Failed", job.fail_reason or "InternalServerError")
        elif kind == "reclaim":
            self._end(job, "Stopped", "Interrupted", MESSAGES["Reclaimed"])
        else:
            self._end(job, "Stopped", "Stopped", MESSAGES["Stopped"])
        return True

    def _interrupted(self, job: TrainingJob) -> None:
        with self._lock:
            job.stop_kind = None
            job.wake.clear()
            job.transition("Interrupted")
        logger.info("training job %s: spot interruption; restarting it", job.name)
        self._set(job, "Starting", message="Restarting the training job after a spot interruption")

    def _train(self, job: TrainingJob) -> str:
        """Run the hosts until they end or something stops them: ``ended`` or ``interrupted``."""
        self._start_hosts(job)
        began = time.time()
        last_sync = began
        runtime = float(job.stopping.get("MaxRuntimeInSeconds") or 86400)
        rule = self._interrupt_rule(job)
        while True:
            now = time.time()
            done = [h for h in job.hosts if not h.alive()]
            failed = [h for h in done if h.proc is not None and h.proc.returncode != 0]
            if failed or len(done) == len(job.hosts):
                break
            if rule is not None and now - began >= rule:
                with self._lock:
                    job.stop_kind = job.stop_kind or "interrupt"
                rule = None
            if job.stop_kind is not None:
                break
            if job.training_seconds + (now - began) > runtime:
                job.stop_kind = "runtime"
                break
            if self._waited_too_long(job):
                job.stop_kind = "maxwait"
                break
            if now - last_sync >= SYNC_EVERY_S:
                self._sync_checkpoints(job)
                last_sync = now
            job.wake.wait(_TICK)
        kind = job.stop_kind
        if kind is not None or failed:
            self._stop_hosts(job)
        for host in job.hosts:
            if host.reader is not None:
                host.reader.join(5)
        with self._lock:
            job.training_seconds += time.time() - began
        self._sync_checkpoints(job)
        if kind == "interrupt":
            self._interrupted(job)
            return "interrupted"
        if kind == "fail":
            self._end(job, "Failed", "Failed", job.fail_reason or "InternalServerError")
        elif kind == "reclaim":
            self._end(job, "Stopped", "Interrupted", MESSAGES["Reclaimed"])
        elif kind == "runtime":
            self._end(job, "Stopped", "MaxRuntimeExceeded", MESSAGES["MaxRuntimeExceeded"])
        elif kind == "maxwait":
            self._end(job, "Stopped", "MaxWaitTimeExceeded", MESSAGES["MaxWaitTimeExceeded"])
        elif kind is not None:
            self._end(job, "Stopped", "Stopped", MESSAGES["Stopped"])
        elif failed:
            code = _exit_code(failed[0].proc)
            self._end(job, "Failed", "Failed", f"AlgorithmError: , exit code: {code}")
        else:
            self._set(job, "Uploading")
            self._upload_model(job)
            if self._pause(job, self.step_seconds / 2) and job.stop_kind == "stop":
                self._end(job, "Stopped", "Stopped", MESSAGES["Stopped"])
            else:
                self._end(job, "Completed", "Completed", MESSAGES["Completed"])
        return "ended"

    def _interrupt_rule(self, job: TrainingJob) -> float | None:
        if not job.spot:
            return None
        with self._lock:
            for rule in self._interrupt_rules:
                if rule["left"] > 0 and (rule["contains"] is None or rule["contains"] in job.name):
                    rule["left"] -= 1
                    return float(rule["after"])
        return None

    def _end(self, job: TrainingJob, status: str, secondary: str, reason: str) -> None:
        with self._lock:
            now = time.time()
            if job.training_start is not None:
                job.training_end = now
            if status == "Failed" or secondary in ("MaxWaitTimeExceeded",):
                job.failure_reason = reason
            job.transition(secondary, status, reason if status != "Completed" else None)
            if job.transitions:
                job.transitions[-1]["EndTime"] = now
        logger.info("training job %s ended %s/%s: %s", job.name, status, secondary, reason)

    # ------------------------------------------------------------------ hosts

    def _start_hosts(self, job: TrainingJob) -> None:
        req = job.request
        count = int(req["ResourceConfig"].get("InstanceCount") or 1)
        names = [f"algo-{i}" for i in range(1, count + 1)]
        algorithm = req["AlgorithmSpecification"]
        command = list(algorithm.get("ContainerEntrypoint") or []) + list(algorithm.get("ContainerArguments") or [])
        if not command:
            raise ValueError("no ContainerEntrypoint: the emulator cannot run an image's default command")
        logs = logs_backends[DEFAULT_ACCOUNT_ID][self.region]
        stamp = int(time.time())
        hosts = []
        for name in names:
            root = self.job_root / job.name / name
            host = Host(name=name, root=root, stream=f"{job.name}/{name}-{stamp}{'' if job.runs == 1 else job.runs}")
            prior = next((h for h in job.hosts if h.name == name), None)
            if prior is not None:
                host.synced = prior.synced
            for sub in ("checkpoints", "model", "output", "input/config"):
                (host.opt_ml / sub).mkdir(parents=True, exist_ok=True)
            config = {"current_host": name, "hosts": names, "network_interface_name": "eth0"}
            (host.opt_ml / "input" / "config" / "resourceconfig.json").write_text(json.dumps(config))
            hosts.append(host)
        logs.ensure_log_group(LOG_GROUP)
        for host in hosts:
            logs.ensure_log_stream(LOG_GROUP, host.stream)
        job.hosts = hosts
        base = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        here = os.path.dirname(sys.executable)
        base["PATH"] = os.pathsep.join(p for p in (here, base.get("PATH", os.defpath)) if p)
        base.update(
            {
                "PYTHONUNBUFFERED": "1",
                "AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
                "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region,
            }
        )
        for host in hosts:
            here_ml = str(host.opt_ml)
            env = {**base, **{k: str(v).replace("/opt/ml", here_ml) for k, v in (req.get("Environment") or {}).items()}}
            env.update(
                {
                    "SM_HOSTS": json.dumps(names),
                    "SM_CURRENT_HOST": host.name,
                    "TRAINING_JOB_NAME": job.name,
                    "TRAINING_JOB_ARN": job.arn,
                }
            )
            env.setdefault("MASTER_ADDR", "127.0.0.1")  # the stand-in for DNS of algo-1
            argv = [arg.replace("/opt/ml", here_ml) for arg in command]
            host.proc = subprocess.Popen(
                argv,
                cwd=self.job_cwd or Path.cwd(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            host.reader = threading.Thread(target=self._pump_logs, args=(host,), daemon=True)
            host.reader.start()

    def _pump_logs(self, host: Host) -> None:
        assert host.proc is not None and host.proc.stdout is not None
        logs = logs_backends[DEFAULT_ACCOUNT_ID][self.region]
        with host.proc.stdout:
            for raw in iter(host.proc.stdout.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line:
                    continue
                try:
                    logs.put_log_events(
                        LOG_GROUP, host.stream, [{"timestamp": int(time.time() * 1000), "message": line}]
                    )
                except Exception:  # moto was reset under a job being stopped: drop the line
                    logger.debug("dropped a log line of %s", host.stream, exc_info=True)

    def _stop_hosts(self, job: TrainingJob) -> None:
        for host in job.hosts:
            if host.alive():
                _kill(host.proc, signal.SIGTERM)
        deadline = time.monotonic() + (0 if job.hurry.is_set() else self.grace_period)
        while time.monotonic() < deadline and any(h.alive() for h in job.hosts):
            time.sleep(_TICK)
        for host in job.hosts:
            _kill(host.proc, signal.SIGKILL)
            if host.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.proc.wait(timeout=5)

    # ------------------------------------------------------------------ S3

    def _checkpoint_location(self, job: TrainingJob) -> tuple[str, str, str] | None:
        config = job.request.get("CheckpointConfig")
        if not config:
            return None
        bucket, _, prefix = str(config["S3Uri"])[len("s3://") :].partition("/")
        local = str(config.get("LocalPath") or "/opt/ml/checkpoints")
        return bucket, prefix.rstrip("/"), local

    def _download_checkpoints(self, job: TrainingJob) -> str | None:
        where = self._checkpoint_location(job)
        if where is None:
            return None
        bucket, prefix, local = where
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix + "/" if prefix else ""
            )
            objects = [o["Key"] for page in pages for o in page.get("Contents") or []]
        except Exception as err:
            return f"ClientError: cannot read CheckpointConfig.S3Uri s3://{bucket}/{prefix}: {err}"
        count = int(job.request["ResourceConfig"].get("InstanceCount") or 1)
        for i in range(1, count + 1):
            root = self.job_root / job.name / f"algo-{i}" / local.lstrip("/")
            for key in objects:
                rel = key[len(prefix) + 1 :] if prefix else key
                if not rel:
                    continue
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        return None

    def _sync_checkpoints(self, job: TrainingJob) -> None:
        """Copy each host's changed checkpoint files to the S3 URI (``LATEST`` files last)."""
        where = self._checkpoint_location(job)
        if where is None:
            return
        bucket, prefix, local = where
        for host in job.hosts:
            root = host.root / local.lstrip("/")
            if not root.is_dir():
                continue
            # os.walk: the job adds and prunes checkpoint folders while this looks (errors are skipped)
            found = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
            files = sorted(found, key=lambda p: (p.name == "LATEST", str(p)))
            for path in files:
                try:
                    stat = path.stat()
                    rel = path.relative_to(root).as_posix()
                    if host.synced.get(rel) == (stat.st_mtime, stat.st_size):
                        continue
                    data = path.read_bytes()
                except OSError:  # written or removed while we looked: the next sync takes it
                    continue
                key = f"{prefix}/{rel}" if prefix else rel
                try:
                    self._s3.put_object(Bucket=bucket, Key=key, Body=data)
                except Exception:
                    logger.warning("training job %s: checkpoint upload of %s failed", job.name, key, exc_info=True)
                    continue
                host.synced[rel] = (stat.st_mtime, stat.st_size)

    def _upload_model(self, job: TrainingJob) -> None:
        output = str(job.request["OutputDataConfig"]["S3OutputPath"]).rstrip("/")
        bucket, _, prefix = output[len("s3://") :].partition("/")
        key = "/".join(p for p in (prefix, job.name, "output", "model.tar.gz") if p)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            model = job.hosts[0].opt_ml / "model"
            if model.is_dir():
                tar.add(model, arcname=".")
        try:
            self._s3.put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())
        except Exception as err:
            logger.warning("training job %s: model upload failed: %s", job.name, err)
        job.artifacts = f"s3://{bucket}/{key}"


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


def _kill(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _exit_code(proc: subprocess.Popen[bytes] | None) -> int:
    code = proc.returncode if proc is not None else None
    if code is None:
        return 1
    return 128 - code if code < 0 else code


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
    parser = argparse.ArgumentParser(prog="python -m emulators.aws_sagemaker", description=__doc__.split("\n", 1)[0])
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
