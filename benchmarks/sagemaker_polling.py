"""Status polling cost of waiting SageMaker training jobs: the coalesced poll vs one call per job.

Against the SageMaker emulator (``gpu_provider/testing/emulators/aws_sagemaker.py``, served over HTTP,
so every call goes through botocore's real serialisation), N training jobs are created while capacity is held (they
stay InProgress/Starting). After one warm-up tick (the first read of each job describes it and
reads its tags), it measures for several ticks each:

- **coalesced**: ``SageMakerBackend.poll(all handles)``, what the shared poller does once per tick
  for all deferred tasks of a triggerer: one ListTrainingJobs per 100 jobs modified recently, and
  DescribeTrainingJob only for jobs that changed;
- **per job**: one DescribeTrainingJob per job, what the amazon provider's SageMaker trigger does.

Reported per tick: SageMaker calls counted at the server, and the wall time (median of the ticks).
The emulator's absolute times are not AWS's; the call counts are what AWS throttles.

Usage: ``python benchmarks/sagemaker_polling.py [--jobs 10 100 250] [--ticks 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CALLS = ("ListTrainingJobs", "DescribeTrainingJob", "ListTags")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 250])
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()

    from gpu_provider.testing.emulators.aws_sagemaker import ROLE_ARN, SageMakerEmulator

    with tempfile.TemporaryDirectory() as root, SageMakerEmulator(job_root=root, job_cwd=REPO) as emulator:
        extra = {"endpoint_url": emulator.endpoint_url, "region_name": emulator.region}
        os.environ.update(
            {
                "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra}),
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
            }
        )
        from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
        from gpu_provider.backends.sagemaker import SageMakerBackend
        from gpu_provider.job import GpuResources

        backend = SageMakerBackend(role_arn=ROLE_ARN, output_path="s3://bench-models/out")
        client = emulator.client("sagemaker")
        emulator.hold("spot")
        handles = []

        def calls() -> int:
            return sum(emulator.count(action) for action in CALLS)

        print(
            f"{'jobs':>6} | {'coalesced: calls/tick':>21} | {'coalesced: ms/tick':>18} | "
            f"{'per job: calls/tick':>19} | {'per job: ms/tick':>16} | {'calls ratio':>11}"
        )
        for n in sorted(args.jobs):
            while len(handles) < n:
                i = len(handles)
                identity = JobIdentity(TaskKey("bench", f"t{i}", "run"), try_number=1, attempt=1, capacity="spot")
                request = JobRequest(identity, ("true",), {}, GpuResources(), "spot", image="x", capacity_wait_s=3600)
                handles.append(backend.submit(request))
            backend.poll(handles[:n])  # warm-up: every job read once
            coalesced_ms, per_job_ms, coalesced_calls, per_job_calls = [], [], [], []
            for _ in range(args.ticks):
                emulator.reset_requests()
                start = time.perf_counter()
                backend.poll(handles[:n])
                coalesced_ms.append((time.perf_counter() - start) * 1000)
                coalesced_calls.append(calls())
                emulator.reset_requests()
                start = time.perf_counter()
                for handle in handles[:n]:
                    client.describe_training_job(TrainingJobName=handle.job_id)
                per_job_ms.append((time.perf_counter() - start) * 1000)
                per_job_calls.append(calls())
            calls_c, calls_p = statistics.median(coalesced_calls), statistics.median(per_job_calls)
            print(
                f"{n:>6} | {calls_c:>21.0f} | {statistics.median(coalesced_ms):>18.1f} | "
                f"{calls_p:>19.0f} | {statistics.median(per_job_ms):>16.1f} | {calls_p / calls_c:>10.0f}x"
            )
        emulator.stop_all("benchmark done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
