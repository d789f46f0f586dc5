"""Local emulators of the cloud services the provider talks to, for tests and ``make demo``.

Nothing in ``gpu_provider`` imports this package: it exists only so that the product's backends can be
exercised end to end against a real HTTP endpoint on one machine, without an AWS account.

* :mod:`emulators.aws_batch` - AWS Batch (and the CloudWatch Logs it writes to) on moto in server mode,
  with every job's container command run as a local process (:mod:`emulators.aws_batch_jobs`).
* :mod:`emulators.aws_sagemaker` - SageMaker training jobs (progression, managed spot interruptions and
  restarts, checkpoint sync to S3, StopTrainingJob, per-host CloudWatch streams) answered in front of
  moto, each host run as a local process; S3 and CloudWatch Logs are moto's.
* :mod:`emulators.aws_ec2` - EC2 spot placement scores and spot price history as a test chooses them,
  on any moto server of the process (its own, or the Batch emulator's).
* :mod:`emulators.core` - what every emulator shares: moto's server with a middleware that records
  requests and injects faults (throttling, lost responses).
"""
