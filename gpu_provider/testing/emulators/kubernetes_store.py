"""The Kubernetes emulator's object store: objects by kind and namespace, resource versions and the change
history that watches read, create/get/list/patch/delete with label and field selectors, merge patch and
garbage collection (:class:`ObjectStore`, a mixin of
:class:`~gpu_provider.testing.emulators.kubernetes.KubernetesEmulator`)."""

from __future__ import annotations

import bisect
import copy
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from gpu_provider.testing.emulators.kubernetes_pods import Container, field_value, main_state, now_rfc3339

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


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without the emulator's private ``_`` fields in its metadata."""
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj["metadata"].items() if not k.startswith("_")}
    return copy.deepcopy(out)


class ObjectStore:
    """The API objects and their history (a mixin over the emulator's lock, its condition ``_changed`` and the
    state its ``__init__`` sets up)."""

    grace_period: float
    mute_watches: bool
    _lock: threading.RLock
    _changed: threading.Condition
    _store: dict[str, dict[tuple[str, str], dict[str, Any]]]
    _history: list[tuple[int, str, str, dict[str, Any]]]
    _rv: int
    _compacted: int
    _watch_generation: int
    _open_watches: dict[int, tuple[str, str | None, str]]
    _containers: dict[tuple[str, str], Container]
    _phase_since: dict[tuple[str, str], float]
    _stop: threading.Event

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self._lock:
            obj = self._store[kind].get((namespace, name))
            return _public(obj) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = "default") -> list[dict[str, Any]]:
        with self._lock:
            return [_public(o) for (ns, _), o in self._store[kind].items() if namespace is None or ns == namespace]

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
