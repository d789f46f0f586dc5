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

The parts: the object store (selectors, merge patch, garbage collection, watches' history) is
:mod:`~gpu_provider.testing.emulators.kubernetes_store`, the HTTP side (paths, request log, watch streams)
:mod:`~gpu_provider.testing.emulators.kubernetes_http`, the scheduler, kubelet and Job controller
:mod:`~gpu_provider.testing.emulators.kubernetes_pods`; this module holds the emulator, its test knobs and
its command line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gpu_provider.testing.emulators.core import Faults, RequestLog
from gpu_provider.testing.emulators.kubernetes_http import _Handler, _Server
from gpu_provider.testing.emulators.kubernetes_pods import EVICTIONS, Container, PodRunner, now_rfc3339
from gpu_provider.testing.emulators.kubernetes_store import (
    _KINDS,
    ApiError,
    ObjectStore,
    field_matcher,
    label_matcher,
    merge_patch,
)
from gpu_provider.testing.emulators.serve import stop_event, write_atomically

__all__ = ["ApiError", "KubernetesEmulator", "field_matcher", "label_matcher", "main", "merge_patch"]

logger = logging.getLogger(__name__)


class KubernetesEmulator(ObjectStore, PodRunner):
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

    def requests(self, action: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """API requests received, oldest first: ``{"action", "body", "throttled", "lost", "time", "status",
        "client"}``, and for an answered read ``objects`` (items of a LIST, 1 for a GET, 0 for a log) and
        ``bytes`` (the answer's size); ``action`` is ``verb kind[/sub]`` (``get pods``, ``watch events``),
        ``body`` holds the path, query and body; ``client`` is the bearer token the request carried (see
        :meth:`kubeconfig`)."""
        return self.log.requests(action, since=since)

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
    stop = stop_event((signal.SIGTERM,))  # Ctrl-C: KeyboardInterrupt, below
    with KubernetesEmulator(job_cwd=args.job_cwd, node_delay=args.node_delay) as emulator:
        if args.reclaim_after is not None:
            emulator.reclaim_after(
                args.reclaim_after, name_contains=args.reclaim_name_contains, count=args.reclaim_count
            )
        path = emulator.kubeconfig(args.kubeconfig)
        if args.ready_file:
            write_atomically(Path(args.ready_file), json.dumps({"url": emulator.url, "kubeconfig": str(path)}))
        logger.info("Kubernetes emulator at %s; kubeconfig %s", emulator.url, path)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


if __name__ == "__main__":
    main()
