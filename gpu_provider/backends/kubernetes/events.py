"""The Kubernetes backend's event source: one watch of this provider's pods per namespace.

The watch (``GET /api/v1/namespaces/<ns>/pods?watch=1&labelSelector=app.kubernetes.io/managed-by=...``)
runs in a thread of the triggerer (:mod:`gpu_provider.triggers.events`) and tells the shared poller
which attempts' pods ended, were disrupted or deleted; the poller then polls those at once. After a
dropped connection or the server's ``timeoutSeconds`` it resumes from the last ``resourceVersion`` it
saw (bookmarks included), so nothing is missed; a 410 Gone (the version is compacted away) makes it
list again for a fresh version and has every watched job polled, since changes may have been missed.
The poller's regular LIST stays as the backstop.

Only changes a poll acts on at once are reported, once each (a pod that started running, ended, is
being deleted, got a ``DisruptionTarget`` condition, or is gone): each other change (a label patched,
a container status refreshed) would cost a poll and bring nothing the backstop tick does not.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from gpu_provider.backends.base import EventSink, EventSource
from gpu_provider.backends.kubernetes.calls import Api, call, raw, status_of
from gpu_provider.backends.kubernetes.manifests import LABEL_ATTEMPT_NAME, MANAGED_BY, MANAGER

log = logging.getLogger(__name__)

#: seconds the API server keeps one watch request open before the client resumes it
WATCH_TIMEOUT_S = 290
#: the label selector of the watch: every pod this provider created
SELECTOR = f"{MANAGED_BY}={MANAGER}"
#: pods whose last reported state the watch remembers (the oldest is forgotten first)
SEEN_PODS = 50_000
#: dropped connections in a row resumed before the watch is reported failed (and runs again after a backoff)
RESUME_TRIES = 3


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def pod_state(event: Mapping[str, Any]) -> tuple[str, bool, bool] | None:
    """What of a pod a poll acts on at once: its phase, whether it is being deleted, whether it got a
    ``DisruptionTarget`` condition; ``None`` for a deleted pod or an event that is not about a pod."""
    if event.get("type") not in ("ADDED", "MODIFIED"):
        return None
    pod = event.get("object") or {}
    status = pod.get("status") or {}
    disrupted = any(c.get("type") == "DisruptionTarget" for c in status.get("conditions") or [])
    return str(status.get("phase") or ""), bool((pod.get("metadata") or {}).get("deletionTimestamp")), disrupted


def lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Whole lines out of a stream of chunks (a chunk may hold several lines, or part of one)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        yield from (line for line in whole if line.strip())
    if pending.strip():
        yield pending


class PodWatch(EventSource):
    """Watches the provider's pods in one namespace (see the module docstring)."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.key = f"kubernetes:{api.conn_id}:{namespace}"
        self._response: Any = None
        self._lock = threading.Lock()
        #: the last resourceVersion the watch saw
        self.version = ""
        #: the last state reported per pod (bounded: SEEN_PODS)
        self._seen: dict[str, tuple[str, bool, bool]] = {}
        #: how many times the watch listed again after 410 Gone, and how many watch requests it made
        self.relists = 0
        self.requests = 0

    def _list_version(self) -> str:
        page = call(
            "list pods",
            lambda: raw(self.api.core.list_namespaced_pod, self.namespace, label_selector=SELECTOR, limit=1),
        )
        return str((page.get("metadata") or {}).get("resourceVersion") or "")

    def run(self, sink: EventSink, stop: threading.Event) -> None:
        version: str | None = None
        failures = 0
        while not stop.is_set():
            if version is None:
                version = self._list_version()
                sink.changed(None)  # anything may have changed while nobody watched
            try:
                version = self._watch(version, sink, stop)
                failures = 0
            except WatchExpired as err:
                self.relists += 1
                log.info("Kubernetes watch of %s: %s; listing again.", self.namespace, err)
                version = None
            except Exception as err:
                if stop.is_set():
                    return
                if status_of(err) == 410:
                    self.relists += 1
                    version = None
                    continue
                failures += 1
                if status_of(err) in (401, 403, 404) or failures > RESUME_TRIES:
                    raise
                # a dropped connection: resume from the last version seen, after a short pause
                sink.up(False)
                log.info("Kubernetes watch of %s dropped (%s); resuming from %s.", self.namespace, err, version)
                stop.wait(min(5.0, 0.5 * 2**failures))

    def _watch(self, version: str, sink: EventSink, stop: threading.Event) -> str:
        self.requests += 1
        response = self.api.core.list_namespaced_pod(
            self.namespace,
            label_selector=SELECTOR,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(10, WATCH_TIMEOUT_S + 30),
        )
        with self._lock:
            self._response = response
        try:
            if stop.is_set():
                return version
            sink.up(True)
            for line in lines(response.stream(amt=None, decode_content=True)):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(str(obj.get("message") or "410 Gone"))
                    raise RuntimeError(f"the watch answered an error: {obj.get('code')} {obj.get('message')}")
                meta = obj.get("metadata") or {}
                version = self.version = str(meta.get("resourceVersion") or version)
                attempt = (meta.get("labels") or {}).get(LABEL_ATTEMPT_NAME)
                if attempt and self._worth_a_poll(str(meta.get("name") or ""), event):
                    sink.changed({str(attempt)})
                if stop.is_set():
                    break
        except Exception:
            if stop.is_set():
                return version
            raise
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return version

    def _worth_a_poll(self, pod: str, event: Mapping[str, Any]) -> bool:
        """Whether a watch event changed what a poll of its attempt acts on at once: a pod that started
        running, ended, is being deleted or disrupted, or is gone. Other changes (a label patched, a
        container's status refreshed) would each cost a poll and bring nothing the backstop does not."""
        if event.get("type") == "DELETED":
            self._seen.pop(pod, None)
            return True
        state = pod_state(event)
        if state is None or (state[0] == "Pending" and not any(state[1:])):
            return False
        if self._seen.get(pod) == state:
            return False
        self._seen[pod] = state
        if len(self._seen) > SEEN_PODS:
            del self._seen[next(iter(self._seen))]  # the oldest: at worst one more poll of it
        return True

    def close(self) -> None:
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()  # wakes the read blocked in run()'s thread
            except Exception as err:  # a connection already gone
                log.debug("closing the watch: %s", err)
