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
        # only what this version has: the backends registered in gpu_provider.backends (tests check it)
        "description": (
            "Run the GPU stages of ML pipelines (preprocessing, distributed training, inference) on AWS Batch "
            "or local processes, with team pools, priorities, spot capacity with on-demand fallback, "
            "checkpoint-resume, reattach after worker crashes, cost estimates and budgets, and a reaper that "
            "stops jobs no live task is behind."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "GPU jobs",
                "external-doc-url": "https://pypi.org/project/airflow-provider-gpu/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "GPU jobs",
                "python-modules": ["gpu_provider.operators.gpu_job", "gpu_provider.operators.reaper"],
            }
        ],
        "sensors": [
            {
                "integration-name": "GPU jobs",
                "python-modules": [
                    "gpu_provider.sensors.checkpoint",
                    "gpu_provider.sensors.gpu_job",
                    "gpu_provider.sensors.spot_capacity",
                ],
            }
        ],
        "triggers": [
            {
                "integration-name": "GPU jobs",
                "python-modules": [
                    "gpu_provider.triggers.checkpoint",
                    "gpu_provider.triggers.gpu_job",
                    "gpu_provider.triggers.gpu_job_watch",
                    "gpu_provider.triggers.spot_capacity",
                ],
            }
        ],
        "extra-links": [
            "gpu_provider.links.gpu_job.GpuJobConsoleLink",
            "gpu_provider.links.gpu_job.GpuJobLogsLink",
        ],
        "config": {
            "gpu_provider": {
                "description": "Defaults of the GPU job operator and its backends.",
                "options": {
                    "default_backend": {
                        "description": "Backend of a GpuJobOperator that does not name one (backend=None). One of the "
                        "registered backend names.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "local",
                        "default": "local",
                    },
                    "poll_interval": {
                        "description": "Seconds between job status checks when the task does not set poll_interval. "
                        "Empty: each backend's own default (local: 2, cloud backends: 30). Deferred "
                        "tasks of one backend share one batched status call per interval.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "15",
                        "default": "",
                    },
                    "task_log_max_mib": {
                        "description": "The most MiB of one attempt's log copied into the task log. Past it the task "
                        "log says how many lines were left out and where the job's full log is.",
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": "50",
                        "default": "10",
                    },
                    "local_run_as_user": {
                        "description": "Run the local backend's job processes as this user (the worker must run "
                        "as root), so a job cannot read the worker's environment or other jobs' state. Empty: "
                        "the worker's own user.",
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": "gpujobs",
                        "default": "",
                    },
                    "local_state_dir": {
                        "description": "Folder where the local backend keeps each job's state, exit codes and logs "
                        "(what lets a restarted worker reattach), and its GPU allocations. Empty: "
                        "$AIRFLOW_HOME/gpu_provider/local.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow/gpu_provider",
                        "default": "",
                    },
                    "batch_spot_queue": {
                        "description": "AWS Batch job queue for spot attempts (backed by a SPOT compute environment, "
                        "e.g. SPOT_PRICE_CAPACITY_OPTIMIZED). Required for capacity='spot' or "
                        "'spot_fallback' on the batch backend.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "gpu-spot",
                        "default": "",
                    },
                    "batch_on_demand_queue": {
                        "description": "AWS Batch job queue for on-demand attempts (backed by an EC2 on-demand compute"
                        " environment). Required for capacity='on_demand' or 'spot_fallback', and for "
                        "every multi-node job.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "gpu-on-demand",
                        "default": "",
                    },
                    "batch_aws_conn_id": {
                        "description": "Airflow AWS connection the batch backend uses (credentials, region, endpoint).",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "aws_default",
                        "default": "aws_default",
                    },
                    "batch_region": {
                        "description": "AWS region of the Batch queues. Empty: the connection's region.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "us-east-1",
                        "default": "",
                    },
                    "batch_job_role_arn": {
                        "description": "IAM role the Batch job's container assumes (jobRoleArn), e.g. to read and "
                        "write checkpoints on S3. Empty: none.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "arn:aws:iam::123456789012:role/gpu-job",
                        "default": "",
                    },
                    "batch_execution_role_arn": {
                        "description": "IAM role ECS uses to pull the image and read the backend's secrets "
                        "(executionRoleArn). Empty: none.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
                        "default": "",
                    },
                    "batch_log_group": {
                        "description": "CloudWatch log group of the Batch jobs.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "/aws/batch/job",
                        "default": "/aws/batch/job",
                    },
                    "batch_share_identifier": {
                        "description": "Fair-share identifier for jobs of tasks without team= when the queue has a "
                        "scheduling policy (tasks with team= use the team, '-' written as '_').",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "default",
                        "default": "default",
                    },
                    "batch_share_identifiers": {
                        "description": "JSON mapping of team names to Batch fair-share identifiers, for "
                        "identifiers a team= name cannot spell (e.g. upper case). Teams not in it use their "
                        "name with '-' written as '_'. Empty: none.",
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": '{"team-a": "teamA"}',
                        "default": "",
                    },
                    "prices": {
                        "description": "Your own instance prices, USD per instance-hour, as JSON: a plain instance "
                        "type, '<region>/<type>', 'spot/<type>' or '<region>/spot/<type>' (ml. instance types keep "
                        "that prefix). They beat live and shipped prices. Empty: none.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '{"g5.xlarge": 0.9, "eu-west-1/ml.g5.xlarge": 1.6, "spot/g5.xlarge": 0.4}',
                        "default": "",
                    },
                    "spot_price_ratio": {
                        "description": "Spot price as a share of on-demand, used where no live spot price is read "
                        "(and for managed spot on ml. instances).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "0.35",
                        "default": "0.4",
                    },
                    "local_gpu_hour_usd": {
                        "description": "What one GPU-hour on the local backend costs, in USD (for cost figures and "
                        "budgets).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "1.2",
                        "default": "0",
                    },
                    "price_instance_type": {
                        "description": "The instance type a job is priced as when the service does not report one "
                        "and the task names neither resources.instance_types nor resources.gpu_type (e.g. Batch, "
                        "whose compute environment chooses).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "g6.xlarge",
                        "default": "g5.xlarge",
                    },
                    "live_prices": {
                        "description": "Read on-demand prices from the AWS Price List API (pricing:GetProducts) and "
                        "spot prices from EC2 DescribeSpotPriceHistory, cached for a day under $AIRFLOW_HOME; on any "
                        "error the shipped table is used.",
                        "version_added": "0.4.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "price_aws_conn_id": {
                        "description": "Airflow AWS connection for live prices.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "aws_default",
                        "default": "aws_default",
                    },
                    "team_monthly_budget_usd": {
                        "description": "Monthly budget per team, USD, as JSON. A task with team= whose team spent "
                        "this calendar month (UTC; the estimated cost of the team's attempts that ended, kept in the "
                        "Airflow Variable gpu_provider_spend_<YYYY-MM>) plus its next attempt's bounded worst case "
                        "passes the budget submits nothing and fails. Empty: no team budgets.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '{"vision": 5000, "nlp": 20000}',
                        "default": "",
                    },
                    "reaper_backends": {
                        "description": "The backends GpuReaperOperator sweeps, as a JSON list of names or "
                        "backend mappings. Empty: every registered backend with its configured options.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '["local", {"name": "batch", "region_name": "us-west-2"}]',
                        "default": "",
                    },
                    "reaper_airflow_conn_id": {
                        "description": "Airflow connection of Airflow's own REST API, which the reaper asks about "
                        "each job's task instance (host with scheme and port; a user and password exchanged for a "
                        'token, or extra {"token": ...}).',
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "airflow_api",
                        "default": "airflow_api",
                    },
                    "reaper_dry_run": {
                        "description": "The reaper only reports what it would stop. Set False once its reports look "
                        "right.",
                        "version_added": "0.4.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "reaper_grace_period": {
                        "description": "Seconds after submission during which the reaper never stops a job (the "
                        "task's state may not be visible yet).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "900",
                        "default": "600",
                    },
                },
            }
        },
    }
