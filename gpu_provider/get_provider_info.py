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
            "Run the GPU stages of ML pipelines (preprocessing, distributed training, inference) on AWS Batch, "
            "SageMaker training jobs, Karpenter-provisioned Kubernetes pods or local processes, with team pools, "
            "priorities, spot capacity with on-demand fallback, checkpoint-resume, reattach after worker crashes, "
            "cost estimates and budgets, and a reaper that stops jobs no live task is behind."
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
                        "Empty: each backend's own default (local: 2, batch: 30, sagemaker: 30, kubernetes: "
                        "5). Deferred tasks of one backend configuration with the same poll interval share one "
                        "batched status call per interval.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "15",
                        "default": "",
                    },
                    "event_backstop_interval": {
                        "description": "Seconds between the regular status checks of deferred tasks while their "
                        "backend's events flow (a Kubernetes watch, EventBridge events read from SQS): a job named "
                        "by an event is checked at once, and this backstop check catches what events missed. Never "
                        "shorter than the poll interval; when events stop, checks return to the poll interval. "
                        "See docs/how-to/events.md.",
                        "version_added": "0.4.0",
                        "type": "float",
                        "example": "120",
                        "default": "60",
                    },
                    "kubernetes_watch": {
                        "description": "Whether the triggerer watches the provider's pods (one watch per namespace, "
                        "label-selected; needs the watch verb on pods) to see a pod's end within about a second. "
                        "False: polling only.",
                        "version_added": "0.4.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "worker_wait_events": {
                        "description": "Whether a task that waits on its worker (deferrable=False) listens to its "
                        "backend's events too (the Kubernetes watch, the Batch or SageMaker events queue), so an end "
                        "or an interruption is seen at once instead of at the next poll. Each such task process "
                        "opens its own reader: use it where few tasks wait on workers at a time, or give the workers "
                        "a queue of their own. See docs/how-to/events.md.",
                        "version_added": "0.4.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "batch_events_queue_url": {
                        "description": "URL of an SQS queue that an EventBridge rule fills with 'Batch Job State "
                        "Change' events (gpu-provider events render --backend batch prints what to create). Read "
                        "by the triggerer through the batch backend's AWS connection. Empty: polling only.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "https://sqs.us-east-1.amazonaws.com/123456789012/gpu-provider-events",
                        "default": "",
                    },
                    "sagemaker_events_queue_url": {
                        "description": "URL of an SQS queue that an EventBridge rule fills with 'SageMaker Training "
                        "Job State Change' events (gpu-provider events render --backend sagemaker). May be the "
                        "Batch queue when both backends use one AWS connection. Empty: polling only.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "https://sqs.us-east-1.amazonaws.com/123456789012/gpu-provider-events",
                        "default": "",
                    },
                    "aws_events_wait_seconds": {
                        "description": "WaitTimeSeconds of each SQS long poll of the events queues (1 to 20).",
                        "version_added": "0.4.0",
                        "type": "integer",
                        "example": "20",
                        "default": "20",
                    },
                    "max_attempt_records": {
                        "description": "The most attempt records a task instance keeps in its task state store "
                        "(and hands its trigger). Past it, the oldest attempts of runs already finished (a task "
                        "cleared and run again) are folded into one summary entry that keeps their count, states, "
                        "interruptions, GPU-seconds, billable seconds and cost; the current run's attempts are "
                        "never folded. At least 2.",
                        "version_added": "0.4.0",
                        "type": "integer",
                        "example": "20",
                        "default": "50",
                    },
                    "task_log_max_mib": {
                        "description": "The most MiB of one attempt's log copied into the task log. Past it the task "
                        "log says how many lines were left out and where the job's full log is.",
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": "50",
                        "default": "10",
                    },
                    "log_settle_read_s": {
                        "description": "Seconds between two reads of a job's log after the job ended, while the task "
                        "waits for late lines of a job whose log has no end-of-log marker from every node (a job not "
                        "started through the runtime helper). Two reads in a row that bring nothing end the wait; "
                        "the backend caps it (Batch and SageMaker: 6 s). Between 0.05 and 60.",
                        "version_added": "0.5.0",
                        "type": "float",
                        "example": "2",
                        "default": "1",
                    },
                    "refuse_secrets_in_env": {
                        "description": "Refuse (a DAG import error) instead of warning when a GpuJobOperator passes "
                        "a secret through env= to a remote backend: a template reading a connection's password or "
                        "extra, a Variable with a secret's name, or any template under a secret's name (HF_TOKEN, "
                        "DB_PASSWORD, ...). env= values travel in the job's request, readable by anyone allowed to "
                        "describe the job; the backends' secrets= option passes references instead.",
                        "version_added": "0.4.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "local_fork_server": {
                        "description": "Start the local backend's job supervisors by fork() from a per-user fork "
                        "server (started detached on first use, under local_state_dir/forkserver), instead of a new "
                        "Python interpreter per job: a launch saves the interpreter's start and imports (about 45 ms). "
                        "The job still outlives the worker and the server; when the server is missing or refuses, "
                        "the supervisor is spawned as before. false: always spawn.",
                        "version_added": "0.5.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "local_fork_server_idle_s": {
                        "description": "Seconds the local backend's fork server waits for a request before it "
                        "exits (the next launch starts it again). The jobs it started run on.",
                        "version_added": "0.5.0",
                        "type": "float",
                        "example": "60",
                        "default": "600",
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
                    "batch_queues_by_instance_type": {
                        "description": "JSON mapping of instance types to the Batch job queue(s) running them, "
                        "for ordered instance fallback (capacity=SpotFallback(instances=InstanceFallback())): a "
                        'queue for both capacities, or {"spot": <queue>, "on-demand": <queue>}. Empty: none.',
                        "version_added": "0.5.0",
                        "type": "string",
                        "example": '{"p5.48xlarge": {"spot": "p5-spot", "on-demand": "p5-od"}, "g6e.48xlarge": "g6e"}',
                        "default": "",
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
                    "kubernetes_conn_id": {
                        "description": "Airflow Kubernetes connection the kubernetes backend uses (in-cluster, a "
                        "kubeconfig path or a kubeconfig in its extras).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "kubernetes_default",
                        "default": "kubernetes_default",
                    },
                    "kubernetes_namespace": {
                        "description": "Namespace of the pods, jobs and services the kubernetes backend creates.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "gpu-jobs",
                        "default": "default",
                    },
                    "kubernetes_spot_node_pool": {
                        "description": "Karpenter NodePool of spot attempts (nodeSelector karpenter.sh/nodepool); '-' "
                        "places by capacity type only.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "gpu-spot",
                        "default": "gpu-spot",
                    },
                    "kubernetes_on_demand_node_pool": {
                        "description": "Karpenter NodePool of on-demand attempts; '-' places by capacity type only.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "gpu-on-demand",
                        "default": "gpu-on-demand",
                    },
                    "kubernetes_service_account": {
                        "description": "Service account of the job pods (e.g. one with an IAM role for S3 "
                        "checkpoints). Empty: the namespace's default.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "gpu-jobs",
                        "default": "",
                    },
                    "kubernetes_image_pull_secrets": {
                        "description": "Comma-separated Secrets the job pods pull their image with. Empty: none.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "ecr-pull",
                        "default": "",
                    },
                    "kubernetes_priority_classes": {
                        "description": "JSON mapping of PriorityClass names to the lowest priority= each gets; a job "
                        "gets the class with the highest bound not above its priority (0 without one). Empty: gpu-low, "
                        "gpu-normal from 0, gpu-high from 100 (docker/karpenter/priorityclasses.yaml).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '{"gpu-low": -2147483647, "gpu-normal": 0, "gpu-high": 100}',
                        "default": "",
                    },
                    "kubernetes_node_selector": {
                        "description": "JSON object of node labels added to every job pod's nodeSelector. Empty: none.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '{"team": "ml"}',
                        "default": "",
                    },
                    "kubernetes_tolerations": {
                        "description": "JSON list of tolerations added to the nvidia.com/gpu one on every job pod. "
                        "Empty: none.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]',
                        "default": "",
                    },
                    "kubernetes_secrets": {
                        "description": "JSON mapping of environment variables to Kubernetes Secrets as "
                        "'secret-name/key' (secretKeyRef: the value never passes through Airflow). Empty: none.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '{"HF_TOKEN": "hf-token/token"}',
                        "default": "",
                    },
                    "kubernetes_startup_timeout": {
                        "description": "Seconds from a pod's creation until it must run: a pod still waiting for a "
                        "node is then given up as a capacity timeout (the capacity policy moves on), one whose "
                        "container does not start fails. Sized for a GPU node's launch and a large image pull.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "900",
                        "default": "900",
                    },
                    "kubernetes_fractional_gpu_resource": {
                        "description": "Extended resource a job with gpus below 1 asks one of: a MIG profile "
                        "(nvidia.com/mig-1g.10gb) or the device plugin's shared resource (nvidia.com/gpu.shared). "
                        "Empty: fractional GPUs refused.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "nvidia.com/mig-1g.10gb",
                        "default": "",
                    },
                    "kubernetes_dashboard_url": {
                        "description": "Link shown as the task's console link, with {namespace}, {name} and {kind} "
                        "filled in. Empty: none.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "https://grafana.example.com/d/pods?var-namespace={namespace}&var-pod={name}",
                        "default": "",
                    },
                    "kubernetes_ttl_after_finished": {
                        "description": "Seconds an ended multi-node Job and its pods are kept "
                        "(ttlSecondsAfterFinished).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "3600",
                        "default": "3600",
                    },
                    "sagemaker_role_arn": {
                        "description": "IAM role SageMaker assumes for each training job (RoleArn): pull the image,"
                        " read"
                        " and write the output and checkpoint S3 locations, write logs. Required by the "
                        "sagemaker backend.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "arn:aws:iam::123456789012:role/gpu-sagemaker-job",
                        "default": "",
                    },
                    "sagemaker_output_path": {
                        "description": "S3 prefix where SageMaker writes each training job's model artifacts "
                        "(OutputDataConfig.S3OutputPath). Required by the sagemaker backend.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "s3://ml-artifacts/models",
                        "default": "",
                    },
                    "sagemaker_aws_conn_id": {
                        "description": "Airflow AWS connection the sagemaker backend uses (credentials, region, "
                        "endpoint).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "aws_default",
                        "default": "aws_default",
                    },
                    "sagemaker_region": {
                        "description": "AWS region of the training jobs. Empty: the connection's region.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "us-east-1",
                        "default": "",
                    },
                    "sagemaker_subnets": {
                        "description": "VPC subnets of the training jobs (VpcConfig), comma-separated or a JSON list. "
                        "Empty: no VPC. Needs sagemaker_security_group_ids too.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "subnet-0abc,subnet-0def",
                        "default": "",
                    },
                    "sagemaker_security_group_ids": {
                        "description": "Security groups of the training jobs (VpcConfig), comma-separated or a JSON "
                        "list.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "sg-0abc",
                        "default": "",
                    },
                    "sagemaker_volume_size_gb": {
                        "description": "Storage volume per training instance, in GB (ResourceConfig.VolumeSizeInGB).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "200",
                        "default": "100",
                    },
                    "sagemaker_full_describe_every": {
                        "description": "Poll ticks after which a batched SageMaker status poll describes every "
                        "running managed-spot job in full (DescribeTrainingJob), whether or not ListTrainingJobs "
                        "lists it as modified: AWS does not document that LastModifiedTime moves when only "
                        "SecondaryStatus changes (a spot Interrupted), so an interruption is seen within this "
                        "many ticks at worst. Lower: interruptions seen sooner, more calls.",
                        "version_added": "0.4.0",
                        "type": "integer",
                        "example": "5",
                        "default": "10",
                    },
                    "sagemaker_instance_type": {
                        "description": "Training instance of jobs that name neither gpu_type nor instance_types. "
                        "Empty: "
                        "the instance table's a10g row for the job's GPUs per node (ml.g5.xlarge for 1 "
                        "GPU).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "ml.g5.2xlarge",
                        "default": "",
                    },
                    "sagemaker_kms_key_id": {
                        "description": "KMS key for the model artifacts and the instances' storage volumes "
                        "(OutputDataConfig.KmsKeyId, ResourceConfig.VolumeKmsKeyId). Empty: AWS-managed "
                        "keys.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
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
                    "quota_file": {
                        "description": "Path of the team quota file (YAML: teams with their GPUs, optional "
                        "max_priority and monthly_budget_usd). `gpu-provider pools sync` creates each team's pool "
                        "gpu_<team> from it; a GpuJobOperator whose team= is not in it, or whose priority= is above "
                        "its team's max_priority, fails when the DAG is parsed; its monthly_budget_usd values are "
                        "team budgets (team_monthly_budget_usd overrides them per team). Empty: no quota file.",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": "/opt/airflow/config/gpu_quotas.yaml",
                        "default": "",
                    },
                    "backfill_priority_penalty": {
                        "description": "How much lower the priority weight of a task is in a backfill run than in "
                        "any other run, under the gpu_provider_priority plugin's weight rules (GpuJobOperator uses "
                        "them): a retraining backfill queues behind this week's production runs. 0: no penalty.",
                        "version_added": "0.4.0",
                        "type": "integer",
                        "example": "10000",
                        "default": "1000",
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
                    "budget_fail_closed": {
                        "description": "What a team budget check does when the team's spend this month cannot be "
                        "read (the Airflow Variable gpu_provider_spend_<YYYY-MM> unreadable or not a JSON object of "
                        "team to USD). False: warn in the task log every time and submit as if nothing was spent. "
                        "True: refuse the submit with an error that says why.",
                        "version_added": "0.4.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "reaper_backends": {
                        "description": "The backends GpuReaperOperator sweeps, as a JSON list of names or "
                        "backend mappings. Empty: every registered backend whose extra is installed, with its "
                        "configured options (each pass logs the backends it skipped and why).",
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
                    "ui_backends": {
                        "description": "The backends the GPU page asks for their active jobs (live state of running "
                        "attempts, Backend.list_owned), as a JSON list of names or backend mappings. Empty: "
                        "reaper_backends, else the local backend only (the API server then needs to see its state "
                        "directory).",
                        "version_added": "0.4.0",
                        "type": "string",
                        "example": '["local", {"name": "batch", "region_name": "us-west-2"}]',
                        "default": "",
                    },
                },
            }
        },
    }
