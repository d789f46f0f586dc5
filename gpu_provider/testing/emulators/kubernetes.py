"""A small fake Kubernetes API server over HTTP, for tests and the demo: enough of the API for the
official ``kubernetes`` client and the cncf-kubernetes provider's ``KubernetesHook``.

What it serves (JSON, no TLS, no authentication: a kubeconfig from :meth:`KubernetesEmulator.kubeconfig`
points a client at it):

* Pods, Jobs (``batch/v1``, Indexed completion mode), Services, Events in namespaces; Nodes;
  create (409 on a name in use), get, list with label selectors (``=``, ``!=``, ``in``, ``notin``,
  exists) and field selectors (``a.b=c``), ``limit``/``continue`` paging, merge patch, delete with
  ``propagationPolicy`` (Foreground keeps a Job until its pods are gone; ``ownerReferences`` are
  garbage-collected), pod logs (``timestamps``, ``sinceTime`` in whole seconds as the kubelet gets it,
  ``sinceSeconds``, ``tailLines``, ``limitBytes``), and watches (``?watch=true``: newline-delimited events in
  HTTP chunks as the API server sends them, streamed until ``timeoutSeconds``, resumed from a ``resourceVersion``;
  one older than the kept history answers an ``ERROR`` event with a 410 ``Expired`` Status, as after an etcd
  compaction: :meth:`KubernetesEmulator.compact` forces it, :meth:`KubernetesEmulator.drop_watches` cuts every
  open watch, :meth:`KubernetesEmulator.open_watches` lists them, and
  :attr:`KubernetesEmulator.mute_watches` loses their events while the connections stay open).
* A scheduler standing in for Karpenter: a pending pod gets a node of the capacity type and
  NodePool its ``nodeSelector`` asks for after ``node_delay`` seconds (one node per pod), unless
  that capacity type is short (:meth:`KubernetesEmulator.set_shortage`: the pod stays ``Pending``
  with ``PodScheduled=False``, ``Unschedulable``). After ``start_delay`` seconds in
  ``ContainerCreating`` the container starts: its command runs as a local process (in its own
  session, ``cwd=job_cwd``), its output is the pod's log, its exit code the container's.
  An image in :attr:`KubernetesEmulator.unpullable` (or containing ``does-not-exist``) waits in
  ``ErrImagePull``/``ImagePullBackOff`` instead. Images are never pulled: a command starting with
  ``python`` runs this interpreter.
* The Job controller: one pod per completion index (``<job>-<index>-<random>``, hostname
  ``<job>-<index>``, ``JOB_COMPLETION_INDEX`` and the ``batch.kubernetes.io/job-completion-index``
  annotation), ``podFailurePolicy`` rules (``FailJob`` on pod conditions and exit codes),
  ``backoffLimit``, ``activeDeadlineSeconds``; ``Complete``/``SuccessCriteriaMet`` and
  ``FailureTarget``/``Failed`` conditions. Pods' ``activeDeadlineSeconds`` too.
* Faults from tests: :meth:`reclaim` takes a spot node back (its pods get a ``DisruptionTarget``
  condition, SIGTERM, and end ``Failed``), :meth:`evict` ends a pod with one of the kubelet's or a
  controller's eviction shapes (past a storage limit, past its request, node pressure, preemption,
  ...), :meth:`set_shortage`, :meth:`forget` (an object vanishes
  without a trace), :meth:`report_phase` (a phase no Kubernetes has), request throttling through
  :class:`gpu_provider.testing.emulators.core.Faults` (HTTP 429), and a request log
  (:class:`gpu_provider.testing.emulators.core.RequestLog`; each answered read also records the
  objects and bytes it returned).

What it does not do, on purpose: no admission, no schema validation (tests validate manifests with
``kubernetes-validate``), no RBAC, no resource accounting (a node per pod, any number), no
restarts (``restartPolicy`` is taken as ``Never``), no ``ttlSecondsAfterFinished``, no strategic
merge or JSON patch (merge patch only), no real cluster DNS: all pods share this host, so an
environment value naming a Service (``...svc.cluster.local``) is given to the process as
``127.0.0.1``. It is not a claim of Kubernetes conformance.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from gpu_provider.testing.emulators.core import Faults, RequestLog
from gpu_provider.testing.emulators.kubernetes_pods import (
    EVICTIONS,
    Container,
    PodRunner,
    field_value,
    main_state,
    now_rfc3339,
)

logger = logging.getLogger(__name__)

_KINDS = {"pods": "Pod", "jobs": "Job", "services": "Service", "events": "Event", "nodes": "Node"}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


# --- selectors ---------------------------------------------------------------------------------------


def _split_terms(text: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        terms.append(current.strip())
    return terms


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A label selector (``a=b,c!=d,e in (f,g),h notin (i),j,!k``) as a predicate on labels."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(selector or ""):
        set_op = re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\((.*)\)", term)
        if set_op:
            key, op, values = set_op.group(1), set_op.group(2), {v.strip() for v in set_op.group(3).split(",")}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in term:
            key, value = (p.strip() for p in term.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (p.strip() for p in term.replace("==", "=").split("=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            absent = term[1:].strip()
            checks.append(lambda labels, k=absent: k not in labels)
        else:
            checks.append(lambda labels, k=term: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def field_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for term in _split_terms(selector or ""):
        if "!=" in term:
            path, value = term.split("!=", 1)
            checks.append(lambda obj, p=path, v=value: field_value(obj, p) != v)
        else:
            path, value = term.replace("==", "=").split("=", 1)
            checks.append(lambda obj, p=path, v=value: field_value(obj, p) == v)
    return lambda obj: all(check(obj) for check in checks)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class _Server(ThreadingHTTPServer):
    """A thread per connection, as the API server serves many clients at once."""

    daemon_threads = True
    #: connections waiting to be accepted: a burst of new ones (KubernetesPodTrigger opens one per read)
    #: waits instead of being refused, as with a real API server (the standard library's default is 5)
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # the client went away before its answer (a stopped process): nothing to report
        super().handle_error(request, client_address)


class KubernetesEmulator(PodRunner):
    """The fake API server (see the module docstring). Use as a context manager, or start()/stop().

    :param job_cwd: working directory of the containers' processes
    :param node_delay: seconds until a node comes up for a pending pod (Karpenter's launch)
    :param start_delay: seconds a pod spends in ``ContainerCreating`` on its node
    :param grace_period: the longest a process gets between SIGTERM and SIGKILL (the pod's own
        ``terminationGracePeriodSeconds`` if shorter)
    """

    def __init__(
        self,
        *,
        job_cwd: str | Path | None = None,
        node_delay: float = 0.3,
        start_delay: float = 0.3,
        grace_period: float = 2.0,
        extra_env: dict[str, str] | None = None,
        port: int = 0,
    ) -> None:
        self.port = port  # on 127.0.0.1; 0: a free one
        self.job_cwd = str(job_cwd or os.getcwd())
        self.node_delay, self.start_delay, self.grace_period = node_delay, start_delay, grace_period
        self.extra_env = dict(extra_env or {})
        self.faults = Faults()
        self.log = RequestLog()
        self.unpullable: set[str] = set()
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}
        self._shortage: set[str] = set()
        self._reclaim_rules: list[list[Any]] = []  # [seconds, name_contains, count left]
        self._reclaim_at: dict[tuple[str, str], float] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._store: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in _KINDS}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []
        self._rv = 0
        self._compacted = 0  # watches from a resourceVersion below this answer 410 Gone
        self._watch_generation = 0  # drop_watches() ends every watch opened before it
        self._open_watches: dict[int, tuple[str, str | None, str]] = {}
        #: while True, open watches stay open but send nothing (events lost on the way)
        self.mute_watches = False
        self._containers: dict[tuple[str, str], Container] = {}
        self._node_ready: dict[tuple[str, str], float] = {}  # pod -> when its node comes up
        self._phase_since: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> KubernetesEmulator:
        emulator = self

        class Handler(_Handler):
            pass

        Handler.emulator = emulator
        self._server = _Server(("127.0.0.1", self.port), Handler)
        for target in (self._server.serve_forever, self._loop):
            thread = threading.Thread(target=target, daemon=True, name=f"k8s-emulator-{target.__name__}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            containers = list(self._containers.values())
            self._changed.notify_all()
        for container in containers:
            container.signal(signal.SIGKILL)
        for container in containers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                container.proc.wait(timeout=5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> KubernetesEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "the emulator is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: str | Path, namespace: str = "default", token: str = "emulator-token") -> Path:
        """Write a kubeconfig that points at this server (plain HTTP, a dummy bearer token: the request log
        records it as each request's ``client``, so clients with their own kubeconfigs can be told apart)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": token}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}
            ],
            "current-context": "emulator",
        }
        target = Path(path)
        target.write_text(json.dumps(config))
        return target

    # --- knobs for tests ----------------------------------------------------------------------------

    def set_shortage(self, capacity_type: str, short: bool = True, *, instance_type: str | None = None) -> None:
        """No new node of ``capacity_type`` (``spot`` | ``on-demand``, or ``"*"`` with ``instance_type``) comes up
        while short; with ``instance_type``, only nodes of that type (a pod whose node affinity allows only
        short types stays Pending)."""
        key = f"{capacity_type}|{instance_type}" if instance_type else capacity_type
        with self._lock:
            (self._shortage.add if short else self._shortage.discard)(key)

    def reclaim(self, pod_name: str, namespace: str = "default") -> str:
        """Take back the spot node ``pod_name`` runs on: every pod there gets ``DisruptionTarget``, is
        stopped and ends ``Failed``; the node goes. Returns the node's name."""
        with self._lock:
            pod = self._store["pods"].get((namespace, pod_name))
            if pod is None or not pod["spec"].get("nodeName"):
                raise KeyError(f"pod {namespace}/{pod_name} is not on a node")
            node = pod["spec"]["nodeName"]
            for key, other in list(self._store["pods"].items()):
                if other["spec"].get("nodeName") != node or other["status"].get("phase") not in ("Running", "Pending"):
                    continue
                other["status"].setdefault("conditions", []).append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": f"Karpenter: spot interruption, node {node} is being terminated",
                        "lastTransitionTime": now_rfc3339(),
                    }
                )
                other["metadata"]["_disrupted"] = True
                self._touch("pods", other, "MODIFIED")
                container = self._containers.get(key)
                if container is not None:
                    container.signal(signal.SIGTERM)
                    container.term_at = time.time()
                else:
                    self._finish_pod(key, other, None, reason="Terminated")
            self._store["nodes"].pop(("", node), None)
            logger.info("reclaimed spot node %s (pod %s/%s): DisruptionTarget", node, namespace, pod_name)
            return str(node)

    def evict(self, pod_name: str, shape: str, namespace: str = "default") -> None:
        """End a running pod as the kubelet or a controller does for one eviction shape of
        :data:`~gpu_provider.testing.emulators.kubernetes_pods.EVICTIONS` (``pod-storage-limit``,
        ``memory-over-request``, ``memory-pressure``, ``preemption``, ...): its ``status.reason`` and
        ``message``, a ``DisruptionTarget`` condition where that shape has one, and its process stopped
        (SIGKILL for the kubelet's limit evictions, which give no grace period; SIGTERM otherwise)."""
        if shape not in EVICTIONS:
            raise ValueError(f"shape={shape!r}: allowed {', '.join(sorted(EVICTIONS))}")
        reason, message, cause = EVICTIONS[shape]
        with self._lock:
            key = (namespace, pod_name)
            pod = self._store["pods"].get(key)
            if pod is None or pod["status"].get("phase") not in ("Running", "Pending"):
                raise KeyError(f"pod {namespace}/{pod_name} is not running")
            if cause is not None:
                pod["status"].setdefault("conditions", []).append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": cause,
                        "message": message,
                        "lastTransitionTime": now_rfc3339(),
                    }
                )
                pod["metadata"]["_disrupted"] = True
            pod["metadata"]["_evicted"] = {"reason": reason, "message": message}
            self._touch("pods", pod, "MODIFIED")
            container = self._containers.get(key)
            if container is None:
                self._finish_pod(key, pod, None)
            elif cause is None:
                container.signal(signal.SIGKILL)
            else:
                container.signal(signal.SIGTERM)
                container.term_at = time.time()

    def fail_gpu(
        self,
        pod_name: str,
        namespace: str = "default",
        message: str = "Allocate failed due to can't allocate unhealthy devices nvidia.com/gpu, which is unexpected",
    ) -> None:
        """The NVIDIA device plugin marks the pod's GPU unhealthy: the kubelet fails the pod with
        ``UnexpectedAdmissionError`` and ``message`` (the device manager's words), its process killed."""
        with self._lock:
            key = (namespace, pod_name)
            pod = self._store["pods"].get(key)
            if pod is None or pod["status"].get("phase") not in ("Running", "Pending"):
                raise KeyError(f"pod {namespace}/{pod_name} is not running")
            pod["metadata"]["_evicted"] = {"reason": "UnexpectedAdmissionError", "message": message}
            self._touch("pods", pod, "MODIFIED")
            container = self._containers.get(key)
            if container is None:
                self._finish_pod(key, pod, None)
            else:
                container.signal(signal.SIGKILL)

    def reclaim_after(self, seconds: float, *, name_contains: str = "", count: int = 1) -> None:
        """Reclaim the spot node of the next ``count`` pods on spot nodes (with ``name_contains`` in their
        name) ``seconds`` after each starts running."""
        with self._lock:
            self._reclaim_rules.append([seconds, name_contains, count])

    def forget(self, kind: str, name: str, namespace: str = "default") -> None:
        """Remove an object (and its Events) as if garbage-collected long ago."""
        with self._lock:
            obj = self._store[kind].pop((namespace, name), None)
            if obj is not None:
                self._touch(kind, obj, "DELETED", store=False)
            for key, event in list(self._store["events"].items()):
                if (event.get("involvedObject") or {}).get("name") == name:
                    self._store["events"].pop(key)

    def report_phase(self, name: str, phase: str, namespace: str = "default") -> None:
        """Make a pod report ``phase`` (one no Kubernetes has, for tests of unknown states)."""
        with self._lock:
            pod = self._store["pods"][(namespace, name)]
            pod["status"]["phase"] = phase
            self._touch("pods", pod, "MODIFIED")

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self._lock:
            obj = self._store[kind].get((namespace, name))
            return _public(obj) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = "default") -> list[dict[str, Any]]:
        with self._lock:
            return [_public(o) for (ns, _), o in self._store[kind].items() if namespace is None or ns == namespace]

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """API requests received, oldest first: ``{"action", "body", "throttled", "lost", "time", "status",
        "client"}``, and for an answered read ``objects`` (items of a LIST, 1 for a GET, 0 for a log) and
        ``bytes`` (the answer's size); ``action`` is ``verb kind[/sub]`` (``get pods``, ``watch events``),
        ``body`` holds the path, query and body; ``client`` is the bearer token the request carried (see
        :meth:`kubeconfig`)."""
        return self.log.requests(action, since=since)

    def compact(self) -> None:
        """Forget the change history, as an etcd compaction does: a watch resumed from an older
        ``resourceVersion`` gets 410 Gone (an ``ERROR`` event) and must list again."""
        with self._lock:
            self._history.clear()
            self._compacted = self._rv + 1
            self._changed.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch now (a dropped connection, an API server restart)."""
        with self._lock:
            self._watch_generation += 1
            self._changed.notify_all()

    def open_watches(self) -> list[tuple[str, str | None, str]]:
        """The watches streaming now: ``(kind, namespace or None, labelSelector)`` each."""
        with self._lock:
            return list(self._open_watches.values())

    def reset(self) -> None:
        """Clear faults, shortages and the request log; delete every pod, job and service left."""
        self.faults.reset()
        self.log.reset()
        self.unpullable.clear()
        self.mute_watches = False
        with self._lock:
            self._shortage.clear()
            self._reclaim_rules.clear()
            self._reclaim_at.clear()
            for kind in ("jobs", "pods", "services"):
                for key in list(self._store[kind]):
                    self._delete(kind, key, "Background", grace=0)

    # --- the store ----------------------------------------------------------------------------------

    def _touch(self, kind: str, obj: dict[str, Any], event: str, *, store: bool = True) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, kind, event, copy.deepcopy(_public(obj))))
        if len(self._history) > 5000:
            del self._history[:-5000]
            self._compacted = self._history[0][0]
        self._changed.notify_all()

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            name = meta.get("name")
            if not name and meta.get("generateName"):
                name = meta["generateName"] + uuid.uuid4().hex[:5]
            if not name:
                raise ApiError(422, "Invalid", f"{_KINDS[kind]} has no metadata.name")
            key = (namespace if kind != "nodes" else "", name)
            if key in self._store[kind]:
                raise ApiError(409, "AlreadyExists", f'{kind} "{name}" already exists')
            meta.update(
                {"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": now_rfc3339(), "namespace": key[0]}
            )
            if kind == "nodes":
                meta.pop("namespace")
            obj.setdefault("status", {})
            if kind == "pods":
                obj["status"] = {"phase": "Pending", "conditions": []}
                self._phase_since[key] = time.time()
            if kind == "jobs":
                obj["status"] = {}
                spec = obj["spec"]
                spec.setdefault("backoffLimit", 6)
                spec.setdefault("completions", 1)
                spec.setdefault("parallelism", 1)
            self._store[kind][key] = obj
            self._touch(kind, obj, "ADDED")
            return _public(obj)

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            obj = self._obj(kind, namespace, name)
            merged = merge_patch(obj, patch)
            obj.clear()
            obj.update(merged)
            self._touch(kind, obj, "MODIFIED")
            return _public(obj)

    def _obj(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self._store[kind].get((namespace if kind != "nodes" else "", name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        return obj

    def delete(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            obj = self._obj(kind, namespace, name)
            policy = body.get("propagationPolicy") or ("Background" if kind != "jobs" else "Orphan")
            self._delete(kind, (namespace, name), policy, grace=body.get("gracePeriodSeconds"))
            return _public(obj)

    def _delete(self, kind: str, key: tuple[str, str], policy: str, *, grace: Any = None) -> None:
        obj = self._store[kind].get(key)
        if obj is None:
            return
        meta = obj["metadata"]
        if kind == "pods":
            container = self._containers.get(key)
            if container is not None and container.proc.poll() is None:
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = now_rfc3339()
                    wait = self.grace_period if grace is None else min(float(grace), self.grace_period)
                    meta["_kill_at"] = time.time() + wait
                    container.signal(signal.SIGTERM)
                    self._touch(kind, obj, "MODIFIED")
                return
            self._remove(kind, key)
            return
        if kind == "jobs":
            pods = self._owned_pods(obj)
            if policy != "Orphan":
                for pod_key in pods:
                    self._delete("pods", pod_key, "Background", grace=grace)
            if policy == "Foreground" and any(k in self._store["pods"] for k in pods):
                meta["deletionTimestamp"] = meta.get("deletionTimestamp") or now_rfc3339()
                meta["finalizers"] = ["foregroundDeletion"]
                self._touch(kind, obj, "MODIFIED")
                return
        self._remove(kind, key)

    def _remove(self, kind: str, key: tuple[str, str]) -> None:
        obj = self._store[kind].pop(key, None)
        if obj is None:
            return
        self._touch(kind, obj, "DELETED", store=False)
        self._containers.pop(key, None) if kind == "pods" else None
        uid = obj["metadata"].get("uid")
        # garbage collection of dependents
        for dep_kind in ("pods", "services"):
            for dep_key, dep in list(self._store[dep_kind].items()):
                if any(ref.get("uid") == uid for ref in dep["metadata"].get("ownerReferences") or []):
                    self._delete(dep_kind, dep_key, "Background")

    def _owned_pods(self, job: dict[str, Any]) -> list[tuple[str, str]]:
        uid = job["metadata"]["uid"]
        return [
            key
            for key, pod in self._store["pods"].items()
            if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])
        ]

    def list(self, kind: str, namespace: str | None, query: dict[str, str]) -> dict[str, Any]:
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"))
        with self._lock:
            items = [
                _public(obj)
                for (ns, _), obj in sorted(self._store[kind].items())
                if (namespace is None or ns == namespace)
                and labels(obj["metadata"].get("labels") or {})
                and fields(obj)
            ]
            rv = str(self._rv)
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0)
        page = items[start : start + limit] if limit else items[start:]
        meta: dict[str, Any] = {"resourceVersion": rv}
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"kind": f"{_KINDS[kind]}List", "apiVersion": "v1", "metadata": meta, "items": page}

    def watch(self, kind: str, namespace: str | None, query: dict[str, str]) -> Iterator[dict[str, Any] | None]:
        """Events after ``resourceVersion`` (else the current objects as ADDED), until ``timeoutSeconds``;
        ``None`` after each quiet second (the HTTP side then checks that the client is still connected)."""
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"))
        deadline = time.time() + float(query.get("timeoutSeconds") or 5)

        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            return (
                (namespace is None or meta.get("namespace", "") == namespace)
                and labels(meta.get("labels") or {})
                and fields(obj)
            )

        with self._lock:
            since = query.get("resourceVersion")
            generation = self._watch_generation
            if not since or since == "0":
                current = [_public(o) for o in self._store[kind].values()]
                seen = self._rv
                initial = [{"type": "ADDED", "object": o} for o in current if wanted(o)]
            elif int(since) + 1 < self._compacted:
                gone = ApiError(410, "Expired", f"too old resource version: {since} ({self._compacted - 1})")
                initial, seen, deadline = [{"type": "ERROR", "object": gone.body()}], self._rv, 0.0
            else:
                seen, initial = int(since), []
            token = id(initial)
            self._open_watches[token] = (kind, namespace, str(query.get("labelSelector") or ""))
        try:
            yield from initial
            while time.time() < deadline and not self._stop.is_set():
                with (
                    self._lock
                ):  # sleep until a change (or the deadline, or stop): a thousand open watches cost nothing
                    if self._watch_generation != generation:
                        return
                    if self._rv <= seen:
                        self._changed.wait(timeout=min(1.0, max(0.0, deadline - time.time())))
                        heartbeat = self._rv <= seen
                    else:
                        heartbeat = False
                if heartbeat:  # nothing new for a second: the server checks that its client is still there
                    yield None
                    continue
                with self._lock:
                    start = bisect.bisect_right(self._history, seen, key=lambda h: h[0])  # oldest first, by version
                    fresh = [h for h in self._history[start:] if h[1] == kind]
                    seen = self._rv
                for _, _, event, obj in fresh:
                    if wanted(obj) and not self.mute_watches:
                        yield {"type": event, "object": obj}
        finally:
            with self._lock:
                self._open_watches.pop(token, None)

    def pod_log(self, namespace: str, name: str, query: dict[str, str] | None = None) -> bytes:
        with self._lock:
            pod = self._obj("pods", namespace, name)
            container = self._containers.get((namespace, name))
            if container is None:
                waiting = main_state(pod).get("waiting") or {}
                raise ApiError(
                    400,
                    "BadRequest",
                    f'container "main" in pod "{name}" is waiting to start: {waiting.get("reason", "PodInitializing")}',
                )
        return container.read(query or {})


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the emulator's private ``_`` fields in its metadata."""
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj["metadata"].items() if not k.startswith("_")}
    return copy.deepcopy(out)


