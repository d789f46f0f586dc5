"""Clients for the worker side of S3 checkpoints, through the Airflow AWS connection."""

from __future__ import annotations

from typing import Any

from gpu_provider.extras import require_extra

DEFAULT_AWS_CONN_ID = "aws_default"


def s3_client_for(uri: str, aws_conn_id: str | None = DEFAULT_AWS_CONN_ID) -> Any:
    """An S3 client from the Airflow connection for an ``s3://`` URI, ``None`` for other schemes.

    A connection id that does not exist falls back to boto3's default credentials (the amazon
    provider's behaviour), so a worker with an instance role needs no connection.
    """
    if not uri.startswith("s3://"):
        return None
    require_extra("aws", "an s3:// checkpoint or output location")
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    return AwsBaseHook(aws_conn_id=aws_conn_id or DEFAULT_AWS_CONN_ID, client_type="s3").get_conn()


def aws_client(service: str, *, aws_conn_id: str | None = DEFAULT_AWS_CONN_ID, region_name: str | None = None) -> Any:
    """A boto3 client of ``service`` from the Airflow AWS connection (the amazon provider's ``AwsBaseHook``:
    credentials, endpoint and ``config_kwargs`` from the connection), in ``region_name`` (``None``: the
    connection's). boto3 is imported here, when the client is needed, never when a DAG file is parsed."""
    require_extra("aws", f"the AWS {service} client")
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=aws_conn_id or DEFAULT_AWS_CONN_ID, client_type=service, region_name=region_name)
    return hook.get_conn()
