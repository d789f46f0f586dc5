"""Who owns an attempt and how it is ended: the task its annotations name, the owner-try label and
``mark``, and the cancel protocol (the reason annotated on the object and written in an Event that
outlives it, then a foreground delete)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, OwnerRead, TaskKey, map_state
from gpu_provider.backends.common import mark_tags
from gpu_provider.backends.kubernetes.calls import exists, status_of
from gpu_provider.backends.kubernetes.manifests import (
    ANNOTATION_DAG_ID,
    ANNOTATION_RUN_ID,
    ANNOTATION_TASK_ID,
    MANAGER,
    POD,
    kind_of,
)
from gpu_provider.backends.kubernetes.mapping import (
    CANCEL_ANNOTATION,
    EVENT_CANCELLED,
    EVENT_FAILED,
    STATE_TABLE,
    job_remote_state,
    pod_remote_state,
)
from gpu_provider.exceptions import GpuJobError

if TYPE_CHECKING:
    from gpu_provider.backends.kubernetes.objects import Objects

log = logging.getLogger(__name__)


def task_of(obj: Mapping[str, Any]) -> TaskKey | None:
    """The task instance a Pod or Job belongs to, from its annotations (whole ids) and map-index label."""
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    dag_id, task_id, run_id = (notes.get(k) for k in (ANNOTATION_DAG_ID, ANNOTATION_TASK_ID, ANNOTATION_RUN_ID))
    if not (dag_id and task_id and run_id):
        return None
    text = str(labels.get(names.TAG_MAP_INDEX) or "none")
    map_index = int(text) if text.isdigit() else -1
    return TaskKey(str(dag_id), str(task_id), str(run_id), map_index)


def owner_try_of(obj: Mapping[str, Any]) -> int | None:
    """The try that owns the object: its owner-try label, else the try that created it."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    owner = str(labels.get(names.TAG_OWNER_TRY) or labels.get(names.TAG_TRY_NUMBER) or "")
    return int(owner) if owner.isdigit() else None


def read_owner(objects: Objects, handle: JobHandle) -> OwnerRead:
    """GET the attempt's Pod or Job by name now: its owner-try label (never a listing poll kept)."""
    obj = objects.get(kind_of(handle), handle.name)
    if obj is None:
        return OwnerRead(owner_try=None, exists=False)
    return OwnerRead(owner_try=owner_try_of(obj))


def mark(objects: Objects, handle: JobHandle, *, owner_try: int | None = None, collected: bool = False) -> None:
    """Label the Pod or Job: the try that owns it, or that its outcome was collected."""
    labels = mark_tags(owner_try, collected)
    if not labels:
        return
    kind = kind_of(handle)
    try:
        objects.patch(kind, handle.name, {"metadata": {"labels": labels}}, what=f"label {kind} {handle.name}")
    except Exception as err:
        if status_of(err) == 404:
            raise GpuJobError(
                f"Kubernetes no longer knows {kind} {objects.namespace}/{handle.name}: it cannot be labelled"
            ) from err
        raise


def cancel(objects: Objects, handle: JobHandle, reason: str) -> None:
    """Delete the attempt's object unless it has ended (a pod that can never start is deleted all the same)."""
    kind = kind_of(handle)
    obj = objects.get(kind, handle.name)
    if obj is None:
        return
    if kind == POD:
        remote, _ = pod_remote_state(obj)
    else:
        remote, _ = job_remote_state(obj, [])
    try:
        ended = remote != "Deleted" and map_state(STATE_TABLE, remote, backend="kubernetes").terminal
    except ValueError:  # a state this version does not know is not known to have ended: stop it
        ended = False
    if ended and not remote.startswith("Pending:"):  # a pod that can never start still holds its node request
        return  # ended: nothing to stop, and its outcome stays readable
    stop(objects, handle, names.CANCEL_PREFIX + reason, event=EVENT_CANCELLED)


def stop(objects: Objects, handle: JobHandle, reason: str, *, event: str) -> None:
    """Mark ``reason`` on the object and in an Event (which outlives it), then delete it."""
    kind = kind_of(handle)
    text = reason[:1024]
    patch = {"metadata": {"annotations": {CANCEL_ANNOTATION: text}}}
    exists(lambda: objects.patch(kind, handle.name, patch, what=f"patch {kind} {handle.name}"))
    objects.create_event(tombstone(handle, objects.namespace, event, text))
    objects.delete(kind, handle.name)
    log.info("Deleted Kubernetes %s %s/%s: %s", kind, objects.namespace, handle.name, text)


def tombstone(handle: JobHandle, namespace: str, reason: str, message: str) -> dict[str, Any]:
    """The Event that says why this provider deleted the attempt's object (read by a poll once it is gone)."""
    kind = kind_of(handle)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{handle.name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1" if kind == POD else "batch/v1",
            "kind": kind,
            "name": handle.name,
            "namespace": namespace,
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


def tombstones(objects: Objects, name: str) -> list[dict[str, Any]]:
    """This provider's Events about the object ``name`` that say how it ended, oldest first."""
    found = [
        e
        for e in objects.events(f"involvedObject.name={name},source={MANAGER}")
        if e.get("reason") in (EVENT_CANCELLED, EVENT_FAILED)
    ]
    return sorted(found, key=lambda e: str(e.get("lastTimestamp") or ""))
