"""``gpu-provider events render``: what to create in AWS for the Batch and SageMaker event sources (no AWS call)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
from gpu_provider.cli import main
from gpu_provider.job import GpuResources
from gpu_provider.testing.worlds import BatchWorld

ARN = "arn:aws:sqs:eu-west-1:111122223333:gpu-events"


@pytest.mark.parametrize(
    ("backend", "source", "detail_type", "setting"),
    [
        ("batch", "aws.batch", "Batch Job State Change", "batch_events_queue_url"),
        ("sagemaker", "aws.sagemaker", "SageMaker Training Job State Change", "sagemaker_events_queue_url"),
    ],
)
def test_render_prints_the_rule_the_queue_policy_and_the_iam_statements(
    backend: str, source: str, detail_type: str, setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", "render", "--backend", backend, "--queue-arn", ARN, "--rule-name", "jobs"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["rule"]["EventPattern"]["source"] == [source]
    assert plan["rule"]["EventPattern"]["detail-type"] == [detail_type]
    name_field = "jobName" if backend == "batch" else "TrainingJobName"
    assert plan["rule"]["EventPattern"]["detail"][name_field] == [{"prefix": "gp-"}], "the provider's jobs only"
    assert plan["rule"]["Targets"] == [{"Id": "gpu-provider-queue", "Arn": ARN}]
    (send,) = plan["queue"]["Policy"]["Statement"]
    assert send["Principal"] == {"Service": "events.amazonaws.com"} and send["Action"] == "sqs:SendMessage"
    assert send["Condition"] == {"ArnEquals": {"aws:SourceArn": "arn:aws:events:eu-west-1:111122223333:rule/jobs"}}
    (read,) = plan["triggerer_iam_statements"]
    assert sorted(read["Action"]) == ["sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:ReceiveMessage"]
    assert read["Resource"] == ARN
    assert plan["airflow_config"] == {
        "section": "gpu_provider",
        "key": setting,
        "value": "https://sqs.eu-west-1.amazonaws.com/111122223333/gpu-events",
    }


def test_render_refuses_what_is_not_a_queue_arn_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "render", "--backend", "batch", "--queue-arn", "gpu-events"]) == 1
    err = capsys.readouterr().err
    assert "queue_arn='gpu-events': must be an SQS queue ARN, arn:aws:sqs:REGION:ACCOUNT:NAME" in err
    with pytest.raises(SystemExit):
        main(["events", "render", "--backend", "kubernetes", "--queue-arn", ARN])
    assert "invalid choice: 'kubernetes'" in capsys.readouterr().err


# --- the rule matches the provider's jobs only: moto's EventBridge and SQS, as the emulators deliver ----------


def _rendered(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["events", "render", *args]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _wire(client: Callable[[str], Any], plan: dict[str, Any], url: str) -> None:
    rule = plan["rule"]
    client("events").put_rule(Name=rule["Name"], EventPattern=json.dumps(rule["EventPattern"]), State="ENABLED")
    client("events").put_targets(Rule=rule["Name"], Targets=rule["Targets"])
    attributes = {**plan["queue"]["Attributes"], "Policy": json.dumps(plan["queue"]["Policy"])}
    client("sqs").set_queue_attributes(QueueUrl=url, Attributes=attributes)


def _received(client: Callable[[str], Any], url: str, until: Callable[[list[dict[str, Any]]], bool]) -> list[Any]:
    """The events the queue got, read until ``until(events)`` holds (or 60 s: then what came)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not until(got) and time.monotonic() < deadline:
        answer = client("sqs").receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in answer.get("Messages") or []:
            got.append(json.loads(message["Body"]))
            client("sqs").delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return got


def _queue(client: Callable[[str], Any], name: str) -> tuple[str, str]:
    url = str(client("sqs").create_queue(QueueName=name)["QueueUrl"])
    arn = client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, str(arn)


