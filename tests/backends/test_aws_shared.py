"""What the AWS backends share (gpu_provider.backends.aws): a non-idempotent create sent once per try, and a job
the service does not return. The backends' own tests run these against the emulators; here each rule alone."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_provider import names
from gpu_provider.backends.aws import calls
from gpu_provider.backends.aws.status import LOST_NEXT, VISIBILITY_GRACE_S, missing
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.exceptions import GpuBackendThrottledError, GpuJobError, GpuJobStatusError


def _error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls, "BASE_DELAY_S", 0.0)


class Sender:
    """Answers each send with the next of ``outcomes`` (an exception is raised); counts sends and lookups."""

    def __init__(self, *outcomes: Any, found_after: int | None = None) -> None:
        self.outcomes, self.sends, self.lookups, self.found_after = list(outcomes), 0, 0, found_after

    def send(self) -> str:
        self.sends += 1
        outcome = self.outcomes[min(self.sends, len(self.outcomes)) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return str(outcome)

    def look_again(self, err: BaseException) -> str | None:
        self.lookups += 1
        return "found" if self.found_after is not None and self.lookups >= self.found_after else None


def _send(sender: Sender, attempts: int = 4) -> str:
    return calls.send_unsure(
        "CreateThing for t-1",
        sender.send,
        service="Some Service",
        where=" on queue 'q'",
        note="; nothing of that name exists",
        look_again=sender.look_again,
        attempts=attempts,
    )


def test_a_definite_refusal_is_raised_as_it_is_sent_once_and_not_looked_up() -> None:
    sender = Sender(_error("ClientException", 400))
    with pytest.raises(ClientError, match="ClientException"):
        _send(sender)
    assert (sender.sends, sender.lookups) == (1, 0)


def test_an_answer_that_may_have_been_carried_out_is_looked_up_before_it_is_sent_again() -> None:
    sender = Sender(_error("ServerException", 500), "created", found_after=None)
    assert _send(sender) == "created"
    assert (sender.sends, sender.lookups) == (2, 1)
    found = Sender(_error("TooManyRequestsException", 429), "created again", found_after=1)
    assert _send(found) == "found"  # the lookup found it: never sent a second time
    assert (found.sends, found.lookups) == (1, 1)


def test_the_last_try_says_what_failed_where_and_how_often() -> None:
    failing = Sender(_error("ServerException", 500))
    with pytest.raises(GpuJobError) as err:
        _send(failing, attempts=3)
    assert str(err.value).startswith("Some Service CreateThing for t-1 on queue 'q' failed 3 times (ClientError: ")
    assert str(err.value).endswith("; nothing of that name exists")
    assert (failing.sends, failing.lookups) == (3, 2)  # no lookup after the last try: nothing is sent again
    throttled = Sender(_error("ThrottlingException", 400))
    with pytest.raises(GpuBackendThrottledError) as thr:
        _send(throttled, attempts=3)
    assert str(thr.value) == "Some Service throttled CreateThing for t-1 3 times in a row; nothing of that name exists"


def test_a_job_not_returned_is_not_visible_yet_within_the_grace_then_lost() -> None:
    handle = JobHandle(
        backend="batch", job_id="j-1", name="gp-x-t1-a1", attempt=1, capacity="spot", submitted_at=1000.0
    )
    kwargs: dict[str, Any] = {"unseen": "The service does not list j-1", "gone": "The service forgot j-1."}
    early = missing(handle, 1000.0 + VISIBILITY_GRACE_S - 1, unseen_note=" (eventually consistent)", **kwargs)
    assert isinstance(early, GpuJobStatusError)
    assert str(early) == (
        "The service does not list j-1 yet, 59s after it was submitted (eventually consistent); "
        "reading it again on the next poll"
    )
    late = missing(handle, 1000.0 + VISIBILITY_GRACE_S, **kwargs)
    assert isinstance(late, JobStatus)
    assert (late.state, late.interruption, late.capacity) == (JobState.FAILED, names.LOST, "spot")
    assert late.reason == f"The service forgot j-1. {LOST_NEXT}"
