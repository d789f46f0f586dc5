"""``gpu-provider events render``: what to create in AWS for the Batch and SageMaker event sources (no AWS call)."""

from __future__ import annotations

import json

import pytest

from gpu_provider.cli import main

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
