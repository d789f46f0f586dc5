"""What the AWS backends (Batch, SageMaker) share, and the one home of AWS clients in this package:

* :mod:`~gpu_provider.backends.aws.calls`: clients through the amazon provider's hook, the throttling
  backoff, a non-idempotent create sent once per try (``send_unsure``), and the one-off clients of the
  code outside the backends (``aws_client``, ``s3_client_for``: sensors, triggers, spend, the operator);
* :mod:`~gpu_provider.backends.aws.status`: what a job the service does not return means;
* :mod:`~gpu_provider.backends.aws.logs`: CloudWatch Logs streams read from a cursor in bounded chunks,
  or their last lines;
* :mod:`~gpu_provider.backends.aws.events`: EventBridge state-change events read from SQS.

Nothing here imports boto3 until a client is needed.
"""
