"""The Pods, Jobs, Services and Events of one namespace, as the backend reads and changes them: get,
paged lists (by label, by attempt, active pods only), create-or-adopt, label, delete."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, TaskKey
from gpu_provider.backends.common import attempt_in_name
from gpu_provider.backends.kubernetes.calls import (
    PATIENT_ATTEMPTS,
    POLL_ATTEMPTS,
    Api,
    call,
    exists,
    raw,
    status_of,
)
from gpu_provider.backends.kubernetes.manifests import ANNOTATION_GPUS, JOB, LABEL_ATTEMPT_NAME, POD
from gpu_provider.backends.kubernetes.mapping import parse_time, rank_of
from gpu_provider.backends.kubernetes.ownership import task_of
from gpu_provider.exceptions import GpuJobError

log = logging.getLogger(__name__)

LIST_PAGE = 500
#: attempt names in one ``in (...)`` label selector (a request line of about 7 KB)
SELECTOR_NAMES = 100
#: the pods still running or waiting (pods that ended stay until the pod garbage collector removes them)
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def handle_of(obj: Mapping[str, Any], kind: str, *, backend: str, namespace: str) -> JobHandle:
    """The handle of a Pod or Job read from the API (its attempt number is in its name)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    name = str(meta.get("name"))
    attempt = attempt_in_name(name)
    attempt_label = str(labels.get(names.TAG_ATTEMPT) or "")
    spec = obj.get("spec") or {}
    nodes = int(spec.get("completions") or 1) if kind == JOB else 1
    return JobHandle(
        backend=backend,
        job_id=name,
        name=name,
        attempt=attempt if attempt is not None else int(attempt_label or 1),
        capacity=str(labels.get(names.TAG_CAPACITY) or names.ON_DEMAND),
        submitted_at=parse_time(meta.get("creationTimestamp")) or time.time(),
        extra={
            "kind": kind,
            "namespace": str(meta.get("namespace") or namespace),
            "uid": str(meta.get("uid") or ""),
            "nodes": nodes,
            "gpus": float(notes.get(ANNOTATION_GPUS) or 1),
        },
    )


def _api_message(err: BaseException) -> str:
    body = getattr(err, "body", None)
    try:
        return str(json.loads(body).get("message")) if body else str(err)
    except (ValueError, AttributeError):
        return str(body or err)[:500]


