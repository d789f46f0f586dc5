"""``Backend.event_source()``: which backends have one, and when (issue 29)."""

from __future__ import annotations

import pytest

from gpu_provider.backends.aws.events import QueueEvents
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.kubernetes.events import PodWatch
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.sagemaker import SageMakerBackend

SAGEMAKER = {"role_arn": "arn:aws:iam::123456789012:role/x", "output_path": "s3://models/out"}
URL = "https://sqs.us-east-1.amazonaws.com/123456789012/gpu-provider-events"


def test_only_kubernetes_has_events_without_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("BATCH_EVENTS_QUEUE_URL", "SAGEMAKER_EVENTS_QUEUE_URL", "KUBERNETES_WATCH"):
        monkeypatch.delenv(f"AIRFLOW__GPU_PROVIDER__{key}", raising=False)
    assert LocalBackend().event_source() is None
    assert BatchBackend(spot_queue="s", on_demand_queue="o").event_source() is None
    assert SageMakerBackend(**SAGEMAKER).event_source() is None
    watch = KubernetesBackend(namespace="team-a").event_source()
    assert isinstance(watch, PodWatch) and watch.key == "kubernetes:kubernetes_default:team-a"


def test_one_queue_for_both_aws_backends_is_one_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL", URL)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__SAGEMAKER_EVENTS_QUEUE_URL", URL)
    batch = BatchBackend(spot_queue="s", on_demand_queue="o").event_source()
    sagemaker = SageMakerBackend(**SAGEMAKER).event_source()
    assert isinstance(batch, QueueEvents) and isinstance(sagemaker, QueueEvents)
    assert batch.key == sagemaker.key == f"sqs:{URL}", "one reader per queue in a triggerer"
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS", "30")
    with pytest.raises(ValueError, match=r"aws_events_wait_seconds='30': must be a whole number from 1 to 20"):
        BatchBackend(spot_queue="s", on_demand_queue="o").event_source()
