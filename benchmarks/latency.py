"""Figure 3, completion latency: from the remote job ending to the waiting side knowing it, ours vs the anchors.

AWS Batch jobs that run for given durations (their commands, ``sleep D``, run as processes in the
Batch emulator, ``gpu_provider/testing/emulators/aws_batch.py``) are waited on, all at the same time, by four sides,
each on its own jobs of every duration:

- **ours, deferrable**: ``GpuJobTrigger.run()`` (what ``GpuJobOperator(deferrable=True)`` waits in),
  all triggers in one event loop with the shared poller;
- **ours, sync**: ``AttemptRunner.wait`` (the loop ``GpuJobOperator(deferrable=False)`` runs in the
  worker), one thread per task;
- **BatchOperator, deferrable**: ``BatchJobTrigger.run()`` in its own process (it needs aiobotocore:
  see ``benchmarks/_anchor_env.py``), all triggers in one event loop;
- **BatchOperator, sync**: ``BatchClientHook.wait_for_job`` (what ``BatchOperator.execute`` calls to
  wait, with the operator's defaults: exponential backoff with jitter), one thread per task.

The deferrable sides and our sync side poll every ``--interval`` seconds (``poll_interval`` /
``waiter_delay``); the sync ``BatchOperator`` has no interval, its backoff decides. The latency of a
job is the moment its side returned (trigger event, or the wait returning) minus the job's
``stoppedAt`` (when the emulator saw its process exit). What follows in Airflow (the triggerer's
event written to the database, the scheduler resuming or finishing the task) is the same for every
side and not measured here.

Usage: ``python benchmarks/latency.py [--quick] [--interval S] [--durations S ...] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._anchor_env import anchor_pythonpath, aws_env  # noqa: E402

SIDES = ("ours deferrable", "ours sync", "BatchOperator deferrable", "BatchOperator sync")


def anchor_child(ids_file: Path, interval: float, out: Path) -> int:
    """The anchor's triggerer: waits for the ids file, then one ``BatchJobTrigger`` per job, gathered."""
    from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger

    print("ready", flush=True)
    while not ids_file.exists():
        time.sleep(0.05)
    ids = json.loads(ids_file.read_text())

    async def wait(job_id: str) -> tuple[str, float, str]:
        trigger = BatchJobTrigger(job_id=job_id, waiter_delay=int(interval), waiter_max_attempts=10**6)
        async for event in trigger.run():
            return job_id, time.time(), str(event.payload.get("status"))
        return job_id, time.time(), "none"

    async def main() -> list[tuple[str, float, str]]:
        return list(await asyncio.gather(*(wait(i) for i in ids)))

    out.write_text(json.dumps(asyncio.run(main())))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s interval, jobs of 3 and 7 s")
    parser.add_argument("--interval", type=float, default=None, help="poll interval (default 10, --quick 2)")
    parser.add_argument("--durations", type=float, nargs="+", default=None)
    parser.add_argument("--repeat", type=int, default=None, help="jobs per duration and side (default 2)")
    parser.add_argument("--anchor-child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.anchor_child:
        ids_file, interval, out = args.anchor_child
        return anchor_child(Path(ids_file), float(interval), Path(out))
    interval = args.interval or (2.0 if args.quick else 10.0)
    durations = args.durations or ([3.0, 7.0] if args.quick else [5.0, 20.0, 45.0, 90.0, 150.0])
    repeat = args.repeat or 2
    logging.getLogger("gpu_provider.testing.emulators").setLevel(logging.WARNING)
    overlay = anchor_pythonpath()

    from gpu_provider.testing.emulators.aws_batch import BatchEmulator

    with tempfile.TemporaryDirectory(prefix="gpu-bench-latency-") as tmp, BatchEmulator(job_cwd=REPO) as emulator:
        setup = emulator.create_environment(fair_share=False)
        env = aws_env(emulator.endpoint_url, emulator.region)
        os.environ.update(env)
        from airflow.providers.amazon.aws.hooks.batch_client import BatchClientHook

        from gpu_provider.backends.base import JobIdentity, JobRequest, TaskKey
        from gpu_provider.backends.batch import BatchBackend
        from gpu_provider.engine.logs import LogForwarder
        from gpu_provider.engine.runner import AttemptRunner
        from gpu_provider.job import GpuResources
        from gpu_provider.records import AttemptRecord
        from gpu_provider.triggers.gpu_job import GpuJobTrigger

        backend = BatchBackend(spot_queue=setup.spot_queue, on_demand_queue=setup.on_demand_queue)
        ids_file, anchor_out = Path(tmp, "ids.json"), Path(tmp, "anchor.json")
        child_log = Path(tmp, "anchor.log")
        child_env = dict(os.environ, PYTHONPATH=os.pathsep.join([overlay, str(REPO)]))
        cmd = [sys.executable, __file__, "--anchor-child", str(ids_file), str(interval), str(anchor_out)]
        with child_log.open("w") as log:
            child = subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while "ready" not in child_log.read_text():  # the anchor's imports are done before any job starts
                if child.poll() is not None:
                    raise RuntimeError(f"anchor triggerer exited {child.returncode}: {child_log.read_text()[-3000:]}")
                time.sleep(0.1)
            handles: dict[str, list[Any]] = {side: [] for side in SIDES}
            duration_of: dict[str, float] = {}
            for r in range(repeat):
                for d in durations:
                    for s, side in enumerate(SIDES):
                        key = TaskKey("latency", f"s{s}-d{d:g}-r{r}", "run")
                        identity = JobIdentity(key, try_number=1, attempt=1, capacity="on-demand")
                        request = JobRequest(
                            identity,
                            ("sh", "-c", f"echo started; sleep {d:g}; echo finished"),
                            {},
                            GpuResources(),
                            "on-demand",
                            image="x",
                        )
                        handle = backend.submit(request)
                        handles[side].append(handle)
                        duration_of[handle.job_id] = d
            noticed: dict[str, float] = {}  # the side saw the end (status read, trigger event)
            done: dict[str, float] = {}  # the side is done: what the operator still does before the task ends
            partial = ids_file.with_suffix(".tmp")
            partial.write_text(json.dumps([h.job_id for h in handles["BatchOperator deferrable"]]))
            partial.replace(ids_file)  # whole, at once: the anchor's process is reading for it

            async def ours_deferrable() -> None:
                async def one(handle: Any) -> None:
                    trigger = GpuJobTrigger(
                        backend=backend.spec(), handle=handle.to_dict(), poll_interval=interval, stream_logs=False
                    )
                    async for _event in trigger.run():
                        noticed[handle.job_id] = time.time()
                        # execute_complete on Batch then reads the rest of the log (stream_logs_when_deferred=False)
                        await asyncio.to_thread(LogForwarder(backend, handle, logging.getLogger("bench")).settle)
                        done[handle.job_id] = time.time()
                        return

                await asyncio.gather(*(one(h) for h in handles["ours deferrable"]))

            def ours_sync(handle: Any) -> None:
                def seen(status: Any) -> None:
                    if status.state.terminal:
                        noticed.setdefault(handle.job_id, time.time())

                runner = AttemptRunner(
                    backend,
                    None,  # type: ignore[arg-type]  # the wait does not use the engine on Batch
                    log=logging.getLogger("bench"),
                    label="latency",
                    stop=threading.Event(),
                    persist=lambda records: None,
                    on_status=seen,
                )
                runner.wait(AttemptRecord(attempt=1, handle=handle), interval)  # streams and settles the log
                done[handle.job_id] = time.time()

            hook = BatchClientHook(aws_conn_id="aws_default")

            def anchor_sync(handle: Any) -> None:
                hook.wait_for_job(handle.job_id)
                noticed[handle.job_id] = time.time()
                hook.check_job_success(handle.job_id)  # BatchOperator.monitor_job's next call
                done[handle.job_id] = time.time()

            threads = [threading.Thread(target=lambda: asyncio.run(ours_deferrable()))]
            threads += [threading.Thread(target=ours_sync, args=(h,)) for h in handles["ours sync"]]
            threads += [threading.Thread(target=anchor_sync, args=(h,)) for h in handles["BatchOperator sync"]]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            child.wait(timeout=max(durations) * 3 + 120)
            if child.returncode != 0:
                raise RuntimeError(f"anchor triggerer exited {child.returncode}: {child_log.read_text()[-3000:]}")
            for job_id, at, _status in json.loads(anchor_out.read_text()):
                noticed[job_id] = done[job_id] = at  # execute_complete only checks the event
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        client = emulator.client("batch")
        all_ids = [h.job_id for side in SIDES for h in handles[side]]
        stopped: dict[str, float] = {}
        for i in range(0, len(all_ids), 100):
            for job in client.describe_jobs(jobs=all_ids[i : i + 100])["jobs"]:
                stopped[job["jobId"]] = job["stoppedAt"] / 1000
                assert job["status"] == "SUCCEEDED", job
    print(
        f"Figure 3, completion latency on AWS Batch (emulator): poll interval {interval:g} s, jobs of "
        f"{', '.join(f'{d:g}' for d in durations)} s, {repeat} per duration and side, all sides at once"
    )
    print(
        "| side | end seen: median s | max s | task done: median s | max s | done, jobs >= 45 s: median s "
        "| seen within interval + 1 s |"
    )
    print("|---|---|---|---|---|---|---|")

    def lat(marks: dict[str, float], side: str, d: float | None = None) -> list[float]:
        return [marks[h.job_id] - stopped[h.job_id] for h in handles[side] if d is None or duration_of[h.job_id] == d]

    medians = {}
    for side in SIDES:
        seen, fin = lat(noticed, side), lat(done, side)
        long = [x for d in durations if d >= 45 for x in lat(done, side, d)]
        medians[side] = statistics.median(fin)
        print(
            f"| {side} | {statistics.median(seen):.2f} | {max(seen):.2f} | {statistics.median(fin):.2f} | "
            f"{max(fin):.2f} | {statistics.median(long) if long else float('nan'):.2f} | "
            f"{sum(x <= interval + 1 for x in seen)} of {len(seen)} |"
        )
    print("| task done, median s, by job duration | " + " | ".join(f"{d:g} s" for d in durations) + " |")
    print("|---|" + "---|" * len(durations))
    for side in SIDES:
        print(f"| {side} | " + " | ".join(f"{statistics.median(lat(done, side, d)):.2f}" for d in durations) + " |")
    for ours, anchor in (("ours deferrable", "BatchOperator deferrable"), ("ours sync", "BatchOperator sync")):
        print(f"ratio of task-done medians, {anchor} / {ours}: {medians[anchor] / medians[ours]:.2f}")
    worst_seen = max(max(lat(noticed, s)) for s in SIDES[:2])
    worst_done = max(max(lat(done, s)) for s in SIDES[:2])
    print(
        f"target: ours within one poll interval + 1 s ({interval + 1:g} s): end seen, max {worst_seen:.2f} s -> "
        f"{'met' if worst_seen <= interval + 1 else 'missed'}; task done, max {worst_done:.2f} s -> "
        f"{'met' if worst_done <= interval + 1 else 'missed'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
