"""``CheckpointSensor``: wait until a job has written a checkpoint at or beyond a step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from gpu_provider.job import is_templated, validate_checkpoint_uri

if TYPE_CHECKING:
    from airflow.sdk import Context


class CheckpointSensor(BaseSensorOperator):
    """Wait for a complete checkpoint (the ``LATEST`` marker of DESIGN's layout) at ``uri``.

    Useful to start an evaluation of intermediate checkpoints while training still runs, or to
    gate a downstream stage on a checkpoint that another DAG produces.

    :param uri: the checkpoint URI a ``GpuJobOperator`` uses (``file://`` or ``s3://``; templated).
    :param min_step: succeed only once the newest checkpoint's step is at least this (default 0: any).
    :param aws_conn_id: Airflow AWS connection for ``s3://`` URIs (default ``aws_default``; a missing
        connection falls back to boto3's default credentials).
    :return: (XCom) ``{"checkpoint": "<uri>/ckpt-...", "step": N}``
    """

    template_fields: Sequence[str] = ("uri",)

    def __init__(self, *, uri: str, min_step: int = 0, aws_conn_id: str | None = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not is_templated(uri):
            validate_checkpoint_uri(uri, "uri")
        if not isinstance(min_step, int) or isinstance(min_step, bool) or min_step < 0:
            raise ValueError(f"min_step={min_step!r} must be an integer >= 0")
        self.uri = uri
        self.min_step = min_step
        self.aws_conn_id = aws_conn_id
        self._found: dict[str, Any] | None = None

    def poke(self, context: Context) -> bool:
        from gpu_provider._aws import s3_client_for
        from gpu_provider.runtime.checkpoint import checkpoint_step, latest_checkpoint

        uri = validate_checkpoint_uri(self.uri, "uri")
        latest = latest_checkpoint(uri, s3_client=s3_client_for(uri, self.aws_conn_id))
        if latest is None:
            self.log.info("No complete checkpoint at %s yet.", uri)
            return False
        step = checkpoint_step(latest.rsplit("/", 1)[-1])
        if step is None or step < self.min_step:
            self.log.info("Newest checkpoint %s is at step %s; waiting for step %d.", latest, step, self.min_step)
            return False
        self._found = {"checkpoint": latest, "step": step}
        return True

    def execute(self, context: Context) -> Any:
        super().execute(context)
        return self._found
