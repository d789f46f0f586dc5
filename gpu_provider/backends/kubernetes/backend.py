"""The Kubernetes backend: GPU pods on Karpenter-provisioned nodes (EKS), spot or on-demand.

A single-node attempt is one Pod; a multi-node attempt is an Indexed Job (one pod per rank,
``backoffLimit: 0``, a ``podFailurePolicy`` that tells a disruption from the program's failure)
plus a headless Service that gives rank 0 a DNS name. Capacity is chosen by node selector: a spot
attempt asks for ``karpenter.sh/capacity-type: spot`` on the spot NodePool, an on-demand attempt
for ``on-demand`` on the on-demand NodePool; Karpenter launches a node for the pending pod. What
the manifests hold is in :mod:`~gpu_provider.backends.kubernetes.manifests`, what the answers mean
in :mod:`~gpu_provider.backends.kubernetes.mapping`.

Status reads ask only for what they need: a poll of a few attempts is one LIST of their pods by the
attempt's label (and of their Jobs, for multi-node attempts); a poll of many (the triggerer's shared
poller) is one LIST of the namespace's *active* pods of this provider, whatever their number, plus the
attempts not among them (ended since the last tick) by their label. Pods that ended and that nobody
asks about (left for the pod garbage collector) are never fetched. Logs are read from a cursor
(:mod:`~gpu_provider.backends.kubernetes.logs`). The request pattern is described in
``docs/how-to/kubernetes-notes.md``.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.base import (
    LOG_READ_BYTES,
    MAX_LOG_LINE_CHARS,
    Backend,
    Capabilities,
    EventSource,
    JobHandle,
    JobRequest,
    JobState,
    JobStatus,
    LogChunk,
    OwnedJob,
    OwnerRead,
    PollResult,
    TaskKey,
    clip_line,
    lookup_key,
    map_state,
)
from gpu_provider.backends.common import config_flag, run_bounded, text_option
from gpu_provider.backends.kubernetes import options
from gpu_provider.backends.kubernetes.calls import (
    PATIENT_ATTEMPTS,
    POLL_ATTEMPTS,
    Api,
    call,
    exists,
    raw,
    read_log,
    status_of,
)
from gpu_provider.backends.kubernetes.logs import LONG_LINE_BYTES, PodMark, split_stamped, take
from gpu_provider.backends.kubernetes.manifests import (
    ANNOTATION_DAG_ID,
    ANNOTATION_GPUS,
    ANNOTATION_MAX_RUNTIME,
    ANNOTATION_RUN_ID,
    ANNOTATION_TASK_ID,
    CONTAINER,
    GPU_NODE_LABELS,
    LABEL_ATTEMPT_NAME,
    MANAGED_BY,
    MANAGER,
    Placement,
    check_manifest,
    is_dns1123_label,
    is_dns1123_subdomain,
    job_manifests,
    label_key_problem,
    label_value,
    map_index_label,
    pod_manifest,
)
from gpu_provider.backends.kubernetes.mapping import (
    CANCEL_ANNOTATION,
    EVENT_CANCELLED,
    EVENT_FAILED,
    STATE_TABLE,
    condition,
    exit_code,
    interruption_of,
    job_remote_state,
    node_fault,
    parse_time,
    pod_remote_state,
    pod_times,
    rank_of,
)
from gpu_provider.exceptions import GpuJobError, GpuJobStatusError
from gpu_provider.job import GpuResources

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "default"
DEFAULT_SPOT_NODE_POOL = "gpu-spot"
DEFAULT_ON_DEMAND_NODE_POOL = "gpu-on-demand"
#: class -> the lowest ``priority=`` that gets it (the PriorityClasses in docker/karpenter/)
DEFAULT_PRIORITY_CLASSES = {"gpu-low": -(2**31) + 1, "gpu-normal": 0, "gpu-high": 100}
#: seconds an attempt may take from creation to running: a GPU node takes minutes to launch and
#: pull a multi-gigabyte image (``KubernetesPodOperator`` waits 120 s)
DEFAULT_STARTUP_TIMEOUT_S = 900.0
DEFAULT_MASTER_PORT = 29500
DEFAULT_TTL_AFTER_FINISHED_S = 3600
LIST_PAGE = 500
#: a poll of at most this many attempts selects their pods by label; more share one LIST of active pods
FEW_ATTEMPTS = 20
#: attempt names in one ``in (...)`` label selector (a request line of about 7 KB)
SELECTOR_NAMES = 100
#: the pods still running or waiting (pods that ended stay until the pod garbage collector removes them)
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
#: pods of a multi-node attempt whose last lines :meth:`KubernetesBackend.output_tail` reads
TAIL_PODS = 8
POD, JOB = "Pod", "Job"
_JOB_NAME = re.compile(r"-t(\d+)-a(\d+)$")


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesBackend(Backend):
    """Runs each attempt as a Pod (one node) or an Indexed Job (several) on Karpenter GPU nodes.

    Every option falls back to the ``[gpu_provider]`` config key named in brackets.

    :param kubernetes_conn_id: Airflow Kubernetes connection (in-cluster, kubeconfig path or a
        kubeconfig in its extras) [``kubernetes_conn_id``, default ``kubernetes_default``].
    :param namespace: namespace of the pods, jobs and services [``kubernetes_namespace``, default ``default``].
    :param spot_node_pool: Karpenter NodePool of spot attempts [``kubernetes_spot_node_pool``, default
        ``gpu-spot``]; an empty string (``-``) places by capacity type only.
    :param on_demand_node_pool: NodePool of on-demand attempts [``kubernetes_on_demand_node_pool``,
        default ``gpu-on-demand``].
    :param service_account: service account of the pods (e.g. one with an IAM role for S3
        checkpoints) [``kubernetes_service_account``].
    :param image_pull_secrets: Secrets to pull the image with, comma-separated or a list
        [``kubernetes_image_pull_secrets``].
    :param priority_classes: PriorityClass of each priority, ``{"class": lowest priority}`` (or that as
        JSON): a job gets the class with the highest bound not above its ``priority=`` (0 without one)
        [``kubernetes_priority_classes``, default ``gpu-low``/``gpu-normal`` from 0/``gpu-high`` from 100].
    :param node_selector: labels to add to every pod's node selector (JSON object) [``kubernetes_node_selector``].
    :param tolerations: tolerations to add to the ``nvidia.com/gpu`` one (JSON list) [``kubernetes_tolerations``].
    :param secrets: environment variables from Kubernetes Secrets, ``{"HF_TOKEN": "secret-name/key"}``:
        the value never passes through Airflow [``kubernetes_secrets``].
    :param startup_timeout: seconds from creation to running: past it a pod still waiting for a
        node is given up as a capacity timeout, one whose container does not start fails
        [``kubernetes_startup_timeout``, default 900].
    :param fractional_gpu_resource: the extended resource a job with ``gpus`` below 1 asks one of:
        a MIG profile (``nvidia.com/mig-1g.10gb``) or the device plugin's shared resource
        (``nvidia.com/gpu.shared``) [``kubernetes_fractional_gpu_resource``]; unset: fractions refused.
    :param dashboard_url: a link for the task's extra link, ``{namespace}``, ``{name}`` and ``{kind}``
        filled in [``kubernetes_dashboard_url``].
    :param master_port: ``MASTER_PORT`` of multi-node jobs (default 29500).
    :param ttl_after_finished: seconds an ended multi-node Job (and its pods) is kept
        [``kubernetes_ttl_after_finished``, default 3600].
    """

    name: ClassVar[str] = "kubernetes"
    #: which cluster, namespace and identity the pods run as, where their secrets come from, where
    #: the console link points: from the [gpu_provider] config or literal DAG code, never a template
    #: (trigger-form params are untrusted)
    fixed_options: ClassVar[frozenset[str]] = frozenset(
        {"kubernetes_conn_id", "namespace", "service_account", "secrets", "image_pull_secrets", "dashboard_url"}
    )
    service: ClassVar[str] = "Kubernetes"
    capabilities: ClassVar[Capabilities] = Capabilities(
        image_required=True,
        unique_names=True,  # a second create of one name is refused (409): submit adopts the object
    )
    default_poll_interval: ClassVar[float] = 5.0
    #: a log read costs one request per pod: the worker copies an attempt's log when it ends
    stream_logs_when_deferred: ClassVar[bool] = False

    def __init__(
        self,
        *,
        kubernetes_conn_id: str | None = None,
        namespace: str | None = None,
        spot_node_pool: str | None = None,
        on_demand_node_pool: str | None = None,
        service_account: str | None = None,
        image_pull_secrets: Sequence[str] | str | None = None,
        priority_classes: Mapping[str, int] | str | None = None,
        node_selector: Mapping[str, str] | str | None = None,
        tolerations: Sequence[Mapping[str, Any]] | str | None = None,
        secrets: Mapping[str, str] | str | None = None,
        startup_timeout: float | str | None = None,
        fractional_gpu_resource: str | None = None,
        dashboard_url: str | None = None,
        master_port: int | str = DEFAULT_MASTER_PORT,
        ttl_after_finished: int | str | None = None,
    ) -> None:
        self.kubernetes_conn_id = text_option(
            "kubernetes_conn_id", kubernetes_conn_id, config_key="kubernetes_conn_id", default="kubernetes_default"
        )
        self.namespace: str = (
            text_option("namespace", namespace, config_key="kubernetes_namespace", default=DEFAULT_NAMESPACE) or ""
        )
        if not is_dns1123_label(self.namespace):
            raise ValueError(f"namespace={self.namespace!r} must be a DNS-1123 label (a Kubernetes namespace name)")
        self.spot_node_pool = options.node_pool(
            "spot_node_pool", spot_node_pool, "kubernetes_spot_node_pool", DEFAULT_SPOT_NODE_POOL
        )
        self.on_demand_node_pool = options.node_pool(
            "on_demand_node_pool", on_demand_node_pool, "kubernetes_on_demand_node_pool", DEFAULT_ON_DEMAND_NODE_POOL
        )
        self.service_account = text_option("service_account", service_account, config_key="kubernetes_service_account")
        self.image_pull_secrets = options.secret_names(
            "image_pull_secrets", image_pull_secrets, "kubernetes_image_pull_secrets"
        )
        self.priority_classes = options.priority_classes(priority_classes, DEFAULT_PRIORITY_CLASSES)
        self.node_selector = options.node_selector(node_selector)
        self.tolerations = options.tolerations(tolerations)
        self.secrets = options.secret_refs(secrets)
        self.startup_timeout = options.seconds(
            "startup_timeout", startup_timeout, "kubernetes_startup_timeout", DEFAULT_STARTUP_TIMEOUT_S
        )
        self.fractional_gpu_resource = text_option(
            "fractional_gpu_resource", fractional_gpu_resource, config_key="kubernetes_fractional_gpu_resource"
        )
        if self.fractional_gpu_resource and label_key_problem(self.fractional_gpu_resource):
            raise ValueError(
                f"fractional_gpu_resource={self.fractional_gpu_resource!r} is not a resource name "
                "(e.g. nvidia.com/mig-1g.10gb or nvidia.com/gpu.shared)"
            )
        self.dashboard_url = text_option("dashboard_url", dashboard_url, config_key="kubernetes_dashboard_url")
        try:
            port = int(str(master_port).strip())
        except ValueError:
            port = -1
        if not 1 <= port <= 65535:
            raise ValueError(f"master_port={master_port!r} must be a TCP port number (1-65535)")
        self.master_port = port
        self.ttl_after_finished = int(
            options.seconds(
                "ttl_after_finished", ttl_after_finished, "kubernetes_ttl_after_finished", DEFAULT_TTL_AFTER_FINISHED_S
            )
        )
        self._api = Api(self.kubernetes_conn_id or "kubernetes_default")

    def options(self) -> dict[str, Any]:
        return {
            "kubernetes_conn_id": self.kubernetes_conn_id,
            "namespace": self.namespace,
            "spot_node_pool": self.spot_node_pool or "-",
            "on_demand_node_pool": self.on_demand_node_pool or "-",
            "service_account": self.service_account,
            "image_pull_secrets": list(self.image_pull_secrets),
            "priority_classes": dict(self.priority_classes),
            "node_selector": dict(self.node_selector),
            "tolerations": [dict(t) for t in self.tolerations],
            "secrets": {k: f"{s}/{key}" for k, (s, key) in self.secrets.items()},
            "startup_timeout": self.startup_timeout,
            "fractional_gpu_resource": self.fractional_gpu_resource,
            "dashboard_url": self.dashboard_url,
            "master_port": self.master_port,
            "ttl_after_finished": self.ttl_after_finished,
        }

    def validate(
        self,
        resources: GpuResources,
        capacity: str,
        *,
        multi_capacity: bool,
        priority: int | None = None,
        max_runtime_s: float | None = None,
    ) -> None:
        super().validate(
            resources, capacity, multi_capacity=multi_capacity, priority=priority, max_runtime_s=max_runtime_s
        )
        if resources.fractional and not self.fractional_gpu_resource:
            raise ValueError(
                f"resources.gpus={resources.gpus!r}: the kubernetes backend shares a GPU through a MIG profile or "
                "the device plugin's shared resource; set fractional_gpu_resource (e.g. 'nvidia.com/mig-1g.10gb') "
                "or [gpu_provider] kubernetes_fractional_gpu_resource, or use gpus=1"
            )
        if resources.gpu_type and resources.gpu_type not in GPU_NODE_LABELS:
            raise ValueError(
                f"resources.gpu_type={resources.gpu_type!r}: the kubernetes backend places NVIDIA GPUs by "
                f"karpenter.k8s.aws/instance-gpu-name; allowed: {', '.join(GPU_NODE_LABELS)}"
            )

    # --- manifests ----------------------------------------------------------------------------------

    def priority_class(self, priority: int | None) -> str | None:
        """The PriorityClass of a ``priority=`` (the class with the highest bound not above it)."""
        if not self.priority_classes:
            return None
        value = 0 if priority is None else priority
        ranked = sorted(self.priority_classes.items(), key=lambda kv: kv[1])
        chosen = ranked[0][0]
        for name, bound in ranked:
            if bound <= value:
                chosen = name
        return chosen

    def placement(self, request: JobRequest) -> Placement:
        return Placement(
            namespace=self.namespace,
            node_pool=self.spot_node_pool if request.capacity == names.SPOT else self.on_demand_node_pool,
            service_account=self.service_account,
            image_pull_secrets=self.image_pull_secrets,
            priority_class=self.priority_class(request.priority),
            node_selector=self.node_selector,
            tolerations=self.tolerations,
            secrets=self.secrets,
            fractional_resource=self.fractional_gpu_resource,
            master_port=self.master_port,
            ttl_after_finished_s=self.ttl_after_finished,
        )

    def manifests(self, request: JobRequest) -> list[dict[str, Any]]:
        """What :meth:`submit` creates for ``request``: a Pod, or a Job and its Service (checked)."""
        placement = self.placement(request)
        if request.resources.nodes == 1:
            built = [pod_manifest(request, placement)]
        else:
            built = list(job_manifests(request, placement))
        for manifest in built:
            check_manifest(manifest)
        return built

    # --- the contract ---------------------------------------------------------------------------------

    def submit(self, request: JobRequest) -> JobHandle:
        """Create the attempt's Pod, or its Job and Service; an existing object of that name is adopted."""
        self.validate_image(request.image)
        built = self.manifests(request)
        identity = request.identity
        kind = POD if request.resources.nodes == 1 else JOB
        created = self._create(built[0], identity.task)
        if kind == JOB:
            service = dict(built[1])
            owner = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": identity.name,
                "uid": str((created.get("metadata") or {}).get("uid") or ""),
                "blockOwnerDeletion": True,
            }
            service["metadata"] = {**service["metadata"], "ownerReferences": [owner]}
            self._create(service, identity.task)
        log.info(
            "Created Kubernetes %s %s/%s (%s, node pool %s).",
            kind,
            self.namespace,
            identity.name,
            request.capacity,
            self.placement(request).node_pool or "any",
        )
        return self._handle(created, kind)

    def _create(self, manifest: dict[str, Any], task: TaskKey) -> dict[str, Any]:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        api = self._api
        create = {
            "Pod": lambda: raw(api.core.create_namespaced_pod, self.namespace, manifest),
            "Job": lambda: raw(api.batch.create_namespaced_job, self.namespace, manifest),
            "Service": lambda: raw(api.core.create_namespaced_service, self.namespace, manifest),
        }[kind]
        try:
            return call(f"create {kind} {name}", create)
        except Exception as err:
            if status_of(err) != 409:
                if status_of(err) in (400, 403, 422):
                    raise GpuJobError(
                        f"Kubernetes refused to create {kind} {self.namespace}/{name} (HTTP {status_of(err)}): "
                        f"{_api_message(err)}"
                    ) from err
                raise
        existing = self._get(kind, name)
        if existing is None:
            raise GpuJobError(f"Kubernetes {kind} {self.namespace}/{name} exists and vanished while being adopted")
        if kind != "Service" and _task_of(existing) not in (task, None):
            raise GpuJobError(
                f"Kubernetes {kind} {self.namespace}/{name} exists and belongs to another task "
                f"({_task_of(existing)}); not adopting it"
            )
        log.info("Kubernetes %s %s/%s exists already for this attempt: adopting it.", kind, self.namespace, name)
        return existing

    def _get(self, kind: str, name: str, *, attempts: int = PATIENT_ATTEMPTS) -> dict[str, Any] | None:
        api = self._api
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

    def _handle(self, obj: Mapping[str, Any], kind: str) -> JobHandle:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        notes = meta.get("annotations") or {}
        name = str(meta.get("name"))
        match = _JOB_NAME.search(name)
        attempt_label = str(labels.get(names.TAG_ATTEMPT) or "")
        spec = obj.get("spec") or {}
        nodes = int(spec.get("completions") or 1) if kind == JOB else 1
        return JobHandle(
            backend=self.name,
            job_id=name,
            name=name,
            attempt=int(match.group(2)) if match else int(attempt_label or 1),
            capacity=str(labels.get(names.TAG_CAPACITY) or names.ON_DEMAND),
            submitted_at=parse_time(meta.get("creationTimestamp")) or time.time(),
            extra={
                "kind": kind,
                "namespace": str(meta.get("namespace") or self.namespace),
                "uid": str(meta.get("uid") or ""),
                "nodes": nodes,
                "gpus": float(notes.get(ANNOTATION_GPUS) or 1),
            },
        )

    # --- status -------------------------------------------------------------------------------------

    def _list(
        self, kind: str, selector: str, *, attempts: int = POLL_ATTEMPTS, fields: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` in the namespace matching ``selector`` (and the field selector
        ``fields``), one request per 500."""
        api = self._api
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
                listed = self._list(kind, selector, attempts=attempts)
                return [o for o in listed if (o.get("status") or {}).get("phase") not in wanted]
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        """The pods (and Jobs) of ``handles`` and nothing else that ended.

        Up to :data:`FEW_ATTEMPTS` attempts: one LIST of their pods by the attempt's label (a sync
        wait, ``on_kill``, a recovery). More (the shared poller): one LIST of this provider's active
        pods in the namespace, however many, plus one LIST by label of the attempts not among them
        (those that ended since the last tick). Multi-node attempts add one LIST of their Jobs and
        of their pods (a rank that finished is no longer active)."""
        if not handles:
            return {}
        wanted = sorted({h.name for h in handles})
        multi = sorted({h.name for h in handles if h.extra.get("kind") == JOB})
        by_attempt: dict[str, dict[str, dict[str, Any]]] = {}

        def keep(pods: list[dict[str, Any]]) -> None:
            for pod in pods:
                meta = pod.get("metadata") or {}
                label = (meta.get("labels") or {}).get(LABEL_ATTEMPT_NAME)
                if label:
                    by_attempt.setdefault(str(label), {})[str(meta.get("name"))] = pod

        if len(wanted) <= FEW_ATTEMPTS:
            keep(self._by_attempt(POD, wanted))
        else:
            keep(self._list(POD, f"{MANAGED_BY}={MANAGER}", fields=ACTIVE_PODS))
            missing = [n for n in wanted if n not in by_attempt or n in multi]
            keep(self._by_attempt(POD, missing))
        jobs = {str(j["metadata"]["name"]): j for j in self._by_attempt(JOB, multi)} if multi else {}
        grouped = {name: list(pods.values()) for name, pods in by_attempt.items()}
        result: PollResult = {}
        for handle in handles:
            try:
                result[handle.job_id] = self._status(handle, grouped, jobs)
            except ValueError as err:  # a state this version does not know: this job alone
                result[handle.job_id] = GpuJobStatusError(
                    f"Kubernetes {handle.extra.get('kind', POD)} {self.namespace}/{handle.name}: {err}"
                )
            except Exception as err:
                result[handle.job_id] = GpuJobStatusError(
                    f"Kubernetes {handle.extra.get('kind', POD)} {self.namespace}/{handle.name}: "
                    f"{type(err).__name__}: {err}"
                )
        return result

    def _by_attempt(self, kind: str, attempt_names: Sequence[str]) -> list[dict[str, Any]]:
        """The objects of ``kind`` labelled with one of ``attempt_names`` (one LIST per
        :data:`SELECTOR_NAMES` names)."""
        found: list[dict[str, Any]] = []
        for start in range(0, len(attempt_names), SELECTOR_NAMES):
            chunk = attempt_names[start : start + SELECTOR_NAMES]
            if len(chunk) == 1:
                selector = f"{LABEL_ATTEMPT_NAME}={chunk[0]}"
            else:
                selector = f"{LABEL_ATTEMPT_NAME} in ({','.join(chunk)})"
            found.extend(self._list(kind, selector))
        return found

    def _status(
        self, handle: JobHandle, by_attempt: Mapping[str, list[dict[str, Any]]], jobs: Mapping[str, dict[str, Any]]
    ) -> JobStatus:
        kind = str(handle.extra.get("kind") or POD)
        pods = by_attempt.get(handle.name, [])
        if kind == JOB:
            job = jobs.get(handle.name)
            if job is None:
                return self._gone(handle)
            obj: Mapping[str, Any] = job
            remote, reason = job_remote_state(job, pods)
        else:
            bare = [p for p in pods if p["metadata"]["name"] == handle.name]
            if not bare:
                return self._gone(handle)
            obj = bare[0]
            remote, reason = pod_remote_state(obj)
        state = map_state(STATE_TABLE, remote, backend=self.name)
        interruption = interruption_of(state, remote, reason)
        created = parse_time((obj.get("metadata") or {}).get("creationTimestamp")) or handle.submitted_at
        waited = time.time() - created
        stop: str | None = None
        if state is JobState.FAILED and remote.startswith("Pending:"):
            stop = (
                f"its container can never start ({remote.partition(':')[2]}: {reason}); the attempt fails "
                "instead of waiting (check the image name, the pull secrets and the Secrets it refers to)"
            )
            reason = stop
        elif state is JobState.QUEUED and waited > self.startup_timeout:
            stop = names.CAPACITY_TIMEOUT_MARK + (
                f"no node for {waited:.0f}s, past startup_timeout={self.startup_timeout:g}s ({reason})"
            )
            state, reason, interruption = JobState.CANCELLED, stop, names.CAPACITY_TIMEOUT
        elif state is JobState.STARTING and waited > self.startup_timeout:
            stop = (
                f"not running {waited:.0f}s after creation, past startup_timeout={self.startup_timeout:g}s ({reason})"
            )
            state, reason = JobState.FAILED, stop
        status = self._status_of(handle, obj, pods, state, reason, interruption, remote)
        if state is JobState.FAILED and interruption is None and stop is None:
            members = pods if kind == JOB else [obj]
            found = node_fault(members, nodes=int(handle.extra.get("nodes") or 1))
            if found is not None:  # the node or its GPU failed, not the program
                fault, node = found
                on = f" on node {node}" if node else ""
                status = replace(
                    status,
                    reason=f"{reason} (GPU hardware fault{on}: {fault})",
                    interruption=names.NODE_FAULT,
                    fault=fault,
                    node=node,
                )
        if stop is not None and not (obj.get("metadata") or {}).get("deletionTimestamp"):
            # a read changes nothing: the verdict is reported, and the task that owns the attempt deletes it
            status = replace(status, never_starts=stop)
        return status

    def _status_of(
        self,
        handle: JobHandle,
        obj: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        state: JobState,
        reason: str,
        interruption: str | None,
        remote: str,
    ) -> JobStatus:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        members = pods if handle.extra.get("kind") == JOB else [obj]
        starts = [t for t in (pod_times(p)[0] for p in members) if t is not None]
        ends = [t for t in (pod_times(p)[1] for p in members) if t is not None]
        started = min(starts) if starts else None
        ended = (max(ends) if ends else None) if state.terminal else None
        if state.terminal and handle.extra.get("kind") == JOB:
            for kind in ("Complete", "Failed"):
                cond = condition(obj, kind)
                if cond is not None:
                    ended = parse_time(cond.get("lastTransitionTime")) or ended
        if state.terminal and ended is None and started is not None:
            ended = time.time()
        if started is not None and ended is not None and ended < started:
            ended = started
        gpus = float(handle.extra.get("gpus") or 1) * int(handle.extra.get("nodes") or 1)
        gpu_seconds = gpus * max(0.0, (ended or time.time()) - started) if started else 0.0
        code = None
        failed = [p for p in members if exit_code(p) not in (None, 0)]
        if state is JobState.SUCCEEDED:
            code = 0
        elif failed:
            code = exit_code(failed[0])
        elif state is JobState.FAILED and members:
            code = exit_code(members[0])
        if state is JobState.FAILED and remote == "Failed" and not reason:
            reason = f"container {CONTAINER} ended"  # the exit code is reported apart (JobStatus.exit_code)
        owner = str(labels.get(names.TAG_OWNER_TRY) or "")
        node_capacity = None
        for pod in members:
            node_capacity = ((pod.get("spec") or {}).get("nodeSelector") or {}).get("karpenter.sh/capacity-type")
        return JobStatus(
            state=state,
            reason=reason,
            exit_code=code,
            started_at=started,
            ended_at=ended,
            gpu_seconds=gpu_seconds,
            interruption=interruption,
            capacity=str(node_capacity or handle.capacity),
            owner_try=int(owner) if owner.isdigit() else None,
            collected=str(labels.get(names.TAG_COLLECTED) or "").lower() == "true",
            log_url=self.console_url(handle),
        )

    def _gone(self, handle: JobHandle) -> JobStatus:
        """A Pod or Job that no longer exists: deleted by this provider (an Event says why), else lost."""
        kind = str(handle.extra.get("kind") or POD)
        events = self._tombstones(handle.name)
        for event in events:
            message = str(event.get("message") or "")
            if event.get("reason") == EVENT_CANCELLED:
                text = message.removeprefix(names.CANCEL_PREFIX)
                if text.startswith(names.UNRUNNABLE_MARK):  # its owner deleted it because it could never start
                    return JobStatus(
                        state=JobState.FAILED, reason=text[len(names.UNRUNNABLE_MARK) :], capacity=handle.capacity
                    )
                return JobStatus(
                    state=JobState.CANCELLED,
                    reason=text,
                    interruption=interruption_of(JobState.CANCELLED, "Deleted", text),
                    capacity=handle.capacity,
                )
            if event.get("reason") == EVENT_FAILED:
                return JobStatus(state=JobState.FAILED, reason=message, capacity=handle.capacity)
        return JobStatus(
            state=JobState.FAILED,
            reason=(
                f"Kubernetes no longer knows {kind} {self.namespace}/{handle.name} (deleted by someone else, its "
                "node's removal or garbage collection): how it ended cannot be known. Treated as lost: the capacity "
                "policy decides whether a new attempt runs, resuming from the latest checkpoint."
            ),
            interruption=names.LOST,
            capacity=handle.capacity,
        )

    def _tombstones(self, name: str) -> list[dict[str, Any]]:
        api = self._api
        page = call(
            "list events",
            lambda: raw(
                api.core.list_namespaced_event,
                self.namespace,
                field_selector=f"involvedObject.name={name},source={MANAGER}",
            ),
        )
        found = [e for e in page.get("items") or [] if e.get("reason") in (EVENT_CANCELLED, EVENT_FAILED)]
        return sorted(found, key=lambda e: str(e.get("lastTimestamp") or ""))

    # --- cancel and marks ---------------------------------------------------------------------------

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """GET the attempt's Pod or Job by name now: its owner-try label (never a listing poll kept)."""
        kind = str(handle.extra.get("kind") or POD)
        obj = self._get(kind, handle.name)
        if obj is None:
            return OwnerRead(owner_try=None, exists=False)
        labels = (obj.get("metadata") or {}).get("labels") or {}
        owner = str(labels.get(names.TAG_OWNER_TRY) or labels.get(names.TAG_TRY_NUMBER) or "")
        return OwnerRead(owner_try=int(owner) if owner.isdigit() else None)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Delete the Pod, or the Job with its pods and Service (foreground), leaving an Event with the reason."""
        kind = str(handle.extra.get("kind") or POD)
        run_bounded(f"delete {kind} {handle.name}", lambda: self._cancel(handle, kind, reason))

    def _cancel(self, handle: JobHandle, kind: str, reason: str) -> None:
        obj = self._get(kind, handle.name)
        if obj is None:
            return
        if kind == POD:
            remote, _ = pod_remote_state(obj)
        else:
            remote, _ = job_remote_state(obj, [])
        try:
            ended = remote != "Deleted" and map_state(STATE_TABLE, remote, backend=self.name).terminal
        except ValueError:  # a state this version does not know is not known to have ended: stop it
            ended = False
        if ended and not remote.startswith("Pending:"):  # a pod that can never start still holds its node request
            return  # ended: nothing to stop, and its outcome stays readable
        self._stop(handle, kind, names.CANCEL_PREFIX + reason, event=EVENT_CANCELLED)

    def _stop(self, handle: JobHandle, kind: str, reason: str, *, event: str) -> None:
        """Mark ``reason`` on the object and in an Event (which outlives it), then delete it."""
        api = self._api
        text = reason[:1024]
        patch = {"metadata": {"annotations": {CANCEL_ANNOTATION: text}}}
        patch_fn = api.core.patch_namespaced_pod if kind == POD else api.batch.patch_namespaced_job
        exists(lambda: call(f"patch {kind} {handle.name}", lambda: raw(patch_fn, handle.name, self.namespace, patch)))
        self._event(handle, kind, event, text)
        body = {"propagationPolicy": "Foreground"}
        if kind == POD:
            exists(
                lambda: call(
                    "delete pod", lambda: raw(api.core.delete_namespaced_pod, handle.name, self.namespace, body=body)
                )
            )
        else:
            exists(
                lambda: call(
                    "delete job", lambda: raw(api.batch.delete_namespaced_job, handle.name, self.namespace, body=body)
                )
            )
            exists(
                lambda: call(
                    "delete service",
                    lambda: raw(api.core.delete_namespaced_service, handle.name, self.namespace, body=body),
                )
            )
        log.info("Deleted Kubernetes %s %s/%s: %s", kind, self.namespace, handle.name, text)

    def _event(self, handle: JobHandle, kind: str, reason: str, message: str) -> None:
        now = _now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{handle.name}.{uuid.uuid4().hex[:16]}", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": "v1" if kind == POD else "batch/v1",
                "kind": kind,
                "name": handle.name,
                "namespace": self.namespace,
                "uid": str(handle.extra.get("uid") or ""),
            },
            "reason": reason,
            "message": message,
            "type": "Normal" if reason == EVENT_CANCELLED else "Warning",
            "source": {"component": MANAGER},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        api = self._api
        call("create event", lambda: raw(api.core.create_namespaced_event, self.namespace, event))

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Label the Pod or Job: the try that owns it, or that its outcome was collected."""
        labels: dict[str, str] = {}
        if owner_try is not None:
            if isinstance(owner_try, bool) or not isinstance(owner_try, int) or owner_try < 1:
                raise ValueError(f"owner_try={owner_try!r} must be an Airflow try number (an integer, 1 or more)")
            labels[names.TAG_OWNER_TRY] = str(owner_try)
        if collected:
            labels[names.TAG_COLLECTED] = "true"
        if not labels:
            return
        kind = str(handle.extra.get("kind") or POD)
        api = self._api
        fn = api.core.patch_namespaced_pod if kind == POD else api.batch.patch_namespaced_job
        body = {"metadata": {"labels": labels}}
        try:
            call(f"label {kind} {handle.name}", lambda: raw(fn, handle.name, self.namespace, body))
        except Exception as err:
            if status_of(err) == 404:
                raise GpuJobError(
                    f"Kubernetes no longer knows {kind} {self.namespace}/{handle.name}: it cannot be labelled"
                ) from err
            raise

    # --- lookups ------------------------------------------------------------------------------------

    def _objects(self, selector: str, *, active: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """Bare pods and Jobs of this provider matching ``selector`` (a Job's pods left out); with
        ``active``, ended pods are not fetched."""
        found: list[tuple[str, dict[str, Any]]] = []
        fields = ACTIVE_PODS if active else None
        for pod in self._list(POD, selector, attempts=PATIENT_ATTEMPTS, fields=fields):
            if ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT_NAME) == pod["metadata"]["name"]:
                found.append((POD, pod))
        for job in self._list(JOB, selector, attempts=PATIENT_ATTEMPTS):
            found.append((JOB, job))
        return found

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance in the namespace, found by its labels (run hash, map index)."""
        labels = (
            f"{MANAGED_BY}={MANAGER}",
            f"{names.TAG_RUN_HASH}={task.run_hash}",
            f"{names.TAG_MAP_INDEX}={map_index_label(task.map_index)}",
            f"{names.TAG_DAG_ID}={label_value(task.dag_id) or 'x'}",
            f"{names.TAG_TASK_ID}={label_value(task.task_id) or 'x'}",
        )
        selector = ",".join(labels)
        handles = [self._handle(obj, kind) for kind, obj in self._objects(selector) if _task_of(obj) == task]
        return sorted(handles, key=lambda h: (h.attempt, h.submitted_at))

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A Pod or Job by its name (on Kubernetes an object's name in its namespace is its id)."""
        field_name, value = lookup_key(job_id, name)
        if not is_dns1123_subdomain(value):
            raise ValueError(f"{field_name}={value!r}: not a Kubernetes object name (a DNS-1123 subdomain)")
        for kind in (POD, JOB):
            obj = self._get(kind, value)
            if obj is not None:
                return self._handle(obj, kind)
        return None

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        obj = self._get(str(handle.extra.get("kind") or POD), handle.name)
        return _task_of(obj) if obj is not None else None

    def list_owned(self) -> list[OwnedJob]:
        """Every active Pod and Job in the namespace carrying this provider's labels."""
        owned = []
        for kind, obj in self._objects(f"{MANAGED_BY}={MANAGER}", active=True):
            if kind == POD:
                remote, _ = pod_remote_state(obj)
            else:
                remote, _ = job_remote_state(obj, [])
            state = STATE_TABLE.get(remote)
            if state is None or state.terminal or (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            handle = self._handle(obj, kind)
            meta = obj.get("metadata") or {}
            labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
            owner = str(labels.get(names.TAG_OWNER_TRY) or labels.get(names.TAG_TRY_NUMBER) or "")
            runtime = str(notes.get(ANNOTATION_MAX_RUNTIME) or "")
            started = pod_times(obj)[0] if kind == POD else parse_time((obj.get("status") or {}).get("startTime"))
            owned.append(
                OwnedJob(
                    handle=handle,
                    task=_task_of(obj),
                    state=state,
                    try_number=int(owner) if owner.isdigit() else None,
                    team=str(labels.get(names.TAG_TEAM)) if labels.get(names.TAG_TEAM) else None,
                    started_at=started,
                    nodes=int(handle.extra.get("nodes") or 1),
                    gpus=float(handle.extra.get("gpus") or 1),
                    max_runtime_s=float(runtime) if runtime.isdigit() else None,
                    # activeDeadlineSeconds counts from the start (a Job's startTime includes pending pods);
                    # a pending pod has no wait limit
                    max_wait_s=None,
                    training_seconds=None,
                )
            )
        return owned

    # --- logs and links -----------------------------------------------------------------------------

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Lines of every pod of the attempt after ``cursor``, ``rank N:`` prefixed for multi-node
        attempts; only complete lines of a running container are taken.

        One LIST of the attempt's pods by its label, then per pod one read from the cursor
        (``sinceTime``, ``limitBytes``; see :mod:`~gpu_provider.backends.kubernetes.logs`), so the bytes
        read over a job's life are about its log's size, however often it is read."""
        try:
            loaded = json.loads(cursor) if cursor else {}
        except ValueError:
            loaded = {}
        read: dict[str, Any] = loaded if isinstance(loaded, dict) else {}
        pods = self._attempt_pods(handle)
        multi = int(handle.extra.get("nodes") or 1) > 1
        lines: list[str] = []
        size = 0
        more = False
        for pod in pods:
            name = str(pod["metadata"]["name"])
            state = (pod.get("status") or {}).get("phase")
            if state == "Pending" and not pod_times(pod)[0]:
                continue
            ended = state in ("Succeeded", "Failed")
            prefix = f"rank {rank_of(pod)}: " if multi else ""
            mark = PodMark.load(read.get(name))
            used, stopped = self._read_pod_log(name, mark, ended, max_bytes - size, prefix, lines)
            read[name] = mark.dump()
            size += used
            if stopped:
                more = True
                break
        return LogChunk(lines=lines, cursor=json.dumps(read, sort_keys=True) if read else cursor, more=more)

    def _attempt_pods(self, handle: JobHandle) -> list[dict[str, Any]]:
        """The attempt's pods (by its label), in rank order."""
        pods = self._list(POD, f"{LABEL_ATTEMPT_NAME}={handle.name}")
        pods.sort(key=lambda p: (rank_of(p), str((p.get("metadata") or {}).get("creationTimestamp"))))
        return pods

    def _read_pod_log(
        self, pod: str, mark: PodMark, ended: bool, budget: int, prefix: str, out: list[str]
    ) -> tuple[int, bool]:
        """One read of ``pod``'s log after ``mark`` into ``out``, about ``budget`` bytes; answers the bytes
        taken and whether more is there now."""
        allowance = budget if out else max(budget, LONG_LINE_BYTES)
        if allowance <= 0:
            return 0, True
        mark.settle()
        limit = allowance + mark.second_bytes  # the lines of the cursor's second come again
        query: list[tuple[str, Any]] = [("container", CONTAINER), ("timestamps", "true"), ("limitBytes", limit)]
        since = mark.since()
        if since:
            query.append(("sinceTime", since))
        sent = time.time()
        try:
            data = call(
                f"read log of {pod}", lambda: read_log(self._api, pod, self.namespace, query), attempts=POLL_ATTEMPTS
            )
        except Exception as err:
            if status_of(err) in (400, 404):  # not started yet, or gone
                return 0, False
            raise
        used, more = take(data, mark, limit=limit, ended=ended, budget=budget, prefix=prefix, out=out)
        if not more:
            mark.caught_up = sent
        return used, more

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` lines of the attempt's output: one read per pod (``tailLines``, at most
        :data:`TAIL_PODS` pods), merged by their timestamps, ``rank N:`` prefixed for multi-node attempts."""
        if lines <= 0:
            return []
        multi = int(handle.extra.get("nodes") or 1) > 1
        stamped: list[tuple[tuple[int, int], int, str]] = []
        for pod in self._attempt_pods(handle)[:TAIL_PODS]:
            name = str(pod["metadata"]["name"])
            query: list[tuple[str, Any]] = [
                ("container", CONTAINER),
                ("timestamps", "true"),
                ("tailLines", lines),
                ("limitBytes", lines * LONG_LINE_BYTES),
            ]
            try:
                data = call(
                    f"read the end of {name}'s log",
                    lambda name=name, query=query: read_log(self._api, name, self.namespace, query),  # type: ignore[misc]
                    attempts=POLL_ATTEMPTS,
                )
            except Exception as err:
                if status_of(err) in (400, 404):
                    continue
                raise
            prefix = f"rank {rank_of(pod)}: " if multi else ""
            for raw_line in data.rstrip(b"\n").split(b"\n") if data else []:
                key, text = split_stamped(raw_line)
                line = prefix + clip_line(text.decode("utf-8", "replace"), MAX_LOG_LINE_CHARS)
                stamped.append((key or (0, 0), len(stamped), line))
        stamped.sort()
        return [line for _, _, line in stamped[-lines:]]

    def event_source(self) -> EventSource | None:
        """One watch of this provider's pods in the namespace, unless ``[gpu_provider] kubernetes_watch``
        is off (:mod:`~gpu_provider.backends.kubernetes.events`)."""
        if not config_flag("kubernetes_watch", default=True):
            return None
        from gpu_provider.backends.kubernetes.events import PodWatch

        return PodWatch(self._api, self.namespace)

    def console_url(self, handle: JobHandle) -> str | None:
        if not self.dashboard_url:
            return None
        kind = str(handle.extra.get("kind") or POD)
        try:
            return self.dashboard_url.format(namespace=self.namespace, name=handle.name, kind=kind.lower())
        except (KeyError, IndexError, ValueError):
            return None


def _task_of(obj: Mapping[str, Any]) -> TaskKey | None:
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    dag_id, task_id, run_id = (notes.get(k) for k in (ANNOTATION_DAG_ID, ANNOTATION_TASK_ID, ANNOTATION_RUN_ID))
    if not (dag_id and task_id and run_id):
        return None
    text = str(labels.get(names.TAG_MAP_INDEX) or "none")
    map_index = int(text) if text.isdigit() else -1
    return TaskKey(str(dag_id), str(task_id), str(run_id), map_index)


def _api_message(err: BaseException) -> str:
    body = getattr(err, "body", None)
    try:
        return str(json.loads(body).get("message")) if body else str(err)
    except (ValueError, AttributeError):
        return str(body or err)[:500]