class Objects:
    """The objects of ``namespace`` through ``api`` (every call retried by :func:`~.calls.call`).

    :param api: the backend's client
    :param namespace: the namespace of the pods, jobs, services and events
    """

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    def get(self, kind: str, name: str, *, attempts: int = PATIENT_ATTEMPTS) -> dict[str, Any] | None:
        """GET a Pod, Job or Service by name; ``None`` when the API answers 404."""
        api = self.api
        read = {
            "Pod": lambda: raw(api.core.read_namespaced_pod, name, self.namespace),
            "Job": lambda: raw(api.batch.read_namespaced_job, name, self.namespace),
            "Service": lambda: raw(api.core.read_namespaced_service, name, self.namespace),
        }[kind]
        try:
            return call(f"read {kind} {name}", read, attempts=attempts)
        except Exception as err:
            if status_of(err) == 404:
                return None
            raise

    def select(
        self, kind: str, selector: str, *, attempts: int = POLL_ATTEMPTS, fields: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` in the namespace matching ``selector`` (and the field selector
        ``fields``), one request per 500."""
        api = self.api
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"label_selector": selector, "limit": LIST_PAGE}
            if fields:
                kwargs["field_selector"] = fields
            if token:
                kwargs["_continue"] = token
            fn = api.core.list_namespaced_pod if kind == POD else api.batch.list_namespaced_job
            try:
                page = call(
                    f"list {kind}s",
                    lambda kwargs=kwargs, fn=fn: raw(fn, self.namespace, **kwargs),  # type: ignore[misc]
                    attempts=attempts,
                )
            except Exception as err:
                if not fields or status_of(err) != 400:
                    raise
                # a server that refuses the field selector (Kubernetes serves it for pods): filter here
                log.warning("The Kubernetes API refused fieldSelector=%s (%s); listing without it.", fields, err)
                wanted = ("Succeeded", "Failed") if fields == ACTIVE_PODS else ()
                listed = self.select(kind, selector, attempts=attempts)
                return [o for o in listed if (o.get("status") or {}).get("phase") not in wanted]
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def by_attempt(self, kind: str, attempt_names: Sequence[str]) -> list[dict[str, Any]]:
        """The objects of ``kind`` labelled with one of ``attempt_names`` (one LIST per
        :data:`SELECTOR_NAMES` names)."""
        found: list[dict[str, Any]] = []
        for start in range(0, len(attempt_names), SELECTOR_NAMES):
            chunk = attempt_names[start : start + SELECTOR_NAMES]
            if len(chunk) == 1:
                selector = f"{LABEL_ATTEMPT_NAME}={chunk[0]}"
            else:
                selector = f"{LABEL_ATTEMPT_NAME} in ({','.join(chunk)})"
            found.extend(self.select(kind, selector))
        return found

    def attempts(self, selector: str, *, active: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """Bare pods and Jobs of this provider matching ``selector`` (a Job's pods left out); with
        ``active``, ended pods are not fetched."""
        found: list[tuple[str, dict[str, Any]]] = []
        fields = ACTIVE_PODS if active else None
        # the Job LIST runs in a thread while the pod LIST runs here: a submit's attempt lookup waits for
        # one round trip instead of two; both are reads, and both end before this returns
        jobs: list[dict[str, Any]] = []
        failed: list[BaseException] = []

        def list_jobs() -> None:
            try:
                jobs.extend(self.select(JOB, selector, attempts=PATIENT_ATTEMPTS))
            except BaseException as err:
                failed.append(err)

        thread = threading.Thread(target=list_jobs, name="gpu-provider-list-jobs", daemon=True)
        thread.start()
        try:
            pods = self.select(POD, selector, attempts=PATIENT_ATTEMPTS, fields=fields)
        finally:
            thread.join()
        if failed:
            raise failed[0]
        for pod in pods:
            if ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT_NAME) == pod["metadata"]["name"]:
                found.append((POD, pod))
        for job in jobs:
            found.append((JOB, job))
        return found

    def attempt_pods(self, name: str) -> list[dict[str, Any]]:
        """The pods of the attempt ``name`` (by its label), in rank order."""
        pods = self.select(POD, f"{LABEL_ATTEMPT_NAME}={name}")
        pods.sort(key=lambda p: (rank_of(p), str((p.get("metadata") or {}).get("creationTimestamp"))))
        return pods

    def create(self, manifest: dict[str, Any], task: TaskKey) -> tuple[dict[str, Any], bool]:
        """Create ``manifest``; an object of that name already there is adopted when it belongs to ``task``
        (or to no task), else refused. Returns the object and whether it was there before this call (the
        first send was refused with 409; after a send answered 5xx, that send may have created it)."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        api = self.api
        send: Callable[[], dict[str, Any]] = {
            "Pod": lambda: raw(api.core.create_namespaced_pod, self.namespace, manifest),
            "Job": lambda: raw(api.batch.create_namespaced_job, self.namespace, manifest),
            "Service": lambda: raw(api.core.create_namespaced_service, self.namespace, manifest),
        }[kind]
        sends = 0

        def create() -> dict[str, Any]:
            nonlocal sends
            sends += 1
            return send()

        try:
            return call(f"create {kind} {name}", create), False
        except Exception as err:
            if status_of(err) != 409:
                if status_of(err) in (400, 403, 422):
                    raise GpuJobError(
                        f"Kubernetes refused to create {kind} {self.namespace}/{name} (HTTP {status_of(err)}): "
                        f"{_api_message(err)}"
                    ) from err
                raise
        existing = self.get(kind, name)
        if existing is None:
            raise GpuJobError(f"Kubernetes {kind} {self.namespace}/{name} exists and vanished while being adopted")
        if kind != "Service" and task_of(existing) not in (task, None):
            raise GpuJobError(
                f"Kubernetes {kind} {self.namespace}/{name} exists and belongs to another task "
                f"({task_of(existing)}); not adopting it"
            )
        log.info("Kubernetes %s %s/%s exists already for this attempt: adopting it.", kind, self.namespace, name)
        return existing, sends == 1

    def patch(self, kind: str, name: str, body: Mapping[str, Any], *, what: str) -> dict[str, Any]:
        """PATCH the Pod or Job ``name`` with ``body`` (a merge patch); ``what`` names the call in errors."""
        api = self.api
        fn = api.core.patch_namespaced_pod if kind == POD else api.batch.patch_namespaced_job
        return call(what, lambda: raw(fn, name, self.namespace, body))

    def delete(self, kind: str, name: str) -> bool:
        """DELETE the Pod, or the Job and its Service, with foreground propagation; ``False`` when the
        object was gone already."""
        api = self.api
        body = {"propagationPolicy": "Foreground"}
        if kind == POD:
            return exists(
                lambda: call("delete pod", lambda: raw(api.core.delete_namespaced_pod, name, self.namespace, body=body))
            )
        deleted = exists(
            lambda: call("delete job", lambda: raw(api.batch.delete_namespaced_job, name, self.namespace, body=body))
        )
        exists(
            lambda: call(
                "delete service", lambda: raw(api.core.delete_namespaced_service, name, self.namespace, body=body)
            )
        )
        return deleted

    def create_event(self, event: Mapping[str, Any]) -> None:
        api = self.api
        call("create event", lambda: raw(api.core.create_namespaced_event, self.namespace, event))

    def events(self, field_selector: str) -> list[dict[str, Any]]:
        """The namespace's Events matching ``field_selector`` (one request)."""
        api = self.api
        page = call(
            "list events", lambda: raw(api.core.list_namespaced_event, self.namespace, field_selector=field_selector)
        )
        return list(page.get("items") or [])
