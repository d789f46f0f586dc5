"""The Kubernetes backend: GPU pods on Karpenter-provisioned nodes (EKS), spot or on-demand.

A single-node attempt is one Pod; a multi-node attempt is an Indexed Job (one pod per rank,
``backoffLimit: 0``, a ``podFailurePolicy`` that tells a disruption from the program's failure)
plus a headless Service that gives rank 0 a DNS name. Capacity is chosen by node selector: a spot
attempt asks for ``karpenter.sh/capacity-type: spot`` on the spot NodePool, an on-demand attempt
for ``on-demand`` on the on-demand NodePool; Karpenter launches a node for the pending pod. The class
here orchestrates; each concern has its module (listed in :mod:`gpu_provider.backends.kubernetes`): what
the manifests hold is in :mod:`~gpu_provider.backends.kubernetes.manifests`, what the answers mean
in :mod:`~gpu_provider.backends.kubernetes.mapping` and :mod:`~gpu_provider.backends.kubernetes.status`.

Status reads ask only for what they need: a poll of a few attempts is one LIST of their pods by the
attempt's label (and of their Jobs, for multi-node attempts); a poll of many (the triggerer's shared
poller) is one LIST of the namespace's *active* pods of this provider, whatever their number, plus the
attempts not among them (ended since the last tick) by their label. Pods that ended and that nobody
asks about (left for the pod garbage collector) are never fetched. Logs are read from a cursor
(:mod:`~gpu_provider.backends.kubernetes.logs`). The request pattern is described in
``docs/how-to/kubernetes-notes.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from gpu_provider import names
from gpu_provider.backends.base import (
    LOG_READ_BYTES,
    Backend,
    Capabilities,
    EventSource,
    JobHandle,
    JobRequest,
    JobStatus,
    LogChunk,
    OwnedJob,
    OwnerRead,
    PollResult,
    TaskKey,
)
from gpu_provider.backends.common import config_flag, port_option, run_bounded, text_option
from gpu_provider.backends.kubernetes import logs as pod_logs
from gpu_provider.backends.kubernetes import lookups, options, ownership, status
from gpu_provider.backends.kubernetes.calls import Api
from gpu_provider.backends.kubernetes.manifests import (
    JOB,
    POD,
    Placement,
    check_manifest,
    job_manifests,
    kind_of,
    pod_manifest,
)
from gpu_provider.backends.kubernetes.objects import Objects, handle_of
from gpu_provider.backends.kubernetes.options import (
    DEFAULT_MASTER_PORT,
    DEFAULT_ON_DEMAND_NODE_POOL,
    DEFAULT_PRIORITY_CLASSES,
    DEFAULT_SPOT_NODE_POOL,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_TTL_AFTER_FINISHED_S,
)
from gpu_provider.exceptions import GpuJobStatusError
from gpu_provider.job import GpuResources

log = logging.getLogger(__name__)


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
        self.namespace: str = options.namespace(namespace)
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
        self.fractional_gpu_resource = options.resource_name(fractional_gpu_resource)
        self.dashboard_url = text_option("dashboard_url", dashboard_url, config_key="kubernetes_dashboard_url")
        self.master_port = port_option("master_port", master_port)
        self.ttl_after_finished = int(
            options.seconds(
                "ttl_after_finished", ttl_after_finished, "kubernetes_ttl_after_finished", DEFAULT_TTL_AFTER_FINISHED_S
            )
        )
        self._api = Api(self.kubernetes_conn_id or "kubernetes_default")
        self._objects = Objects(self._api, self.namespace)

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

    def validate_job(self, resources: GpuResources, capacity: str, multi: bool, runtime_s: float | None) -> None:
        options.check_resources(resources, self.fractional_gpu_resource)

    # --- manifests ----------------------------------------------------------------------------------

    def priority_class(self, priority: int | None) -> str | None:
        """The PriorityClass of a ``priority=`` (the class with the highest bound not above it)."""
        return options.priority_class(self.priority_classes, priority)

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
        created, existed = self._objects.create(built[0], identity.task)
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
            self._objects.create(service, identity.task)
        log.info(
            "Created Kubernetes %s %s/%s (%s, node pool %s).",
            kind,
            self.namespace,
            identity.name,
            request.capacity,
            self.placement(request).node_pool or "any",
        )
        handle = handle_of(created, kind, backend=self.name, namespace=self.namespace)
        return handle.as_adopted() if existed else handle

    def poll(self, handles: Sequence[JobHandle]) -> PollResult:
        """The pods (and Jobs) of ``handles`` and nothing else that ended (which LISTs:
        :func:`~gpu_provider.backends.kubernetes.status.fetch`); an attempt that cannot be read fails alone."""
        if not handles:
            return {}
        grouped, jobs = status.fetch(self._objects, handles)
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

    def _status(
        self, handle: JobHandle, by_attempt: Mapping[str, list[dict[str, Any]]], jobs: Mapping[str, dict[str, Any]]
    ) -> JobStatus:
        """One attempt's status from what :meth:`poll` fetched."""
        return status.attempt_status(
            handle,
            by_attempt,
            jobs,
            objects=self._objects,
            startup_timeout=self.startup_timeout,
            log_url=self.console_url(handle),
            backend=self.name,
        )

    def read_owner(self, handle: JobHandle) -> OwnerRead:
        """GET the attempt's Pod or Job by name now: its owner-try label (never a listing poll kept)."""
        return ownership.read_owner(self._objects, handle)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Delete the Pod, or the Job with its pods and Service (foreground), leaving an Event with the reason."""
        run_bounded(f"delete {kind_of(handle)} {handle.name}", lambda: ownership.cancel(self._objects, handle, reason))

    def mark(self, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
        """Label the Pod or Job: the try that owns it, or that its outcome was collected."""
        ownership.mark(self._objects, handle, owner_try=owner_try, collected=collected)

    # --- lookups ------------------------------------------------------------------------------------

    def find_existing(self, task: TaskKey) -> list[JobHandle]:
        """Every attempt of the task instance in the namespace, found by its labels (run hash, map index)."""
        return lookups.find_existing(self._objects, task, backend=self.name)

    def lookup(self, *, job_id: str | None = None, name: str | None = None) -> JobHandle | None:
        """A Pod or Job by its name (on Kubernetes an object's name in its namespace is its id)."""
        return lookups.lookup(self._objects, job_id=job_id, name=name, backend=self.name)

    def task_of(self, handle: JobHandle) -> TaskKey | None:
        return lookups.task_of_handle(self._objects, handle)

    def list_owned(self) -> list[OwnedJob]:
        """Every active Pod and Job in the namespace carrying this provider's labels."""
        return lookups.list_owned(self._objects, backend=self.name)

    # --- logs and links -----------------------------------------------------------------------------

    def logs(self, handle: JobHandle, cursor: str | None = None, *, max_bytes: int = LOG_READ_BYTES) -> LogChunk:
        """Lines of every pod of the attempt after ``cursor``, ``rank N:`` prefixed for multi-node
        attempts; only complete lines of a running container are taken.

        One LIST of the attempt's pods by its label, then per pod one read from the cursor
        (``sinceTime``, ``limitBytes``; see :mod:`~gpu_provider.backends.kubernetes.logs`), so the bytes
        read over a job's life are about its log's size, however often it is read."""
        return pod_logs.read(self._objects, handle, cursor, max_bytes=max_bytes)

    def output_tail(self, handle: JobHandle, lines: int = 20) -> list[str]:
        """The last ``lines`` lines of the attempt's output: one read per pod (``tailLines``, at most
        :data:`~gpu_provider.backends.kubernetes.logs.TAIL_PODS` pods), merged by their timestamps,
        ``rank N:`` prefixed for multi-node attempts."""
        return pod_logs.tail(self._objects, handle, lines)

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
        try:
            return self.dashboard_url.format(namespace=self.namespace, name=handle.name, kind=kind_of(handle).lower())
        except (KeyError, IndexError, ValueError):
            return None
