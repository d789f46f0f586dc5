"""Secrets by reference on the AWS backends (issue 25, item 3): ``secrets=`` names a Secrets Manager
secret or an SSM parameter; the request the service receives carries only that reference, and the job
sees the value. AWS Batch resolves references itself (the emulator does as Batch does); SageMaker has no
such field, so the job's entry (``gpu_provider.runtime.secrets``) reads them in the job. Kubernetes:
tests/backends/test_kubernetes_backend.py::test_secrets_reach_the_job_by_reference_only."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from typing import Any

import pytest

from gpu_provider import names
from gpu_provider.backends.base import Backend, JobIdentity, JobRequest, JobState, TaskKey
from gpu_provider.backends.batch import BatchBackend
from gpu_provider.backends.sagemaker import SageMakerBackend
from gpu_provider.job import GpuResources
from gpu_provider.runtime.secrets import check_refs
from tests.backends.contract.worlds import wait_ended
from tests.batch_world import BatchWorld
from tests.harness import wait_for
from tests.sagemaker_world import SageMakerWorld

TOKEN = "hf_" + "s3cr3t" * 4  # what a connection's password would hold
DB_PASSWORD = "db-" + "p4ss" * 4
#: the job prints a digest of each value it sees, never the value
JOB = (
    "import hashlib, os\n"
    "for name in ('HF_TOKEN', 'DB_PASSWORD'):\n"
    "    print(name, hashlib.sha256(os.environ[name].encode()).hexdigest(), flush=True)\n"
    "print('refs left in env:', 'GPU_PROVIDER_SECRET_REFS' in os.environ, flush=True)\n"
)


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _request(task: str, *, nodes: int = 1) -> JobRequest:
    identity = JobIdentity(TaskKey("secrets_tests", task, f"manual__{uuid.uuid4().hex[:8]}"), 1, 1, names.ON_DEMAND)
    return JobRequest(
        identity=identity,
        command=(sys.executable, "-c", JOB),
        env={names.ENV_ATTEMPT: "1"},
        resources=GpuResources(gpus=1, nodes=nodes),
        capacity=names.ON_DEMAND,
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1",
    )


def _store(client: Any, ssm: Any, suffix: str) -> dict[str, str]:
    """A Secrets Manager secret and an SSM SecureString: the references ``secrets=`` takes."""
    arn = client.create_secret(Name=f"team/hf-token-{suffix}", SecretString=TOKEN)["ARN"]
    ssm.put_parameter(Name=f"/team/db-password-{suffix}", Value=DB_PASSWORD, Type="SecureString")
    return {"HF_TOKEN": arn, "DB_PASSWORD": f"/team/db-password-{suffix}"}


def _lines(backend: Backend, handle: Any) -> list[str]:
    def read() -> list[str] | None:
        lines = backend.logs(handle).lines
        return lines if any("refs left in env" in line for line in lines) else None

    return wait_for(read, 30, "the job's log lines")  # type: ignore[no-any-return]


def _assert_seen_by_reference(sent: list[dict[str, Any]], lines: list[str]) -> None:
    text = json.dumps(sent)
    assert TOKEN not in text and DB_PASSWORD not in text, "a secret value travelled in a request"
    log = "\n".join(lines)
    assert f"HF_TOKEN {_digest(TOKEN)}" in log, log
    assert f"DB_PASSWORD {_digest(DB_PASSWORD)}" in log, log
    assert TOKEN not in log and DB_PASSWORD not in log


@pytest.mark.parametrize("nodes", [1, 2], ids=["single", "multi-node"])
def test_sagemaker_secrets_travel_as_references_and_the_job_sees_the_values(
    sagemaker: SageMakerWorld, nodes: int
) -> None:
    sagemaker.ensure_buckets()
    emulator = sagemaker.emulator
    refs = _store(emulator.client("secretsmanager"), emulator.client("ssm"), uuid.uuid4().hex[:8])
    before = len(emulator.requests())
    backend = SageMakerBackend(**sagemaker.options, secrets=refs)
    handle = backend.submit(_request(f"sm{nodes}", nodes=nodes))
    assert wait_ended(backend, handle).state is JobState.SUCCEEDED
    lines = _lines(backend, handle)
    _assert_seen_by_reference([r["body"] for r in emulator.requests(since=before)], lines)
    assert any("refs left in env: False" in line for line in lines), lines
    (create,) = sagemaker.bodies("CreateTrainingJob")[-1:]
    assert json.loads(create["Environment"][names.ENV_SECRET_REFS]) == refs
    described = sagemaker.describe(handle.name)["Environment"]  # what anyone allowed DescribeTrainingJob reads
    assert TOKEN not in json.dumps(described) and DB_PASSWORD not in json.dumps(described)


def test_sagemaker_job_fails_naming_the_reference_it_could_not_read(sagemaker: SageMakerWorld) -> None:
    sagemaker.ensure_buckets()
    missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:team/nothing-here-AbCdEf"
    backend = SageMakerBackend(**sagemaker.options, secrets={"HF_TOKEN": missing})
    handle = backend.submit(_request("sm_missing"))
    status = wait_ended(backend, handle)
    assert status.state is JobState.FAILED, status
    log = "\n".join(wait_for(lambda: backend.logs(handle).lines or None, 30, "the job's log"))
    assert f"secrets['HF_TOKEN'] = {missing!r} could not be read: ResourceNotFoundException" in log, log


def test_batch_secrets_travel_as_references_and_the_job_sees_the_values(batch: BatchWorld) -> None:
    emulator = batch.emulator
    refs = _store(emulator.client("secretsmanager"), emulator.client("ssm"), uuid.uuid4().hex[:8])
    before = len(emulator.requests())
    backend = BatchBackend(**batch.queues, secrets=refs)
    handle = backend.submit(_request("batch"))
    assert wait_ended(backend, handle).state is JobState.SUCCEEDED
    _assert_seen_by_reference([r["body"] for r in emulator.requests(since=before)], _lines(backend, handle))
    (definition,) = batch.bodies("RegisterJobDefinition")[-1:]
    assert {s["name"]: s["valueFrom"] for s in definition["containerProperties"]["secrets"]} == refs


@pytest.mark.parametrize(
    "ref",
    [
        "hf_abcdef0123456789",  # a value passed by mistake
        "arn:aws:iam::123456789012:role/x",
        "team/hf-token",
    ],
)
def test_secrets_take_references_only_and_never_echo_a_value(ref: str) -> None:
    for cls in (BatchBackend, SageMakerBackend):
        with pytest.raises(ValueError, match=r"secrets\['HF_TOKEN'\] must be the ARN of a Secrets Manager") as err:
            cls(secrets={"HF_TOKEN": ref})
        assert ref not in str(err.value)
    assert check_refs('{"A": "/team/a", "B": "arn:aws:ssm:us-east-1:123456789012:parameter/b"}') == {
        "A": "/team/a",
        "B": "arn:aws:ssm:us-east-1:123456789012:parameter/b",
    }
