"""SageMaker's answers, classified with the service's own strings: every row of the mapping's tables
is a test. A capacity problem is an interruption the capacity policy absorbs, never the job's own
error; the job's own error is never an interruption.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobState, JobStatus
from gpu_provider.backends.sagemaker import SageMakerBackend, mapping
from gpu_provider.engine.attempts import AttemptEngine, Fail, Submit
from gpu_provider.records import AttemptRecord
from gpu_provider.recovery import SpotFallback
from gpu_provider.testing.dagrun import wait_for
from gpu_provider.testing.worlds import SageMakerWorld
from tests.backends.contract.worlds import LONG_JOB, SageMakerBackendWorld

CAPACITY_ERROR = mapping.FAILURE_REASONS["CapacityError:"][1]


def _backend() -> SageMakerBackend:
    return SageMakerBackend(
        role_arn="arn:aws:iam::123456789012:role/gpu-sagemaker-job",
        output_path="s3://bucket/models",
        region_name="us-east-1",
    )


def _handle(capacity: str = names.SPOT) -> JobHandle:
    name = "gp-d-t-0123456789-t1-a1"
    return JobHandle("sagemaker", name, name, 1, capacity, time.time(), extra={"region": "us-east-1", "gpus": 1})


def _job(status: str, secondary: str, failure: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "TrainingJobName": "gp-d-t-0123456789-t1-a1",
        "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/gp-d-t-0123456789-t1-a1",
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "EnableManagedSpotTraining": True,
        "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 1200},
        "SecondaryStatusTransitions": [{"Status": secondary, "StartTime": time.time(), "StatusMessage": secondary}],
    }
    if failure is not None:
        job["FailureReason"] = failure
    return job


@pytest.mark.parametrize(("pair", "state"), sorted(mapping.STATE_TABLE.items()), ids=sorted(mapping.STATE_TABLE))
def test_every_state_pair(pair: str, state: JobState) -> None:
    """Each ``TrainingJobStatus/SecondaryStatus`` row: its state, and an interruption exactly where the table says."""
    status, _, secondary = pair.partition("/")
    got = _backend().status_of(_job(status, secondary), _handle(), {})
    assert got.state is state
    assert got.interruption == mapping.INTERRUPTIONS.get(pair), (pair, got)


@pytest.mark.parametrize(
    ("prefix", "row"), sorted(mapping.FAILURE_REASONS.items()), ids=sorted(mapping.FAILURE_REASONS)
)
def test_every_failure_reason(prefix: str, row: tuple[str | None, str]) -> None:
    """Each ``FailureReason`` row, with SageMaker's own words: whose fault the failure is."""
    kind, words = row
    assert words.startswith(prefix)
    got = _backend().status_of(_job("Failed", "Failed", words), _handle(), {})
    assert got.state is JobState.FAILED
    assert got.interruption == kind, (prefix, got)
    if kind is None:
        assert words in got.reason  # the job's own error, in SageMaker's words
    else:
        assert "not the job's own error" in got.reason and words in got.reason


def test_a_capacity_error_goes_to_the_capacity_policy_not_to_airflow_retries() -> None:
    """Issue 24.5: a spot attempt that failed with CapacityError is resubmitted by the policy (on-demand)."""
    handle = _handle(names.SPOT)
    record = AttemptRecord.new(handle, try_number=1)
    record.update(_backend().status_of(_job("Failed", "Failed", CAPACITY_ERROR), handle, {}))
    engine = AttemptEngine(SpotFallback(backoff=0), [record], try_number=1, backend_name="sagemaker")
    step = engine.ended(record)
    assert step == Submit(attempt=2, capacity=names.ON_DEMAND)
    own = AttemptRecord.new(_handle(names.SPOT), try_number=1)
    own.update(_backend().status_of(_job("Failed", "Failed", "AlgorithmError: , exit code: 1"), own.handle, {}))
    failed = AttemptEngine(SpotFallback(backoff=0), [own], try_number=1, backend_name="sagemaker").ended(own)
    assert isinstance(failed, Fail) and "the job's own error" in str(failed.error)


def test_the_emulator_ends_a_job_with_a_capacity_error(sagemaker: SageMakerWorld) -> None:
    """The same string end to end: the emulator's ``fail`` with SageMaker's words, read by the backend's poll."""
    world = SageMakerBackendWorld(sagemaker)
    sagemaker.emulator.hold(names.SPOT)
    backend = world.backend()
    handle = backend.submit(world.request("capacity", LONG_JOB, capacity=names.SPOT))
    sagemaker.emulator.fail(handle.job_id, CAPACITY_ERROR)

    def ended() -> JobStatus | None:
        status = backend.poll([handle])[handle.job_id]
        assert isinstance(status, JobStatus), status
        return status if status.state.terminal else None

    status: JobStatus = wait_for(ended, 30, "the job to fail")
    assert status.state is JobState.FAILED and status.interruption == names.CAPACITY_TIMEOUT, status
    assert sagemaker.describe(handle.job_id)["FailureReason"] == CAPACITY_ERROR
