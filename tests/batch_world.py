"""Fixture `batch`: the AWS Batch emulator (moto server, jobs run as local processes) with a spot
queue, an on-demand queue and a fair-share queue, and an Airflow AWS connection pointing at it.
Registered for the whole suite by tests/conftest.py.

One emulator serves the whole session (starting it and creating the queues takes a few seconds);
each test gets its request log reset, faults cleared, and every job it left active terminated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpu_provider.testing.emulators.aws_batch import BatchEmulator, BatchSetup
from tests.harness import REPO


@dataclass
class BatchWorld:
    emulator: BatchEmulator
    setup: BatchSetup

    @property
    def queues(self) -> dict[str, str]:
        return {"spot_queue": self.setup.spot_queue, "on_demand_queue": self.setup.on_demand_queue}

    def backend_source(self, **options: Any) -> str:
        """Python source of a BatchBackend for a DAG file."""
        args = ", ".join(f"{k}={v!r}" for k, v in {**self.queues, **options}.items())
        return f"BatchBackend({args})"

    def bodies(self, action: str) -> list[dict[str, Any]]:
        """Bodies of the requests of one action the server accepted (throttled ones left out)."""
        return [r["body"] for r in self.emulator.requests(action) if not r["throttled"]]

    def describe(self, job_id: str) -> dict[str, Any]:
        jobs = self.emulator.client("batch").describe_jobs(jobs=[job_id])["jobs"]
        return dict(jobs[0])


@pytest.fixture(scope="session")
def batch_emulator() -> Iterator[BatchWorld]:
    # one emulator per process (moto's state is global); tests/emulators may have started it already
    running = BatchEmulator.running()
    if running is not None:
        yield BatchWorld(running, running.create_environment(fair_share=True))
        return
    with BatchEmulator(job_cwd=REPO, step_seconds=0.3, grace_period=3.0) as emulator:
        setup = emulator.create_environment(fair_share=True)
        yield BatchWorld(emulator, setup)


def connection_env(emulator: BatchEmulator) -> dict[str, str]:
    """Environment that points Airflow's aws_default connection (and boto3) at the emulator."""
    extra = {"endpoint_url": emulator.endpoint_url, "region_name": emulator.region}
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra}),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": emulator.region,
    }


@pytest.fixture
def batch(batch_emulator: BatchWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchWorld]:
    emulator = batch_emulator.emulator
    for key, value in connection_env(emulator).items():
        monkeypatch.setenv(key, value)
    emulator.reset_requests()
    yield batch_emulator
    emulator.reset_faults()
    setup = batch_emulator.setup
    queues = [q for q in (setup.spot_queue, setup.on_demand_queue, setup.fair_share_queue) if q]
    client = emulator.client("batch")
    for queue in queues:
        for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING"):
            for job in client.list_jobs(jobQueue=queue, jobStatus=status).get("jobSummaryList", []):
                client.terminate_job(jobId=job["jobId"], reason="test teardown")
