"""Provider metadata for Airflow (entry point ``apache_airflow_provider``).

Airflow reads this to list the provider (``airflow providers list``), its operators, triggers and
extra links, and the ``[gpu_provider]`` config section with each option's description and default.
"""

from __future__ import annotations

from typing import Any

from gpu_provider import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-gpu",
        "name": "GPU jobs",
        "description": (
            "Run the GPU stages of ML pipelines (preprocessing, distributed training, inference) on AWS Batch, "
            "SageMaker, Karpenter pods or local processes, with team pools, priorities, spot capacity with "
            "on-demand fallback, checkpoint-resume, reattach after worker crashes and spend control."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "GPU jobs",
                "external-doc-url": "https://pypi.org/project/airflow-provider-gpu/",
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": "GPU jobs", "python-modules": ["gpu_provider.operators.gpu_job"]}],
        "sensors": [{"integration-name": "GPU jobs", "python-modules": ["gpu_provider.sensors.checkpoint"]}],
        "triggers": [{"integration-name": "GPU jobs", "python-modules": ["gpu_provider.triggers.gpu_job"]}],
        "extra-links": ["gpu_provider.links.gpu_job.GpuJobConsoleLink"],
        "config": {
            "gpu_provider": {
                "description": "Defaults of the GPU job operator and its backends.",
                "options": {
                    "default_backend": {
                        "description": "Backend of a GpuJobOperator that does not name one (backend=None). "
                        "One of the registered backend names.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "local",
                        "default": "local",
                    },
                    "poll_interval": {
                        "description": "Seconds between job status checks when the task does not set "
                        "poll_interval. Empty: each backend's own default (local: 2, cloud backends: 30). "
                        "Deferred tasks of one backend share one batched status call per interval.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "15",
                        "default": "",
                    },
                    "local_state_dir": {
                        "description": "Folder where the local backend keeps each job's state, exit codes and "
                        "logs (what lets a restarted worker reattach), and its GPU allocations. Empty: "
                        "$AIRFLOW_HOME/gpu_provider/local.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow/gpu_provider",
                        "default": "",
                    },
                },
            }
        },
    }
