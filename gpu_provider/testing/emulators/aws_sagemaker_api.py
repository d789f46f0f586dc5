"""The SageMaker emulator's training-job API: the WSGI app in front of moto that answers it, which action a
request is, how SageMaker words its errors, and the rules moto does not enforce (:class:`SageMakerApi`, a
mixin of :class:`~gpu_provider.testing.emulators.aws_sagemaker.SageMakerEmulator`)."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID

from gpu_provider.testing.emulators.aws_sagemaker_jobs import TrainingJob
from gpu_provider.testing.emulators.core import SERVER_ERROR, THROTTLED

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


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def _validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


class SageMakerApi:
    """The training-job actions, each ``_api_<Action>`` (a mixin over the emulator's jobs, lock and settings)."""

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
            jobs = [j for j in jobs if not any(hidden in j.name for hidden in self._unlisted)]
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


class _SageMakerApp:
    """Answers the training-job API; everything else goes to moto."""

    def __init__(self, emulator: SageMakerApi, app: Any) -> None:
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
    if service == "AmazonSQS":  # the event queue's reads (JSON protocol), counted per client
        return "sqs:" + action
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
