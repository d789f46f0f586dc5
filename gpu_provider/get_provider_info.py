"""Provider metadata for Airflow (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-gpu",
        "name": "GPU jobs",
        "description": "GPU stages of ML pipelines on AWS Batch, SageMaker, Karpenter pods or local processes.",
        "versions": ["0.1.0"],
    }
