"""Checkpoints a ``CheckpointSensor`` waits for: what counts as published, and the trigger that waits in the triggerer.

A checkpoint is *published* when ``<uri>/LATEST`` names a ``ckpt-<step>`` folder that exists (the
layout of :mod:`gpu_provider.runtime.checkpoint`, where ``LATEST`` is written last). Nothing else
counts: not a ``.tmp-`` folder being written, not a ``ckpt-`` folder that ``LATEST`` does not name yet
(on S3 such a folder may still be uploading), not a ``LATEST`` whose folder is missing. Unlike
:func:`~gpu_provider.runtime.latest_checkpoint`, which a job uses to resume and which falls back to the
highest ``ckpt-`` folder, a sensor never guesses: it fires only on what the writer has finished.

:class:`CheckpointTrigger` reads storage every ``poll_interval`` with the blocking reads (the local
file system, or S3 through the Airflow AWS connection) in a thread, until a published checkpoint
satisfies the wait or the deadline passes. boto3 is imported only for an ``s3://`` URI.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from gpu_provider.runtime.checkpoint import published_checkpoint

#: the events a :class:`CheckpointTrigger` fires (``status`` of the event payload)
SUCCESS, TIMEOUT, ERROR = "success", "timeout", "error"
EVENT_STATUSES = (SUCCESS, TIMEOUT, ERROR)
#: consecutive failed reads of the storage after which the trigger gives up with ``error``: one
#: failed read (a network blip during a wait of hours) is only logged
MAX_READ_ERRORS = 3


def lowest_step(min_step: int, newer_than: int | None) -> int:
    """The lowest step that satisfies a wait: at least ``min_step``, and more than ``newer_than``."""
    return min_step if newer_than is None else max(min_step, newer_than + 1)


def describe_wait(uri: str, min_step: int, newer_than: int | None) -> str:
    """What a wait is for, in words, for logs and messages."""
    parts = []
    if min_step:
        parts.append(f"at step {min_step} or later")
    if newer_than is not None:
        parts.append(f"newer than step {newer_than}")
    return f"a published checkpoint at {uri}" + (f" ({', '.join(parts)})" if parts else "")


class CheckpointTrigger(BaseTrigger):
    """Waits until a published checkpoint at ``uri`` reaches the wanted step, or until ``end_time``.

    Fires one event ``{"status": "success" | "timeout" | "error", "checkpoint": uri | None,
    "step": int | None, "message": str}``: ``success`` with the checkpoint found; ``timeout`` with
    the newest one seen, if any; ``error`` when the storage could not be read
    :data:`MAX_READ_ERRORS` times in a row.

    :param uri: the checkpoint URI (``file://`` or ``s3://``), rendered.
    :param min_step: fire only on a step at least this.
    :param newer_than: fire only on a step more than this (``None``: any).
    :param aws_conn_id: the Airflow AWS connection for ``s3://`` URIs.
    :param poll_interval: seconds between reads.
    :param end_time: Unix time when the wait ends with ``timeout`` (``None``: never).
    """

    def __init__(
        self,
        *,
        uri: str,
        min_step: int = 0,
        newer_than: int | None = None,
        aws_conn_id: str | None = "aws_default",
        poll_interval: float = 60.0,
        end_time: float | None = None,
        **_newer: Any,
    ) -> None:
        # ``_newer``: arguments a newer provider version added; a triggerer one version behind still runs it
        super().__init__()  # type: ignore[no-untyped-call]
        self.uri = uri
        self.min_step = int(min_step)
        self.newer_than = None if newer_than is None else int(newer_than)
        self.aws_conn_id = aws_conn_id
        self.poll_interval = float(poll_interval)
        self.end_time = None if end_time is None else float(end_time)
        self._client: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "uri": self.uri,
                "min_step": self.min_step,
                "newer_than": self.newer_than,
                "aws_conn_id": self.aws_conn_id,
                "poll_interval": self.poll_interval,
                "end_time": self.end_time,
            },
        )

    @staticmethod
    def _event(status: str, found: tuple[str, int] | None, message: str) -> TriggerEvent:
        checkpoint, step = found if found is not None else (None, None)
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {"status": status, "checkpoint": checkpoint, "step": step, "message": message}
        )

    def _read(self) -> tuple[str, int] | None:
        from gpu_provider.backends.aws.calls import s3_client_for

        if self._client is None:  # built once per run (it looks the connection up), in the reading thread
            self._client = s3_client_for(self.uri, self.aws_conn_id)
        return published_checkpoint(self.uri, s3_client=self._client)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        wanted = lowest_step(self.min_step, self.newer_than)
        what = describe_wait(self.uri, self.min_step, self.newer_than)
        self.log.info("Waiting for %s; checking every %gs.", what, self.poll_interval)
        seen: tuple[str, int] | None = None
        errors = 0
        while True:
            try:
                found = await asyncio.to_thread(self._read)
            except Exception as err:
                errors += 1
                message = f"Could not read checkpoints at {self.uri} ({errors} time(s) in a row): {err}"
                if errors >= MAX_READ_ERRORS:
                    yield self._event(ERROR, seen, message)
                    return
                self.log.warning("%s; trying again in %gs.", message, self.poll_interval)
            else:
                errors = 0
                seen = found or seen
                if found is not None and found[1] >= wanted:
                    yield self._event(SUCCESS, found, f"Found checkpoint {found[0]} (step {found[1]}).")
                    return
                if found is None:
                    self.log.info("No published checkpoint at %s yet.", self.uri)
                else:
                    self.log.info(
                        "Newest checkpoint %s is at step %d; waiting for step %d.", found[0], found[1], wanted
                    )
            remaining = None if self.end_time is None else self.end_time - time.time()
            if remaining is not None and remaining <= 0:
                newest = f"the newest seen was {seen[0]} (step {seen[1]})" if seen else "none was seen"
                yield self._event(TIMEOUT, seen, f"Timed out waiting for {what}; {newest}.")
                return
            await asyncio.sleep(self.poll_interval if remaining is None else min(self.poll_interval, remaining))
