"""The event sources of issue 29 as the benchmarks turn them on and off (``docs/how-to/events.md``).

Ours with events *off* is the regular poll alone (every ``poll_interval``); with events *on*, the shared
poller also listens to the service (Kubernetes: one pod watch per namespace; Batch and SageMaker: the
EventBridge rule ``gpu-provider events render`` prints, delivering each state change to an SQS queue the
poller long-polls) and its regular poll slows to the backstop (``[gpu_provider] event_backstop_interval``,
60 s). The settings are process-wide, so each side runs in a process of its own with its environment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the environment that turns every event source off (the Kubernetes watch is on by default)
EVENTS_OFF = {"AIRFLOW__GPU_PROVIDER__KUBERNETES_WATCH": "false"}


def wire_aws_events(client: Callable[[str], Any], kind: str, name: str) -> str:
    """On an AWS emulator (its ``client``), the queue and the EventBridge rule of ``kind``'s events; returns the
    queue's URL (:func:`gpu_provider.testing.events.wire_event_queue`)."""
    from gpu_provider.testing.events import wire_event_queue

    return wire_event_queue(client, kind, name)[0]


def events_on(kind: str, queue_url: str | None = None) -> dict[str, str]:
    """The environment that turns ``kind``'s event source on (Batch and SageMaker: with the queue at ``queue_url``)."""
    if kind == "kubernetes":
        return {"AIRFLOW__GPU_PROVIDER__KUBERNETES_WATCH": "true"}
    if kind in ("batch", "sagemaker"):
        if not queue_url:
            raise ValueError(f"events on {kind} need the queue's URL")
        return {f"AIRFLOW__GPU_PROVIDER__{kind.upper()}_EVENTS_QUEUE_URL": queue_url}
    raise ValueError(f"backend {kind!r} has no event source (batch, sagemaker, kubernetes)")
