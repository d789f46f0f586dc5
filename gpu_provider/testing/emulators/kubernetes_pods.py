"""The controllers of the Kubernetes emulator: pods scheduled on emulated Karpenter nodes and run as
local processes, and the Job controller (indexed pods, ``podFailurePolicy``, deadlines).

:class:`PodRunner` is mixed into :class:`gpu_provider.testing.emulators.kubernetes.KubernetesEmulator` (as the Batch and
SageMaker emulators' runners are into theirs); it steps every pod and job each tick under the
emulator's lock and uses its objects, faults and settings.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from gpu_provider.testing.emulators.core import BASE_ENV, own_rendezvous_port

logger = logging.getLogger("gpu_provider.testing.emulators.kubernetes")

CAPACITY_TYPE = "karpenter.sh/capacity-type"
NODEPOOL = "karpenter.sh/nodepool"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
JOB_NAME = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TICK = 0.05


def now_rfc3339(at: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if at is None else at, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def field_value(obj: dict[str, Any], path: str) -> str:
    if path == "source":
        return str((obj.get("source") or {}).get("component") or "")
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


# --- running containers --------------------------------------------------------------------------------


#: how the kubelet ends a pod it evicts, by shape (:meth:`KubernetesEmulator.evict`): the pod's
#: ``status.reason`` and ``status.message``, and the reason of its ``DisruptionTarget`` condition
#: (``None``: no condition, as for the kubelet's limit evictions); the kubelet's and controllers' own words
EVICTIONS: dict[str, tuple[str, str, str | None]] = {
    "pod-storage-limit": (
        "Evicted",
        "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
        None,
    ),
    "container-storage-limit": ("Evicted", 'Container main exceeded its local ephemeral storage limit "1Gi". ', None),
    "emptydir-limit": ("Evicted", 'Usage of EmptyDir volume "scratch" exceeds the limit "256Mi". ', None),
    "memory-over-request": (
        "Evicted",
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. Container main was using "
        "30Gi, which exceeds its request of 16Gi. ",
        "TerminationByKubelet",
    ),
    "memory-pressure": (
        "Evicted",
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. ",
        "TerminationByKubelet",
    ),
    "disk-pressure": ("Evicted", "The node had condition: [DiskPressure]. ", "TerminationByKubelet"),
    "node-shutdown": (
        "Terminated",
        "Pod was terminated in response to imminent node shutdown.",
        "TerminationByKubelet",
    ),
    "preemption": ("", "default-scheduler: preempting to accommodate a higher priority pod", "PreemptionByScheduler"),
    "taint-manager": ("", "Taint manager: deleting due to NoExecute taint", "DeletionByTaintManager"),
    "eviction-api": ("", "Eviction API: evicting", "EvictionByEvictionAPI"),
}  # fmt: skip


def rfc3339_nano(ns: int) -> str:
    """A time in nanoseconds as Go's ``RFC3339Nano`` writes it (UTC, trailing zeros of the fraction dropped)."""
    seconds, fraction = divmod(ns, 10**9)
    text = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{fraction:09d}".rstrip("0") if fraction else "") + "Z"


def parse_rfc3339_ns(text: str) -> int:
    """An RFC 3339 time (fraction and offset optional) in nanoseconds since the epoch."""
    found = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", text.strip())
    if found is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base, fraction, zone = found.groups()
    seconds = int(datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone)).timestamp())
    return seconds * 10**9 + int((fraction or "").ljust(9, "0") or 0)


