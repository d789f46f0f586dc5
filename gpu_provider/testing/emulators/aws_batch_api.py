"""The AWS Batch emulator's API side: which Batch or CloudWatch Logs action a request is, how Batch words
its errors, and the patches of moto's Batch models that answer as real Batch does (:class:`BatchApi`, mixed
into :class:`~gpu_provider.testing.emulators.aws_batch.BatchEmulator`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import botocore.session
from moto.batch import models as batch_models
from moto.batch.exceptions import ClientException
from moto.moto_api import state_manager

from gpu_provider.testing.emulators.aws_batch_jobs import env_dict, job_state
from gpu_provider.testing.emulators.core import SERVER_ERROR, THROTTLED, current_body

MAX_DESCRIBE_JOBS = 100

#: moto must never advance a job's state by itself (on reads): the emulator's job thread sets every state.
_NO_AUTOMATIC_PROGRESS = {"progression": "manual", "times": 10**9}


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


class BatchApi:
    """Routes requests to Batch actions and answers what moto's Batch gets wrong (a mixin over the emulator's
    runs, lock, patches and faults)."""

    # ------------------------------------------------------------------ routing

    def _action_of(self, environ: dict[str, Any]) -> str | None:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("Logs_"):
            return "logs:" + target.split(".", 1)[1]
        if target.startswith("AmazonSQS."):  # the event queue's reads (JSON protocol), counted per client
            return "sqs:" + target.split(".", 1)[1]
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
                job_def = backend.get_job_definition(job_def_id)
                if job_def is not None and getattr(job_def, "status", "ACTIVE") != "ACTIVE":
                    # moto accepts it; Batch takes new jobs on ACTIVE revisions only
                    raise ClientException(f"Job definition {job_def_id} is {job_def.status}: it cannot take new jobs.")
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
