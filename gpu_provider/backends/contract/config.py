"""The ``[gpu_provider]`` config section, read where Airflow is installed (job-side code runs without it)."""

from __future__ import annotations


def provider_config(key: str) -> str:
    """``[gpu_provider] <key>`` from the Airflow config, stripped; ``""`` when unset or Airflow is absent."""
    try:
        from airflow.configuration import conf  # imported here: job-side code never needs Airflow
    except ImportError:
        return ""
    return str(conf.get("gpu_provider", key, fallback="") or "").strip()