class Container:
    """The process of one pod's container and its log (each line with the time it was written, as the
    container runtime's log file keeps it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()
        self.term_at: float | None = None

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            with self.lock:
                self.lines.append((time.time_ns(), line))
        self.proc.stdout.close()

    def text(self) -> bytes:
        with self.lock:
            return b"".join(line for _, line in self.lines)

    def read(self, query: dict[str, str]) -> bytes:
        """The log as the kubelet serves it for the query's ``sinceTime`` (whole seconds: the API server
        passes it on to the kubelet in RFC 3339 without a fraction), ``sinceSeconds``, ``tailLines``,
        ``timestamps`` and ``limitBytes``."""
        with self.lock:
            entries = list(self.lines)
        since: int | None = None
        if query.get("sinceTime"):
            since = parse_rfc3339_ns(query["sinceTime"]) // 10**9 * 10**9
        elif query.get("sinceSeconds"):
            since = time.time_ns() - int(query["sinceSeconds"]) * 10**9
        if since is not None:
            entries = [e for e in entries if e[0] >= since]
        if query.get("tailLines") is not None:
            tail = int(query["tailLines"])
            entries = entries[-tail:] if tail > 0 else []
        stamped = str(query.get("timestamps")).lower() in ("true", "1")
        out = b"".join((rfc3339_nano(t).encode() + b" " + line) if stamped else line for t, line in entries)
        if query.get("limitBytes"):
            out = out[: int(query["limitBytes"])]
        return out

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def main_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or [{}]
    return statuses[0].get("state") or {}


class PodRunner:
    """What runs pods and jobs (mixed into the emulator, whose state it uses)."""

    def _loop(self) -> None:
        while not self._stop.wait(TICK):
            try:
                with self._lock:
                    self._step_jobs()
                    self._step_pods()
            except Exception:
                logger.exception("kubernetes emulator: a controller step failed")

    def _step_pods(self) -> None:
        now = time.time()
        for key, pod in list(self._store["pods"].items()):
            status, spec, meta = pod["status"], pod["spec"], pod["metadata"]
            phase = status.get("phase")
            container = self._containers.get(key)
            if key in self._reclaim_at and now >= self._reclaim_at[key] and phase == "Running":
                del self._reclaim_at[key]
                self.reclaim(key[1], key[0])
            if container is not None:
                if container.proc.poll() is not None:
                    if meta.get("deletionTimestamp"):
                        self._remove("pods", key)
                    elif phase == "Running":
                        self._finish_pod(key, pod, container.proc.returncode)
                    continue
                if meta.get("_kill_at") and now >= meta["_kill_at"]:
                    container.signal(signal.SIGKILL)
                if container.term_at and now - container.term_at > self.grace_period:
                    container.signal(signal.SIGKILL)
                deadline = spec.get("activeDeadlineSeconds")
                started = meta.get("_started")
                if deadline and started and now - started > float(deadline) and not meta.get("_deadline"):
                    meta["_deadline"] = True
                    container.signal(signal.SIGKILL)
                continue
            if phase != "Pending" or meta.get("deletionTimestamp"):
                if meta.get("deletionTimestamp"):
                    self._remove("pods", key)
                continue
            if not spec.get("nodeName"):
                self._schedule(key, pod, now)
            elif now - self._phase_since.get(key, now) >= self.start_delay:
                self._start(key, pod, now)

    def _schedule(self, key: tuple[str, str], pod: dict[str, Any], now: float) -> None:
        selector = pod["spec"].get("nodeSelector") or {}
        capacity = selector.get(CAPACITY_TYPE, "on-demand")
        allowed = _affinity_instance_types(pod)
        free = [t for t in allowed if not {f"{capacity}|{t}", f"*|{t}"} & self._shortage]
        if capacity in self._shortage or (allowed and not free):
            self._node_ready.pop(key, None)
            conditions = pod["status"]["conditions"]
            if not any(c["type"] == "PodScheduled" for c in conditions):
                conditions.append(
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": f"0/0 nodes are available; Karpenter: no {capacity} capacity for "
                        f"{selector.get(NODEPOOL, 'any node pool')} (insufficient capacity)",
                        "lastTransitionTime": now_rfc3339(),
                    }
                )
                self._touch("pods", pod, "MODIFIED")
            return
        ready = self._node_ready.setdefault(key, now + self.node_delay)
        if now < ready:
            return
        node = f"ip-10-0-{len(self._store['nodes']) % 250}-{uuid.uuid4().int % 250}.ec2.internal"
        labels = {
            CAPACITY_TYPE: capacity,
            NODEPOOL: selector.get(NODEPOOL, "default"),
            INSTANCE_TYPE: selector.get(INSTANCE_TYPE) or (free[0] if free else "g5.xlarge"),
            GPU_NAME: selector.get(GPU_NAME, "a10g"),
            "kubernetes.io/hostname": node,
        }
        self.create("nodes", "", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels}})
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()},
        ]
        pod["status"]["containerStatuses"] = [
            {
                "name": "main",
                "image": str(pod["spec"]["containers"][0].get("image") or ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        ]
        self._phase_since[key] = now
        self._touch("pods", pod, "MODIFIED")

    def _start(self, key: tuple[str, str], pod: dict[str, Any], now: float) -> None:
        spec_container = pod["spec"]["containers"][0]
        image = str(spec_container.get("image") or "")
        state = main_state(pod)
        if image in self.unpullable or "does-not-exist" in image:
            waiting = state.get("waiting") or {}
            reason = "ImagePullBackOff" if waiting.get("reason") == "ErrImagePull" else "ErrImagePull"
            if waiting.get("reason") != reason:
                message = f'Failed to pull image "{image}": not found'
                pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": reason, "message": message}}
                self._touch("pods", pod, "MODIFIED")
            return
        try:
            env = self._env(pod)
        except KeyError as err:
            waiting = {"reason": "CreateContainerConfigError", "message": str(err)}
            if state.get("waiting") != waiting:
                pod["status"]["containerStatuses"][0]["state"] = {"waiting": waiting}
                self._touch("pods", pod, "MODIFIED")
            return
        command = list(spec_container.get("command") or []) + list(spec_container.get("args") or [])
        if command and command[0] == "python":  # the image's interpreter: this one (the image is not pulled)
            command[0] = sys.executable
        proc = subprocess.Popen(
            command,
            cwd=self.job_cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._containers[key] = Container(proc)
        if (pod["spec"].get("nodeSelector") or {}).get(CAPACITY_TYPE) == "spot":
            for rule in self._reclaim_rules:
                if rule[2] > 0 and rule[1] in key[1]:
                    rule[2] -= 1
                    self._reclaim_at[key] = now + rule[0]
                    break
        pod["metadata"]["_started"] = now
        started = now_rfc3339(now)
        pod["status"].update({"phase": "Running", "startTime": started, "podIP": "127.0.0.1", "hostIP": "127.0.0.1"})
        pod["status"]["containerStatuses"][0].update(
            {"ready": True, "started": True, "state": {"running": {"startedAt": started}}}
        )
        pod["status"]["conditions"].append({"type": "Ready", "status": "True", "lastTransitionTime": started})
        self._touch("pods", pod, "MODIFIED")

    def _env(self, pod: dict[str, Any]) -> dict[str, str]:
        env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
        env.setdefault("PYTHONPATH", self.job_cwd)
        env.update(self.extra_env)
        meta = pod["metadata"]
        env["HOSTNAME"] = str(pod["spec"].get("hostname") or meta["name"])
        for entry in pod["spec"]["containers"][0].get("env") or []:
            if "value" in entry:
                value = str(entry["value"])
            else:
                source = entry.get("valueFrom") or {}
                if "fieldRef" in source:
                    path = source["fieldRef"]["fieldPath"]
                    found = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
                    if found:
                        value = str((meta.get(found.group(1)) or {}).get(found.group(2), ""))
                    else:
                        value = field_value(pod, path)
                elif "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    secret = self.secrets.get((meta["namespace"], ref["name"]))
                    if secret is None or ref["key"] not in secret:
                        raise KeyError(f'secret "{ref["name"]}" (key {ref["key"]}) not found')
                    value = secret[ref["key"]]
                else:
                    value = ""
            # no cluster DNS here: every pod is on this host
            env[entry["name"]] = "127.0.0.1" if value.endswith(".svc.cluster.local") else value
        job = (meta.get("labels") or {}).get(JOB_NAME) or meta["name"]
        own_rendezvous_port(env, f"kubernetes/{id(self)}/{meta['namespace']}/{job}")  # pods of their own network
        return env

    def _finish_pod(self, key: tuple[str, str], pod: dict[str, Any], code: int | None, *, reason: str = "") -> None:
        meta, status = pod["metadata"], pod["status"]
        meta["_failed_at"] = time.time()
        now = now_rfc3339()
        started = (main_state(pod).get("running") or {}).get("startedAt")
        if code is not None and code < 0:
            code = 128 - code
        terminated: dict[str, Any] = {
            "exitCode": 137 if code is None else code,
            "reason": "Completed" if code == 0 else "Error",
            "finishedAt": now,
        }
        if started:
            terminated["startedAt"] = started
        if meta.get("_deadline"):
            status.update(
                {
                    "phase": "Failed",
                    "reason": "DeadlineExceeded",
                    "message": "Pod was active on the node longer than the specified deadline",
                }
            )
        elif meta.get("_evicted"):
            evicted = meta["_evicted"]
            status.update({"phase": "Failed", "reason": evicted["reason"], "message": evicted["message"]})
        elif meta.get("_disrupted"):
            status.update({"phase": "Failed", "reason": reason or "", "message": "spot node reclaimed"})
        else:
            status["phase"] = "Succeeded" if code == 0 else "Failed"
        if status.get("containerStatuses"):
            status["containerStatuses"][0].update({"ready": False, "state": {"terminated": terminated}})
        self._touch("pods", pod, "MODIFIED")

    def _step_jobs(self) -> None:
        now = time.time()
        for key, job in list(self._store["jobs"].items()):
            meta, spec, status = job["metadata"], job["spec"], job["status"]
            if meta.get("deletionTimestamp"):
                if not any(k in self._store["pods"] for k in self._owned_pods(job)):
                    self._remove("jobs", key)
                continue
            if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions") or []):
                continue
            status.setdefault("startTime", now_rfc3339(now))
            meta.setdefault("_started", now)
            pods = [self._store["pods"][k] for k in self._owned_pods(job)]
            by_index: dict[int, list[dict[str, Any]]] = {}
            for pod in pods:
                by_index.setdefault(int(pod["metadata"]["annotations"][COMPLETION_INDEX]), []).append(pod)
            ignored = {p["metadata"]["name"] for p in pods if p["metadata"].get("_ignored")}
            for pod in pods:
                candidate = pod["status"].get("phase") == "Failed" and pod["metadata"]["name"] not in ignored
                if candidate and self._failure_verdict(job, pod) is None:  # an Ignore rule: replaced, not counted
                    pod["metadata"]["_ignored"] = True
                    ignored.add(pod["metadata"]["name"])
            by_index = {i: [p for p in ps if p["metadata"]["name"] not in ignored] for i, ps in by_index.items()}
            by_index = {i: ps for i, ps in by_index.items() if ps}
            failed = [p for p in pods if p["status"].get("phase") == "Failed" and p["metadata"]["name"] not in ignored]
            done = {i for i, ps in by_index.items() if any(p["status"].get("phase") == "Succeeded" for p in ps)}
            changed = status.get("failed", 0) != len(failed) or status.get("succeeded", 0) != len(done)
            status["active"] = sum(1 for p in pods if p["status"].get("phase") in ("Pending", "Running"))
            status["failed"], status["succeeded"] = len(failed), len(done)
            deadline = spec.get("activeDeadlineSeconds")
            verdict: tuple[str, str] | None = None
            if failed:
                # the controller handles failures as they come: the first pod to fail decides
                first = min(failed, key=lambda p: (p["metadata"].get("_failed_at", 0.0), p["metadata"]["name"]))
                verdict = self._failure_verdict(job, first) or ("BackoffLimitExceeded", "")
            elif deadline and now - meta["_started"] > float(deadline):
                verdict = ("DeadlineExceeded", "Job was active longer than specified deadline")
            if verdict is not None:
                stamp = now_rfc3339(now)
                status["conditions"] = [
                    {
                        "type": "FailureTarget",
                        "status": "True",
                        "reason": verdict[0],
                        "message": verdict[1],
                        "lastTransitionTime": stamp,
                    },
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": verdict[0],
                        "message": verdict[1],
                        "lastTransitionTime": stamp,
                    },
                ]
                for pod in pods:
                    if pod["status"].get("phase") in ("Pending", "Running"):
                        self._delete("pods", (pod["metadata"]["namespace"], pod["metadata"]["name"]), "Background")
                self._touch("jobs", job, "MODIFIED")
                continue
            if len(done) >= int(spec["completions"]):
                stamp = now_rfc3339(now)
                status["completionTime"] = stamp
                status["conditions"] = [
                    {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": stamp},
                    {"type": "Complete", "status": "True", "lastTransitionTime": stamp},
                ]
                self._touch("jobs", job, "MODIFIED")
                continue
            for index in range(int(spec["completions"])):
                if index not in by_index:
                    self._create_job_pod(job, index)
                    changed = True
            if changed:
                self._touch("jobs", job, "MODIFIED")

    def _failure_verdict(self, job: dict[str, Any], pod: dict[str, Any]) -> tuple[str, str] | None:
        """How the Job controller takes a failed pod: (reason, message) of the Job's failure, ``None``
        when an ``Ignore`` rule matches (the pod is replaced and not counted)."""
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        code = (main_state(pod).get("terminated") or {}).get("exitCode")
        for i, rule in enumerate((job["spec"].get("podFailurePolicy") or {}).get("rules") or []):
            matched = ""
            for wanted in rule.get("onPodConditions") or []:
                if any(
                    c["type"] == wanted["type"] and c.get("status") == wanted.get("status", "True")
                    for c in pod["status"].get("conditions") or []
                ):
                    matched = f"Pod {name} has condition {wanted['type']} matching {rule['action']} rule at index {i}"
            codes = rule.get("onExitCodes")
            if codes and code is not None and not pod["metadata"].get("_disrupted"):
                inside = code in codes["values"]
                if inside == (codes["operator"] == "In"):
                    matched = (
                        f"Container main for pod {name} failed with exit code {code} matching {rule['action']} "
                        f"rule at index {i}"
                    )
            if matched and rule["action"] == "FailJob":
                return "PodFailurePolicy", matched
            if matched and rule["action"] == "Ignore":
                return None
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"

    def _create_job_pod(self, job: dict[str, Any], index: int) -> None:
        meta, template = job["metadata"], job["spec"]["template"]
        name = meta["name"]
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels.update({JOB_NAME: name, "job-name": name, COMPLETION_INDEX: str(index), "controller-uid": meta["uid"]})
        annotations = dict((template.get("metadata") or {}).get("annotations") or {})
        annotations[COMPLETION_INDEX] = str(index)
        spec = copy.deepcopy(template["spec"])
        spec["hostname"] = f"{name}-{index}"
        spec["containers"][0].setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": meta["uid"], "controller": True}
        self.create(
            "pods",
            meta["namespace"],
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-{index}-{uuid.uuid4().hex[:5]}",
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [owner],
                },
                "spec": spec,
            },
        )


def _affinity_instance_types(pod: dict[str, Any]) -> list[str]:
    """The instance types a pod's required node affinity allows (``node.kubernetes.io/instance-type In``)."""
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    out: list[str] = []
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == INSTANCE_TYPE and expr.get("operator") == "In":
                out += [str(v) for v in expr.get("values") or []]
    return out
