"""AWS Batch and SageMaker events for the triggerer: EventBridge state-change events read from SQS.

Opt in with ``[gpu_provider] batch_events_queue_url`` and/or ``sagemaker_events_queue_url`` (one
queue may serve both): an EventBridge rule sends "Batch Job State Change" and "SageMaker Training
Job State Change" events to the queue, and one thread per queue in the triggerer long-polls it
(``ReceiveMessage``, ``WaitTimeSeconds`` up to 20) and tells the shared pollers which jobs changed;
they poll those at once. ``gpu-provider events render`` prints the rule, queue policy and IAM
statements (:func:`render`).

Which messages are deleted: those naming a job a poller of this process watches (consumed here).
Others are left alone: a job of another triggerer (it receives them once their visibility timeout
ends), a job whose trigger has not started yet (it comes back), anything not an event of ours.
They expire with the queue's retention period, so give the queue a short one (``render`` asks for
300 s). Events are hints: a lost, late or unreadable one costs latency only, the backstop tick
(``[gpu_provider] event_backstop_interval``) still sees every end.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_provider import names
from gpu_provider.backends.aws.calls import Clients
from gpu_provider.backends.base import EventSink, EventSource, provider_config

log = logging.getLogger(__name__)

BATCH_DETAIL_TYPE = "Batch Job State Change"
SAGEMAKER_DETAIL_TYPE = "SageMaker Training Job State Change"
#: seconds a received message stays invisible to other readers (then another triggerer may take it)
VISIBILITY_TIMEOUT_S = 30
#: the retention ``render`` asks for: a message nobody consumes is gone after this
RETENTION_S = 300
#: the longest ReceiveMessage wait SQS allows
MAX_WAIT_S = 20


def job_key(event: Mapping[str, Any]) -> str | None:
    """The job an EventBridge event is about (Batch ``jobId``, SageMaker ``TrainingJobName``), if ours to read."""
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        return None
    kind = event.get("detail-type")
    if kind == BATCH_DETAIL_TYPE and event.get("source") == "aws.batch":
        value = detail.get("jobId")
    elif kind == SAGEMAKER_DETAIL_TYPE and event.get("source") == "aws.sagemaker":
        value = detail.get("TrainingJobName")
    else:
        return None
    return str(value) if value else None


class QueueEvents(EventSource):
    """Long-polls one SQS queue of EventBridge events (see the module docstring).

    :param queue_url: the queue's URL
    :param clients: the backend's AWS clients (its Airflow connection and region)
    :param wait_seconds: ``WaitTimeSeconds`` of each receive (1 to 20)
    """

    def __init__(self, queue_url: str, clients: Clients, *, wait_seconds: int = MAX_WAIT_S) -> None:
        self.queue_url = queue_url
        self.clients = clients
        self.wait_seconds = wait_seconds
        self.key = f"sqs:{queue_url}"
        #: messages deleted (consumed) and left for others, since the source started
        self.consumed = 0
        self.left = 0

    def run(self, sink: EventSink, stop: threading.Event) -> None:
        sqs = self.clients.get("sqs")
        # one read of the queue's attributes first: a queue that is missing or not readable fails here, loudly
        sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])
        sink.up(True)
        sink.changed(None)  # anything may have changed before the first read
        while not stop.is_set():
            answer = sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=self.wait_seconds,
                VisibilityTimeout=VISIBILITY_TIMEOUT_S,
            )
            keys: set[str] = set()
            done: list[dict[str, str]] = []
            for message in answer.get("Messages") or []:
                try:
                    key = job_key(json.loads(message.get("Body") or ""))
                except ValueError:
                    key = None
                if key is not None and sink.watches(key):
                    keys.add(key)
                    done.append({"Id": str(len(done)), "ReceiptHandle": message["ReceiptHandle"]})
                else:
                    self.left += 1
            if keys:
                sink.changed(keys)
            if done:
                sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=done)
                self.consumed += len(done)


def queue_events(setting: str, clients: Clients) -> QueueEvents | None:
    """The queue of ``[gpu_provider] <setting>`` (``batch_events_queue_url``, ``sagemaker_events_queue_url``),
    ``None`` when unset (events off: polling only)."""
    url = provider_config(setting)
    if not url:
        return None
    if not url.startswith(("https://", "http://")):
        raise ValueError(f"[gpu_provider] {setting}={url!r}: must be an SQS queue URL (https://sqs.REGION...)")
    raw_wait = provider_config("aws_events_wait_seconds") or str(MAX_WAIT_S)
    if not raw_wait.isdigit() or not 1 <= int(raw_wait) <= MAX_WAIT_S:
        raise ValueError(f"[gpu_provider] aws_events_wait_seconds={raw_wait!r}: must be a whole number from 1 to 20")
    return QueueEvents(url, clients, wait_seconds=int(raw_wait))


def configured_job_queues() -> list[str]:
    """The Batch job queues of the ``[gpu_provider]`` config (``batch_spot_queue``, ``batch_on_demand_queue``,
    ``batch_queues_by_instance_type``), each once, in that order; ``[]`` when none is set."""
    from gpu_provider.backends.batch.options import queues_by_instance_type

    found = [provider_config("batch_spot_queue"), provider_config("batch_on_demand_queue")]
    for per_capacity in queues_by_instance_type(None).values():
        found += per_capacity.values()
    return list(dict.fromkeys(q for q in found if q))


def _queue_arn(queue: str, region: str, account: str) -> str:
    """A Batch job queue as its ARN (what the event's ``jobQueue`` holds): a name becomes the ARN of that queue in
    the rule's own account and region (the only ones whose events the rule sees); an ARN is kept."""
    if queue.startswith("arn:"):
        parts = queue.split(":", 5)
        if len(parts) != 6 or parts[2] != "batch" or not parts[5].startswith("job-queue/"):
            raise ValueError(
                f"job queue {queue!r}: an ARN must be a Batch job queue's, arn:aws:batch:REGION:ACCOUNT:job-queue/NAME"
            )
        return queue
    if not queue or "/" in queue or ":" in queue:
        raise ValueError(f"job queue {queue!r}: must be a Batch job queue name or ARN")
    return f"arn:aws:batch:{region}:{account}:job-queue/{queue}"


def render(
    backend: str,
    *,
    queue_arn: str,
    rule_name: str,
    job_queues: Sequence[str] | None = None,
    name_prefix: str = names.JOB_NAME_PREFIX,
) -> dict[str, Any]:
    """What to create for ``backend``'s events (``batch`` or ``sagemaker``), as JSON-ready data: the
    EventBridge rule's pattern and target, the SQS queue's attributes and policy, the IAM statements
    the triggerer's role needs, and in words what the rule matches. No AWS call.

    The rule matches the provider's jobs only: their names start with ``name_prefix`` (every attempt's name is
    ``gp-<dag>-<task>-<run hash>-t<try>-a<attempt>``, :class:`~gpu_provider.backends.contract.identity.JobIdentity`),
    and on Batch they are in one of ``job_queues`` (names or ARNs; default: the configured queues,
    :func:`configured_job_queues`; none known: any queue). Other jobs of the account (another team's) never
    reach the queue.
    """
    parts = queue_arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not all(parts[3:]):
        raise ValueError(f"queue_arn={queue_arn!r}: must be an SQS queue ARN, arn:aws:sqs:REGION:ACCOUNT:NAME")
    region, account, name = parts[3], parts[4], parts[5]
    if not isinstance(name_prefix, str) or not name_prefix:
        raise ValueError(f"name_prefix={name_prefix!r}: must be the provider's job-name prefix, e.g. 'gp-'")
    prefix = [{"prefix": name_prefix}]
    if backend == "batch":
        given = configured_job_queues() if job_queues is None else job_queues
        queues = list(dict.fromkeys(_queue_arn(q.strip(), region, account) for q in given))
        detail: dict[str, Any] = {"status": ["RUNNING", "SUCCEEDED", "FAILED"], "jobName": prefix}
        if queues:
            detail["jobQueue"] = queues
        pattern: dict[str, Any] = {"source": ["aws.batch"], "detail-type": [BATCH_DETAIL_TYPE], "detail": detail}
        where = f"in the job queue(s) {', '.join(queues)}" if queues else "in any job queue (none given or configured)"
        matches = (
            f"AWS Batch jobs of account {account} in {region} whose name starts with {name_prefix!r}, {where}, "
            "when they become RUNNING, SUCCEEDED or FAILED"
        )
        setting = "batch_events_queue_url"
    elif backend == "sagemaker":
        if job_queues:
            raise ValueError("job queues are AWS Batch's: give --job-queue with --backend batch only")
        pattern = {
            "source": ["aws.sagemaker"],
            "detail-type": [SAGEMAKER_DETAIL_TYPE],
            "detail": {"TrainingJobName": prefix},
        }
        matches = (
            f"SageMaker training jobs of account {account} in {region} whose name starts with {name_prefix!r}, "
            "at every status change"
        )
        setting = "sagemaker_events_queue_url"
    else:
        raise ValueError(f"backend={backend!r}: events come from EventBridge for batch and sagemaker only")
    rule_arn = f"arn:aws:events:{region}:{account}:rule/{rule_name}"
    return {
        "rule": {
            "Name": rule_name,
            "EventPattern": pattern,
            "State": "ENABLED",
            "Targets": [{"Id": "gpu-provider-queue", "Arn": queue_arn}],
        },
        "matches": matches,
        "queue": {
            "QueueName": name,
            "Attributes": {"MessageRetentionPeriod": str(RETENTION_S), "ReceiveMessageWaitTimeSeconds": "20"},
            "Policy": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "EventBridgeSendsJobStateChanges",
                        "Effect": "Allow",
                        "Principal": {"Service": "events.amazonaws.com"},
                        "Action": "sqs:SendMessage",
                        "Resource": queue_arn,
                        "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
                    }
                ],
            },
        },
        "triggerer_iam_statements": [
            {
                "Sid": "GpuProviderReadsJobEvents",
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"],
                "Resource": queue_arn,
            }
        ],
        "airflow_config": {
            "section": "gpu_provider",
            "key": setting,
            "value": f"https://sqs.{region}.amazonaws.com/{account}/{name}",
        },
    }
