"""SageMaker's training job calls (create, describe, list, tags, stop), each retried on throttling.

The clients, the backoff and what counts as throttling are shared with the Batch backend
(:mod:`gpu_provider.backends.aws.calls`); this module knows SageMaker's calls and answers only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpu_provider.backends.aws.calls import POLL_ATTEMPTS, Clients, call, error_code, send_unsure
from gpu_provider.backends.base import JobIdentity
from gpu_provider.backends.sagemaker import mapping

if TYPE_CHECKING:
    from botocore.client import BaseClient

SERVICE = "Amazon SageMaker"
#: most results of one ListTrainingJobs page
LIST_PAGE = 100


def not_found(err: BaseException) -> bool:
    """DescribeTrainingJob's answer for a job SageMaker does not know (ValidationException, 'not found')."""
    code = error_code(err)
    if code == "ResourceNotFound":
        return True
    message = str(getattr(err, "response", {}).get("Error", {}).get("Message", "")).lower()
    return code == "ValidationException" and "not found" in message


class TrainingJobs:
    """The training job calls of one backend (its connection and region); boto3 is imported on first use.

    :param clients: the backend's clients (``sagemaker``, and ``logs`` for the log readers)
    """

    def __init__(self, clients: Clients) -> None:
        self.clients = clients

    def client(self, service: str = "sagemaker") -> BaseClient:
        return self.clients.get(service)

    def create(self, identity: JobIdentity, body: dict[str, Any]) -> tuple[str | None, bool]:
        """CreateTrainingJob, sent again after throttling or a lost answer: the job's ARN, or ``None`` when
        the name is in use (:func:`~gpu_provider.backends.aws.calls.send_unsure`), and whether it was in use
        before this call (the first send was refused: another execution of the task created it; after a
        lost answer, an earlier send of this call may have)."""
        client = self.clients.get("sagemaker", automatic_retries=False)
        sends = 0

        def send() -> tuple[str | None, bool]:
            nonlocal sends
            sends += 1
            try:
                return str(client.create_training_job(**body)["TrainingJobArn"]), False
            except Exception as err:
                if error_code(err) == "ResourceInUse":
                    return None, sends == 1  # this name exists: created before, or by an earlier send
                raise

        return send_unsure(f"CreateTrainingJob for {identity.name}", send, service=SERVICE)

    def describe(self, name: str, *, attempts: int = POLL_ATTEMPTS) -> dict[str, Any] | None:
        """DescribeTrainingJob; ``None`` for a job SageMaker does not know."""
        client = self.client()
        try:
            return dict(
                call(
                    "DescribeTrainingJob",
                    lambda: client.describe_training_job(TrainingJobName=name),
                    attempts=attempts,
                    service=SERVICE,
                )
            )
        except Exception as err:
            if not_found(err):
                return None
            raise

    def list_tags(self, arn: str) -> dict[str, str]:
        """The job's tags, read now (every ListTags page)."""
        client = self.client()
        tags: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"ResourceArn": arn, "MaxResults": 100}
            if token:
                kwargs["NextToken"] = token
            page = call("ListTags", lambda kwargs=kwargs: client.list_tags(**kwargs), service=SERVICE)  # type: ignore[misc]
            tags.extend(page.get("Tags") or [])
            token = page.get("NextToken")
            if not token:
                return mapping.tag_map(tags)

    def list_jobs(self, *, name_contains: str, **filters: Any) -> list[dict[str, Any]]:
        """ListTrainingJobs summaries (every page) of jobs whose name contains ``name_contains``."""
        client = self.client()
        summaries: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"NameContains": name_contains, "MaxResults": LIST_PAGE, **filters}
            if token:
                kwargs["NextToken"] = token
            page = call(
                "ListTrainingJobs",
                lambda kwargs=kwargs: client.list_training_jobs(**kwargs),  # type: ignore[misc]
                attempts=POLL_ATTEMPTS,
                service=SERVICE,
            )
            summaries.extend(page.get("TrainingJobSummaries") or [])
            token = page.get("NextToken")
            if not token:
                return summaries

    def add_tags(self, arn: str, tags: Mapping[str, str]) -> None:
        """AddTags on the job (a tag of the same key is replaced)."""
        client = self.client()
        call(
            "AddTags",
            lambda: client.add_tags(ResourceArn=arn, Tags=[{"Key": k, "Value": v} for k, v in tags.items()]),
            service=SERVICE,
        )

    def stop(self, name: str) -> None:
        """StopTrainingJob (SageMaker refuses, with ValidationException, a job that is not InProgress)."""
        client = self.client()
        call("StopTrainingJob", lambda: client.stop_training_job(TrainingJobName=name), service=SERVICE)
