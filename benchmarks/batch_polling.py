"""Status polling cost of waiting AWS Batch jobs: the shared, batched poller vs one call per job.

Against the Batch emulator (moto server, ``gpu_provider/testing/emulators/aws_batch.py``), N jobs are submitted to a
queue held at RUNNABLE (so they stay waiting). Then, for several ticks each, it measures:

- **batched**: ``BatchBackend.poll(all handles)``, what the shared poller does once per tick for all
  deferred tasks of a triggerer (100 ids per DescribeJobs);
- **per job**: one DescribeJobs call per job, what a trigger that polls its own job does (the
  amazon provider's ``BatchJobTrigger`` pattern).

Reported per tick: DescribeJobs calls counted at the server, and the wall time (median of the
ticks). The emulator's absolute times are not AWS's; the call counts are what AWS throttles and bills.

Usage: ``python benchmarks/batch_polling.py [--jobs 10 100 250 1000] [--ticks 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 250, 1000])
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()

    from gpu_provider.testing.emulators.aws_batch import BatchEmulator

    with BatchEmulator(job_cwd=REPO) as emulator:
        setup = emulator.create_environment(fair_share=False)
        extra = {"endpoint_url": emulator.endpoint_url, "region_name": emulator.region}
        os.environ.update(
            {
                "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra}),
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
            }
        )
        from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
        from gpu_provider.backends.batch import BatchBackend
        from gpu_provider.job import GpuResources

        backend = BatchBackend(spot_queue=setup.spot_queue, on_demand_queue=setup.on_demand_queue)
        client = emulator.client("batch")
        emulator.hold(setup.spot_queue)
        handles = []
        print(
            f"{'jobs':>6} | {'batched: calls/tick':>19} | {'batched: ms/tick':>16} | "
            f"{'per job: calls/tick':>19} | {'per job: ms/tick':>16} | {'calls ratio':>11}"
        )
        for n in sorted(args.jobs):
            while len(handles) < n:
                i = len(handles)
                identity = JobIdentity(TaskKey("bench", f"t{i}", "run"), try_number=1, attempt=1, capacity="spot")
                handles.append(backend.submit(JobRequest(identity, ("true",), {}, GpuResources(), "spot", image="x")))
            batched_ms, per_job_ms, batched_calls, per_job_calls = [], [], [], []
            for _ in range(args.ticks):
                emulator.reset_requests()
                start = time.perf_counter()
                backend.poll(handles[:n])
                batched_ms.append((time.perf_counter() - start) * 1000)
                batched_calls.append(emulator.count("DescribeJobs"))
                emulator.reset_requests()
                start = time.perf_counter()
                for handle in handles[:n]:
                    client.describe_jobs(jobs=[handle.job_id])
                per_job_ms.append((time.perf_counter() - start) * 1000)
                per_job_calls.append(emulator.count("DescribeJobs"))
            calls_b, calls_p = statistics.median(batched_calls), statistics.median(per_job_calls)
            print(
                f"{n:>6} | {calls_b:>19.0f} | {statistics.median(batched_ms):>16.1f} | "
                f"{calls_p:>19.0f} | {statistics.median(per_job_ms):>16.1f} | {calls_p / calls_b:>10.0f}x"
            )
        for handle in handles:
            backend.cancel(handle, "benchmark done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