# --- HTTP -------------------------------------------------------------------------------------------------

_PATH = re.compile(
    r"/(?:api/v1|apis/batch/v1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<kind>pods|jobs|services|events|nodes)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>log|status))?"
)


class _Handler(BaseHTTPRequestHandler):
    emulator: KubernetesEmulator
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        match = _PATH.fullmatch(url.path)
        if url.path in ("/version", "/api", "/apis"):
            self._send(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator"})
            return
        if match is None:
            self._send(404, ApiError(404, "NotFound", f"the server could not find {url.path}").body())
            return
        kind, ns, name, sub = match.group("kind"), match.group("ns"), match.group("name"), match.group("sub")
        watching = str(query.get("watch")).lower() in ("true", "1")
        verbs = {"GET": "get" if name else ("watch" if watching else "list"), "POST": "create"}
        verb = verbs.get(method, method.lower())
        action = f"{verb} {kind}" + (f"/{sub}" if sub else "")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else {}
        emulator = self.emulator
        throttled, _lost = emulator.faults.decide(action)
        token = str(self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        entry = emulator.log.record(
            action,
            {"path": url.path, "query": query, "body": body},
            throttled=throttled,
            lost=None,
            client=token or None,
        )
        if throttled:
            entry["status"] = 429
            self._send(429, ApiError(429, "TooManyRequests", "the server has received too many requests").body())
            return
        try:
            if method == "GET" and sub == "log":
                text = emulator.pod_log(ns or "default", name or "", query)
                entry.update(status=200, bytes=len(text), objects=0)
                self._send(200, text, "text/plain")
                return
            if method == "GET" and watching:
                self._stream(emulator.watch(kind, ns, query))
                return
            if method == "GET":
                answer = (
                    emulator.list(kind, ns, query) if name is None else _public(emulator._obj(kind, ns or "", name))
                )
                code = 200
            elif method == "POST":
                answer, code = emulator.create(kind, ns or "", body), 201
            elif method == "PATCH":
                answer, code = emulator.patch(kind, ns or "", name or "", body), 200
            elif method == "DELETE":
                answer, code = emulator.delete(kind, ns or "", name or "", body), 200
            else:
                raise ApiError(405, "MethodNotAllowed", method)
        except ApiError as err:
            entry["status"] = err.code
            self._send(err.code, err.body())
            return
        entry["status"] = code
        # what the answer cost: objects sent (a LIST's items, else one) and bytes
        entry["objects"] = len(answer.get("items") or []) if str(answer.get("kind", "")).endswith("List") else 1
        data = json.dumps(answer).encode()
        entry["bytes"] = len(data)
        self._send(code, data)

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def _stream(self, events: Iterator[dict[str, Any] | None]) -> None:
        # in HTTP/1.1 chunks, one or more events each, as the API server streams a watch: clients read
        # each event as it comes (a plain HTTP/1.0 body would be read to its end first)
        self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            try:
                for event in events:
                    if event is None:
                        if self._client_gone():
                            return
                        continue
                    data = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            finally:
                if isinstance(events, Iterator) and hasattr(events, "close"):
                    events.close()

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def main(argv: list[str] | None = None) -> None:
    """``python -m gpu_provider.testing.emulators.kubernetes serve --kubeconfig PATH [--ready-file PATH] [--job-cwd DIR]
    [--reclaim-after SECONDS --reclaim-name-contains TEXT --reclaim-count N]``: serve until SIGTERM."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpu_provider.testing.emulators.kubernetes")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--ready-file")
    parser.add_argument("--job-cwd", default=os.getcwd())
    parser.add_argument("--node-delay", type=float, default=1.0)
    parser.add_argument("--reclaim-after", type=float)
    parser.add_argument("--reclaim-name-contains", default="")
    parser.add_argument("--reclaim-count", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with KubernetesEmulator(job_cwd=args.job_cwd, node_delay=args.node_delay) as emulator:
        if args.reclaim_after is not None:
            emulator.reclaim_after(
                args.reclaim_after, name_contains=args.reclaim_name_contains, count=args.reclaim_count
            )
        path = emulator.kubeconfig(args.kubeconfig)
        if args.ready_file:
            Path(args.ready_file).write_text(json.dumps({"url": emulator.url, "kubeconfig": str(path)}))
        logger.info("Kubernetes emulator at %s; kubeconfig %s", emulator.url, path)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


if __name__ == "__main__":
    main()