def test_the_batch_rule_matches_our_jobs_in_our_queues_and_not_another_teams(
    batch: BatchWorld, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_provider.backends.batch import BatchBackend
    from gpu_provider.testing.emulators.aws_events import publish

    client = batch.emulator.client
    url, arn = _queue(client, f"scoped-batch-{uuid.uuid4().hex[:6]}")
    region, account = arn.split(":")[3:5]
    # the queues the provider is configured with: the rule names them (as ARNs), and no other
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE", batch.setup.spot_queue)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE", batch.setup.on_demand_queue)
    plan = _rendered(capsys, "--backend", "batch", "--queue-arn", arn, "--rule-name", f"scoped-{uuid.uuid4().hex[:6]}")
    detail = plan["rule"]["EventPattern"]["detail"]
    queue_arns = {
        q["jobQueueName"]: q["jobQueueArn"]
        for q in client("batch").describe_job_queues(jobQueues=[batch.setup.spot_queue, batch.setup.on_demand_queue])[
            "jobQueues"
        ]
    }
    assert detail["jobName"] == [{"prefix": "gp-"}]
    assert sorted(detail["jobQueue"]) == sorted(queue_arns.values())
    assert "whose name starts with 'gp-'" in plan["matches"] and batch.setup.spot_queue in plan["matches"]
    _wire(client, plan, url)

    on_demand = queue_arns[batch.setup.on_demand_queue]
    others_queue = f"arn:aws:batch:{region}:{account}:job-queue/vision-team-gpu"
    for name, queue in (("vision-train-nightly", on_demand), ("gp-theirs-in-their-queue", others_queue)):
        detail = {"jobName": name, "jobId": name, "jobQueue": queue, "status": "RUNNING"}
        publish(
            account=account,
            region=region,
            source="aws.batch",
            detail_type="Batch Job State Change",
            detail=detail,
            resource=f"arn:aws:batch:{region}:{account}:job/{name}",
        )
    # and one job of ours, run by the emulator on our on-demand queue: its own state changes
    task = TaskKey("scoped_events", "train", "manual__1")
    identity = JobIdentity(task, try_number=1, attempt=1, capacity="on-demand")
    request = JobRequest(identity, (sys.executable, "-c", "pass"), {}, GpuResources(), "on-demand", image="x")
    handle = BatchBackend(**batch.queues).submit(request)

    def ended(events: list[dict[str, Any]]) -> bool:
        return any(e["detail"]["jobId"] == handle.job_id and e["detail"]["status"] == "SUCCEEDED" for e in events)

    events = _received(client, url, ended)
    assert ended(events), events
    assert {e["detail"]["jobName"] for e in events} == {identity.name}, "only our job's events reached the queue"
    assert {e["detail"]["status"] for e in events} <= {"RUNNING", "SUCCEEDED", "FAILED"}


def test_the_sagemaker_rule_matches_our_training_jobs_and_not_another_teams(
    batch: BatchWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_provider.testing.emulators.aws_events import publish

    client = batch.emulator.client  # its moto holds EventBridge and SQS; SageMaker's events are put on the same bus
    url, arn = _queue(client, f"scoped-sm-{uuid.uuid4().hex[:6]}")
    region, account = arn.split(":")[3:5]
    plan = _rendered(capsys, "--backend", "sagemaker", "--queue-arn", arn, "--rule-name", f"sm-{uuid.uuid4().hex[:6]}")
    assert plan["rule"]["EventPattern"]["detail"] == {"TrainingJobName": [{"prefix": "gp-"}]}
    _wire(client, plan, url)
    ours = "gp-scoped-events-train-0123456789-t1-a1"
    for name in ("nlp-team-finetune-7", ours):
        publish(
            account=account,
            region=region,
            source="aws.sagemaker",
            detail_type="SageMaker Training Job State Change",
            detail={"TrainingJobName": name, "TrainingJobStatus": "InProgress", "Tags": {}},
            resource=f"arn:aws:sagemaker:{region}:{account}:training-job/{name}",
        )
    events = _received(client, url, lambda got: any(e["detail"]["TrainingJobName"] == ours for e in got))
    # the foreign event was put first: had the rule matched it, it would be in the queue by now
    assert [e["detail"]["TrainingJobName"] for e in events] == [ours]


def test_render_takes_job_queues_by_name_or_arn_and_refuses_other_arns(capsys: pytest.CaptureFixture[str]) -> None:
    queue = "arn:aws:batch:eu-west-1:111122223333:job-queue/gpu-od"
    plan = _rendered(capsys, "--backend", "batch", "--queue-arn", ARN, "--job-queue", "gpu-spot", "--job-queue", queue)
    assert plan["rule"]["EventPattern"]["detail"]["jobQueue"] == [
        "arn:aws:batch:eu-west-1:111122223333:job-queue/gpu-spot",
        queue,
    ]
    assert main(["events", "render", "--backend", "batch", "--queue-arn", ARN, "--job-queue", ARN]) == 1
    assert "an ARN must be a Batch job queue's, arn:aws:batch:REGION:ACCOUNT:job-queue/NAME" in capsys.readouterr().err
    assert main(["events", "render", "--backend", "sagemaker", "--queue-arn", ARN, "--job-queue", "gpu-spot"]) == 1
    assert "give --job-queue with --backend batch only" in capsys.readouterr().err
