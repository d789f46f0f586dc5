"""Finding attempts again: a task instance's attempts by their labels, one by name, and every active
Pod and Job of this provider (what the reaper and the GPU page read)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, OwnedJob, TaskKey, lookup_key
from gpu_provider.backends.kubernetes.manifests import (
    ANNOTATION_MAX_RUNTIME,
    JOB,
    MANAGED_BY,
    MANAGER,
    POD,
    is_dns1123_subdomain,
    kind_of,
    label_value,
    map_index_label,
)
from gpu_provider.backends.kubernetes.mapping import (
    STATE_TABLE,
    job_remote_state,
    parse_time,
    pod_remote_state,
    pod_times,
)
from gpu_provider.backends.kubernetes.objects import handle_of
from gpu_provider.backends.kubernetes.ownership import owner_try_of, task_of

if TYPE_CHECKING:
    from gpu_provider.backends.kubernetes.objects import Objects


def find_existing(objects: Objects, task: TaskKey, *, backend: str) -> list[JobHandle]:
    """Every attempt of the task instance in the namespace, found by its labels (run hash, map index)."""
    labels = (
        f"{MANAGED_BY}={MANAGER}",
        f"{names.TAG_RUN_HASH}={task.run_hash}",
        f"{names.TAG_MAP_INDEX}={map_index_label(task.map_index)}",
        f"{names.TAG_DAG_ID}={label_value(task.dag_id) or 'x'}",
        f"{names.TAG_TASK_ID}={label_value(task.task_id) or 'x'}",
    )
    selector = ",".join(labels)
    handles = [
        handle_of(obj, kind, backend=backend, namespace=objects.namespace)
        for kind, obj in objects.attempts(selector)
        if task_of(obj) == task
    ]
    return sorted(handles, key=lambda h: (h.attempt, h.submitted_at))


def lookup(objects: Objects, *, job_id: str | None, name: str | None, backend: str) -> JobHandle | None:
    """A Pod or Job by its name (on Kubernetes an object's name in its namespace is its id)."""
    field_name, value = lookup_key(job_id, name)
    if not is_dns1123_subdomain(value):
        raise ValueError(f"{field_name}={value!r}: not a Kubernetes object name (a DNS-1123 subdomain)")
    for kind in (POD, JOB):
        obj = objects.get(kind, value)
        if obj is not None:
            return handle_of(obj, kind, backend=backend, namespace=objects.namespace)
    return None


def task_of_handle(objects: Objects, handle: JobHandle) -> TaskKey | None:
    """The task instance the attempt's object names now (one GET); ``None`` when it is gone or names none."""
    obj = objects.get(kind_of(handle), handle.name)
    return task_of(obj) if obj is not None else None


def list_owned(objects: Objects, *, backend: str) -> list[OwnedJob]:
    """Every active Pod and Job in the namespace carrying this provider's labels."""
    owned = []
    for kind, obj in objects.attempts(f"{MANAGED_BY}={MANAGER}", active=True):
        if kind == POD:
            remote, _ = pod_remote_state(obj)
        else:
            remote, _ = job_remote_state(obj, [])
        state = STATE_TABLE.get(remote)
        if state is None or state.terminal or (obj.get("metadata") or {}).get("deletionTimestamp"):
            continue
        handle = handle_of(obj, kind, backend=backend, namespace=objects.namespace)
        meta = obj.get("metadata") or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        runtime = str(notes.get(ANNOTATION_MAX_RUNTIME) or "")
        started = pod_times(obj)[0] if kind == POD else parse_time((obj.get("status") or {}).get("startTime"))
        owned.append(
            OwnedJob(
                handle=handle,
                task=task_of(obj),
                state=state,
                try_number=owner_try_of(obj),
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
