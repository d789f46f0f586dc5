"""The event source of Batch or SageMaker on an AWS emulator: the SQS queue and the EventBridge rule that
``gpu-provider events render`` describes, created on the emulator's moto (for tests and the benchmarks)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any


def wire_event_queue(
    client: Callable[[str], Any], kind: str, name: str, *, job_queues: Sequence[str] = ()
) -> tuple[str, str]:
    """Create the queue ``name`` and the rule of ``kind``'s job state changes (``batch`` or ``sagemaker``)
    delivering to it, through ``client(service)`` (an emulator's client factory); returns (queue URL, rule
    name). The emulators put each job state change on moto's bus, and the rule delivers it to the queue.

    :param job_queues: Batch: the job queues the rule is scoped to (default none: the provider's jobs in any
        queue, since a test's backend may name queues the configuration does not)"""
    from gpu_provider.backends.aws.events import render

    sqs, events = client("sqs"), client("events")
    url = str(sqs.create_queue(QueueName=name)["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    scoped = list(job_queues) if kind == "batch" else None
    plan = render(kind, queue_arn=arn, rule_name=f"{name}-rule", job_queues=scoped)
    attributes = {**plan["queue"]["Attributes"], "Policy": json.dumps(plan["queue"]["Policy"])}
    sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    rule = plan["rule"]
    events.put_rule(Name=rule["Name"], EventPattern=json.dumps(rule["EventPattern"]), State=rule["State"])
    events.put_targets(Rule=rule["Name"], Targets=rule["Targets"])
    return url, str(rule["Name"])
