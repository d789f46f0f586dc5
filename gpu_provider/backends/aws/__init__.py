"""What the AWS backends (Batch, SageMaker) share: clients through the amazon provider's hook with the
throttling backoff (:mod:`~gpu_provider.backends.aws.calls`), and CloudWatch Logs streams read from a
cursor in bounded chunks (:mod:`~gpu_provider.backends.aws.logs`). Nothing here imports boto3 until
a client is needed.
"""
