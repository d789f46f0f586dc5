"""The Batch backend's calls to AWS Batch (describe, list, submit, terminate, tag, queues and job definitions),
each through the throttling backoff.

The clients, the backoff and what counts as throttling are shared with the SageMaker backend
(:mod:`gpu_provider.backends.aws.calls`); this module knows Batch's calls and answers only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpu_provider.backends.aws.calls import PATIENT_ATTEMPTS, POLL_ATTEMPTS, Clients, call, send_unsure
from gpu_provider.backends.batch.mapping import CANCEL_PREFIX

if TYPE_CHECKING:
    from botocore.client import BaseClient

SERVICE = "AWS Batch"
#: most job ids per DescribeJobs call (a Batch limit)
DESCRIBE_BATCH = 100


class BatchJobs:
    """The Batch API as one backend object calls it, through its clients (:class:`~.aws.calls.Clients`).

    A client is asked for at each call, never kept here: ``Clients`` builds it on first use and may hand
    a signal handler one of its own (see there).
    """

    def __init__(self, clients: Clients) -> None:
        self._clients = clients

    def client(self) -> BaseClient:
        return self._clients.get("batch")

    def describe(self, job_ids: Sequence[str], *, attempts: int = POLL_ATTEMPTS) -> list[dict[str, Any]]:
        """DescribeJobs of ``job_ids`` (each once), :data:`DESCRIBE_BATCH` per call; jobs Batch does not know
        are not in the answer."""
        client = self.client()
        jobs: list[dict[str, Any]] = []
        unique = list(dict.fromkeys(job_ids))
        for start in range(0, len(unique), DESCRIBE_BATCH):
            chunk = unique[start : start + DESCRIBE_BATCH]
            found = call(
                "DescribeJobs",
                lambda chunk=chunk: client.describe_jobs(jobs=chunk),  # type: ignore[misc]
                attempts=attempts,
            )
            jobs.extend(found.get("jobs") or [])
        return jobs

    def list_jobs(self, queue: str, **filters: Any) -> list[dict[str, Any]]:
        """Every page of ListJobs on ``queue`` with ``filters`` (``jobStatus=...`` or ``filters=[...]``)."""
        client = self.client()
        summaries: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"jobQueue": queue, **filters}
            if token:
                kwargs["nextToken"] = token
            page = call("ListJobs", lambda kwargs=kwargs: client.list_jobs(**kwargs))  # type: ignore[misc]
            summaries.extend(page.get("jobSummaryList") or [])
            token = page.get("nextToken")
            if not token:
                return summaries

    def list_by_name(self, queue: str, pattern: str) -> list[dict[str, Any]]:
        """ListJobs on ``queue`` with a ``JOB_NAME`` filter (every state; a trailing ``*`` matches a prefix)."""
        return self.list_jobs(queue, filters=[{"name": "JOB_NAME", "values": [pattern]}])

    def describe_queue(self, queue: str) -> dict[str, Any] | None:
        """DescribeJobQueues of one queue; ``None`` when it does not exist."""
        client = self.client()
        found = call("DescribeJobQueues", lambda: client.describe_job_queues(jobQueues=[queue]))
        queues = found.get("jobQueues") or []
        return dict(queues[0]) if queues else None

    def active_definitions(self, name: str) -> list[dict[str, Any]]:
        """The ACTIVE revisions of the job definition ``name``, oldest first."""
        client = self.client()
        found = call(
            "DescribeJobDefinitions",
            lambda: client.describe_job_definitions(jobDefinitionName=name, status="ACTIVE"),
        )
        return sorted(found.get("jobDefinitions") or [], key=lambda d: int(d.get("revision", 0)))

    def register_definition(self, body: Mapping[str, Any]) -> str:
        """RegisterJobDefinition; the new revision's ARN."""
        client = self.client()
        registered = call("RegisterJobDefinition", lambda: client.register_job_definition(**body))
        return str(registered["jobDefinitionArn"])

    def submit(
        self, name: str, body: Mapping[str, Any], *, look_again: Callable[[BaseException], tuple[str, str] | None]
    ) -> tuple[str, str]:
        """SubmitJob once per try (no automatic retries: it has no client token); after an error that may have
        created the job, ``look_again`` (the name looked up) before sending it again. The job's id and ARN."""
        client = self._clients.get("batch", automatic_retries=False)

        def send() -> tuple[str, str]:
            answer = client.submit_job(**body)
            return str(answer["jobId"]), str(answer.get("jobArn") or "")

        return send_unsure(
            f"SubmitJob for {name}",
            send,
            service=SERVICE,
            where=f" on job queue {str(body['jobQueue'])!r}",
            note="; no job of that name exists (looked up after each try)",
            look_again=look_again,
            attempts=PATIENT_ATTEMPTS,
        )

    def terminate(self, job_id: str, reason: str) -> None:
        """TerminateJob (any state; Batch ignores it for an ended job) with the reason marked as ours."""
        client = self.client()
        text = (CANCEL_PREFIX + reason)[:1024]
        call("TerminateJob", lambda: client.terminate_job(jobId=job_id, reason=text))

    def tag(self, arn: str, tags: Mapping[str, str]) -> None:
        """TagResource on a job's ARN."""
        client = self.client()
        call("TagResource", lambda: client.tag_resource(resourceArn=arn, tags=dict(tags)))
