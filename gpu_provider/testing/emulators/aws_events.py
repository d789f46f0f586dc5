"""Service events of the AWS emulators: what AWS Batch and SageMaker send to EventBridge.

Each job state change of the Batch and SageMaker emulators is put on moto's default event bus (in this
process, through moto's EventBridge backend, as the service itself would send it), so moto's own rules
deliver it to their targets: an SQS queue whose rule matches gets the event JSON as its message body,
as on AWS. With no rule, an event goes nowhere. Tests lose an event by removing the rule's target.
"""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger(__name__)


def publish(*, account: str, region: str, source: str, detail_type: str, detail: dict[str, Any], resource: str) -> None:
    """Put one service event on the default bus of ``account``/``region``; a failure is logged, never raised
    (a service's events are best effort)."""
    try:
        from moto.events.models import events_backends

        answer = events_backends[account][region].put_events(
            [{"Source": source, "DetailType": detail_type, "Detail": json.dumps(detail), "Resources": [resource]}]
        )
        if any("ErrorCode" in entry for entry in answer):
            logger.warning("event %s for %s not put: %s", detail_type, resource, answer)
    except Exception:
        logger.exception("event %s for %s not put", detail_type, resource)
