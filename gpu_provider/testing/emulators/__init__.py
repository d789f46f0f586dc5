"""Local emulators of the cloud services the provider talks to, for tests and ``make demo``.

Part of the ``[testing]`` extra (``pip install 'airflow-provider-gpu[testing]'``): nothing else in
``gpu_provider`` imports this package. It exists so that the product's backends - and the DAGs users
write for them - can be exercised end to end against a real HTTP endpoint on one machine, without an
AWS account or a cluster.

* :mod:`~.aws_batch` - AWS Batch (and the CloudWatch Logs it writes to) on moto in server mode, with every
  job's container command run as a local process (:mod:`~.aws_batch_jobs`); its API side (routing,
  moto's patches) is :mod:`~.aws_batch_api`, its queues and compute environments :mod:`~.aws_batch_setup`.
* :mod:`~.aws_sagemaker` - SageMaker training jobs (progression, managed spot interruptions and
  restarts, checkpoint sync to S3, StopTrainingJob, per-host CloudWatch streams) answered in front of
  moto (:mod:`~.aws_sagemaker_api`), each host run as a local process (:mod:`~.aws_sagemaker_jobs`);
  S3 and CloudWatch Logs are moto's.
* :mod:`~.aws_ec2` - EC2 spot placement scores and spot price history as a test chooses them,
  on any moto server of the process (its own, or the Batch emulator's).
* :mod:`~.aws_common` - what the AWS emulators share: one of each kind per process, the server's start,
  boto3 clients, the fault and request-log knobs, the ``serve`` command; :mod:`~.aws_events` - the
  service events they put on moto's EventBridge.
* :mod:`~.kubernetes` - a fake Kubernetes API server whose nodes stand in for
  Karpenter's (spot and on-demand), pods run as local processes (:mod:`~.kubernetes_pods`); its objects
  and watches' history are :mod:`~.kubernetes_store`, its HTTP side :mod:`~.kubernetes_http`.
* :mod:`~.core` - what every emulator shares: moto's server with a middleware that records requests
  and injects faults (throttling, lost responses), a job process's base environment.
* :mod:`~.serve` - ``gpu-provider emulator KIND``: start one emulator and print the settings to paste.
"""

from gpu_provider.extras import require_extra

require_extra("testing", "gpu_provider.testing.emulators")
