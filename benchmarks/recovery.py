"""Figure 4, recovery loss: work redone and wall time lost per spot interruption, ours vs a plain Airflow retry.

The example pipeline's training stage (``python -m gpu_provider.examples.train``, the job program of
``dags/gpu_ml_pipeline.py``, on a dataset made once by its preprocess stage) runs as an AWS Batch job
against the Batch emulator, through a real Airflow task (``dag.test()`` in a child process), two ways:

- **ours**: ``GpuJobOperator(capacity=SpotFallback(after_preemptions=K), checkpoint=Checkpoint(...))``
  as in the example DAG: each interruption resumes from the latest checkpoint (spot, then on-demand);
- **plain retry**: ``BatchOperator(job_queue=<spot>, retries=K, retry_delay=5 s)`` (the example DAG's
  retry delay): each interruption fails the try and Airflow's retry starts training again from step 0.

Both sides run sync (``deferrable=False``; the deferrable BatchOperator needs aiobotocore in the task's
process) one after the other, each once without interruptions and once with K injected ones: the
emulator reclaims each of the first K spot jobs ``--after`` seconds after it reaches RUNNING
(``BatchEmulator.preempt_after``: SIGTERM, SIGKILL after the grace period, the job FAILED with
``Host EC2 (instance ...) terminated.``). Two kinds of interruption: *with notice* (5 s between SIGTERM
and SIGKILL, as Batch gives a container; the job program saves a checkpoint at SIGTERM) and, in the full
run, *without notice* (SIGKILL at once: only the periodic checkpoints count).

Measured from the emulator: the steps each job ran (its log: where it started, where it stopped), the
steps redone (run minus the total), and the wall time from the first submission to the last job's end;
lost per interruption = (interrupted - uninterrupted) / K for the same side. The checkpoint interval is
``--checkpoint-every`` steps x ``--step-delay`` seconds.

Where the time goes, per interruption of ours (from the emulator's own records): *notice to end* (the
job's "SIGTERM received" log line to the job's ``stoppedAt``: its checkpoint and exit), *end to next submit*
(``stoppedAt`` to the next job's ``createdAt``: what the provider controls, from seeing the end to the
submission), *queue to RUNNING* (``createdAt`` to ``startedAt``) and *start to first step* (``startedAt`` to the
resumed job's "resumed from checkpoint" line: a new process importing numpy and restoring the checkpoint). The
last two are the service's own start-up; the wall-time target is one checkpoint interval plus that start-up.

``--events``: ours also runs with the Batch events on (an EventBridge rule delivering the emulator's "Batch Job
State Change" events to an SQS queue on moto, as ``gpu-provider events render`` describes it,
``[gpu_provider] batch_events_queue_url`` set, and ``worker_wait_events`` on: the sync task listens), in the same
run, as extra rows.

Usage: ``python benchmarks/recovery.py [--quick] [--interruptions K] [--events]``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._anchor_env import aws_env  # noqa: E402
from benchmarks._dagrun import airflow_env, migrate, run_dag  # noqa: E402

OURS = """
from datetime import datetime
from airflow.sdk import DAG
from gpu_provider import Checkpoint, GpuResources, SpotFallback
from gpu_provider.operators import GpuJobOperator

with DAG(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    GpuJobOperator(
        task_id="train",
        backend="batch",
        image="trainer",
        command={command!r},
        resources=GpuResources(gpus=1),
        capacity=SpotFallback(after_preemptions={k}),
        checkpoint=Checkpoint(uri={checkpoints!r}, keep=3),
        poll_interval=2,
        deferrable=False,
        retries=0,
    )
"""

ANCHOR = """
from datetime import datetime, timedelta
from airflow.providers.amazon.aws.operators.batch import BatchOperator
from airflow.sdk import DAG

with DAG(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    BatchOperator(
        task_id="train",
        job_name={dag_id!r},
        job_definition="bench-train",
        job_queue={queue!r},
        container_overrides={{"command": {command!r}}},
        deferrable=False,
        retries={k},
        retry_delay=timedelta(seconds=5),
    )
"""

_START = re.compile(r"\[rank 0\] (?:starting from step 0|resumed from checkpoint \S+ \(step (\d+) of (\d+)\))")
_STOP = re.compile(r"\[rank 0\] stop requested at step (\d+)")
_PROGRESS = re.compile(r"\[rank 0\] (?:epoch \d+ )?step (\d+)")
_DONE = re.compile(r"\[rank 0\] done: (\d+) steps")


def steps_of(lines: list[str]) -> tuple[int, int]:
    """(first step, last step reached) of one job from its log: where it started, where it stopped or ended."""
    start, end = 0, 0
    for line in lines:
        if m := _START.search(line):
            start = end = int(m.group(1) or 0)
        elif (m := _STOP.search(line)) or (m := _DONE.search(line)):
            end = int(m.group(1))
        elif m := _PROGRESS.search(line):
            end = max(end, int(m.group(1)))
    return start, end


_NOTICE = re.compile(r"gpu_provider: SIG[A-Z]+ received; stopping")


def events_queue(client: Any, name: str) -> str:
    """An SQS queue fed by the EventBridge rule ``gpu-provider events render`` prints, on the emulator's moto."""
    from gpu_provider.testing.events import wire_event_queue

    return wire_event_queue(client, "batch", name)[0]


def phases(jobs: list[dict[str, Any]], logs: dict[str, list[tuple[float, str]]]) -> list[dict[str, float]]:
    """Per interruption (each job after the first, oldest first): where the time between the interrupted job
    and its successor's first step went, in seconds (see the module docstring)."""
    out = []
    jobs = sorted(jobs, key=lambda j: j["createdAt"])
    for before, after in itertools.pairwise(jobs):
        ended, created = before["stoppedAt"] / 1000, after["createdAt"] / 1000
        started = (after.get("startedAt") or after["createdAt"]) / 1000
        notice = next((t for t, line in logs[before["jobId"]] if _NOTICE.search(line)), None)
        first = next((t for t, line in logs[after["jobId"]] if _START.search(line)), None)
        out.append(
            {
                "notice_to_end": ended - notice if notice is not None else float("nan"),
                "end_to_submit": created - ended,
                "queue_to_running": started - created,
                "start_to_first_step": first - started if first is not None else float("nan"),
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one interruption with notice, a shorter training")
    parser.add_argument("--interruptions", type=int, default=None, help="K (default 2, --quick 1)")
    parser.add_argument("--after", type=float, default=None, help="seconds after RUNNING (default 9, --quick 6)")
    parser.add_argument("--step-delay", type=float, default=None, help="default 0.1, --quick 0.05")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--events", action="store_true", help="ours also with the Batch events on (extra rows)")
    args = parser.parse_args()
    k = args.interruptions or (1 if args.quick else 2)
    after = args.after or (6.0 if args.quick else 9.0)
    step_delay = args.step_delay or (0.05 if args.quick else 0.1)
    kinds = ["with notice"] if args.quick else ["with notice", "without notice"]
    logging.getLogger("gpu_provider.testing.emulators").setLevel(logging.WARNING)

    from gpu_provider.testing.emulators.aws_batch import BatchEmulator

    with tempfile.TemporaryDirectory(prefix="gpu-bench-recovery-") as tmp, BatchEmulator(job_cwd=REPO) as emulator:
        root = Path(tmp)
        setup = emulator.create_environment(fair_share=False)
        batch, logs = emulator.client("batch"), emulator.client("logs")
        batch.register_job_definition(
            jobDefinitionName="bench-train",
            type="container",
            containerProperties={"image": "trainer", "vcpus": 1, "memory": 1024, "command": ["true"]},
        )
        env = airflow_env(
            root / "airflow",
            {
                **aws_env(emulator.endpoint_url, emulator.region),
                "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": setup.spot_queue,
                "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": setup.on_demand_queue,
            },
        )
        migrate(env)
        data = (root / "data").as_uri()
        preprocess = ["-m", "gpu_provider.examples.preprocess", "--start", "2026-01-05", "--end", "2026-01-12", "--out"]
        subprocess.run(
            [sys.executable, *preprocess, data],
            env=env,
            check=True,
            capture_output=True,
        )
        total_steps = 200
        results: dict[tuple[str, str], dict[str, Any]] = {}

        def run(side: str, kind: str, n: int) -> dict[str, Any]:
            label = f"{side}_{kind.replace(' ', '_')}_{n}"
            run_env = env
            if side == "ours_events":
                queue_url = events_queue(emulator.client, f"bench-events-{kind.replace(' ', '-')}-{n}")
                run_env = {
                    **env,
                    "AIRFLOW__GPU_PROVIDER__BATCH_EVENTS_QUEUE_URL": queue_url,
                    "AIRFLOW__GPU_PROVIDER__WORKER_WAIT_EVENTS": "True",  # the sync task listens (opt-in)
                    # ReceiveMessage waits at most 1 s (moto answers a long poll when it ends): a reader that
                    # goes away is not left blocked for 20 s
                    "AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS": "1",
                }
            dag_id = f"recovery_{label}"
            command = [
                "python",
                "-m",
                "gpu_provider.examples.train",
                "--data",
                data,
                "--out",
                (root / label / "model").as_uri(),
                "--epochs",
                "4",
                "--step-delay",
                f"{step_delay:g}",
                "--checkpoint-every",
                str(args.checkpoint_every),
            ]
            template = ANCHOR if side == "anchor" else OURS
            text = template.format(
                dag_id=dag_id,
                command=command,
                k=max(k, 1),
                checkpoints=(root / label / "ckpt").as_uri(),
                queue=setup.spot_queue,
            )
            dag_file = root / "airflow" / "dags" / f"{dag_id}.py"
            dag_file.write_text(text)
            emulator.reset_faults()
            emulator.grace_period = 5.0 if kind != "without notice" else 0.0
            if n:
                emulator.preempt_after(after, queue=setup.spot_queue, count=n)
            since = time.time()
            result = run_dag(dag_file, dag_id, run_env)
            if result["tasks"]["train"]["state"] != "success":
                raise RuntimeError(f"{dag_id}: train ended {result['tasks']['train']}: {result['log'][-3000:]}")
            jobs = []
            for queue in (setup.spot_queue, setup.on_demand_queue):
                for status in ("SUCCEEDED", "FAILED"):
                    for summary in batch.list_jobs(jobQueue=queue, jobStatus=status)["jobSummaryList"]:
                        if summary["createdAt"] / 1000 >= since - 1:
                            jobs.append(summary["jobId"])
            described = batch.describe_jobs(jobs=jobs)["jobs"] if jobs else []
            ran = 0
            timed: dict[str, list[tuple[float, str]]] = {}
            for job in described:
                stream = job["container"].get("logStreamName")
                lines = []
                timed[job["jobId"]] = []
                if stream:
                    events = logs.get_log_events(
                        logGroupName="/aws/batch/job", logStreamName=stream, startFromHead=True
                    )
                    lines = [e["message"] for e in events["events"]]
                    timed[job["jobId"]] = [(e["timestamp"] / 1000, e["message"]) for e in events["events"]]
                first, last = steps_of(lines)
                ran += last - first
            created = min(j["createdAt"] for j in described) / 1000
            ended = max(j["stoppedAt"] for j in described) / 1000
            row = {
                "jobs": len(described),
                "steps_run": ran,
                "redone": ran - total_steps,
                "wall": ended - created,
                "tries": result["tasks"]["train"]["try_number"],
                "phases": phases(described, timed),
            }
            print(f"  {side} {kind} {n} interruption(s): {row}", flush=True)
            return row

        sides = ["ours", "anchor"] + (["ours_events"] if args.events else [])
        started = time.monotonic()
        for side in sides:  # the uninterrupted runs
            results[(side, "none")] = run(side, "none", 0)
        for kind in kinds:
            for side in sides:
                results[(side, kind)] = run(side, kind, k)
        elapsed = time.monotonic() - started
    interval = args.checkpoint_every * step_delay
    print(
        f"Figure 4, recovery loss: training of {total_steps} steps x {step_delay:g} s, checkpoint every "
        f"{args.checkpoint_every} steps ({interval:g} s), {k} interruption(s) {after:g} s after each spot job "
        f"starts, AWS Batch emulator, {elapsed:.0f} s"
    )
    print(
        "| interruption | side | jobs | Airflow tries | steps run | steps redone per interruption | wall s "
        "| wall lost per interruption s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    names = {
        "ours": "ours: SpotFallback + Checkpoint",
        "anchor": "BatchOperator, retry from scratch",
        "ours_events": "ours, Batch events on",
    }
    for side in sides:
        r = results[(side, "none")]
        print(
            f"| none | {names[side]} | {r['jobs']:.0f} | {r['tries']:.0f} | {r['steps_run']:.0f} | - | "
            f"{r['wall']:.1f} | - |"
        )
    worst = 0.0
    lost_by: dict[tuple[str, str], float] = {}
    for kind in kinds:
        for side in sides:
            r, clean = results[(side, kind)], results[(side, "none")]
            lost = lost_by[(side, kind)] = (r["wall"] - clean["wall"]) / k
            redone = r["redone"] / k
            if side != "anchor":
                worst = max(worst, redone * step_delay)
            print(
                f"| {kind} | {names[side]} | {r['jobs']:.0f} | {r['tries']:.0f} | {r['steps_run']:.0f} | "
                f"{redone:.1f} | {r['wall']:.1f} | {lost:.1f} |"
            )
    print(
        f"target: at most one checkpoint interval ({args.checkpoint_every} steps, {interval:g} s) redone per "
        f"interruption: ours at most {worst / step_delay:.1f} steps ({worst:.1f} s) -> "
        f"{'met' if worst <= interval else 'missed'}"
    )
    print()
    print("Where the time goes per interruption (median of the interruptions of each run, seconds):")
    print("| interruption | side | notice to end | end to next submit | queue to RUNNING | start to first step |")
    print("|---|---|---|---|---|---|")
    for kind in kinds:
        for side in sides:
            if side == "anchor":
                continue
            got = results[(side, kind)]["phases"]
            cells = []
            for key in ("notice_to_end", "end_to_submit", "queue_to_running", "start_to_first_step"):
                values = [p[key] for p in got if p[key] == p[key]]  # NaN: the line was not in the log
                cells.append(f"{statistics.median(values):.2f}" if values else "-")
            print(f"| {kind} | {names[side]} | " + " | ".join(cells) + " |")
    for kind in kinds:
        for side in sides:
            if side == "anchor":
                continue
            # the service's start-up of this run's resumed attempts (their mean, as the loss is a mean too)
            got = [p for p in results[(side, kind)]["phases"] if p["start_to_first_step"] == p["start_to_first_step"]]
            startup = statistics.mean(p["queue_to_running"] + p["start_to_first_step"] for p in got) if got else 0.0
            lost, bound = lost_by[(side, kind)], interval + startup
            print(
                f"target: wall lost per interruption at most one checkpoint interval ({interval:g} s) + the service's "
                f"start-up (queue to RUNNING + start to first step, this run's mean {startup:.2f} s) = {bound:.2f} s: "
                f"{names[side]}, {kind}: {lost:.1f} s -> {'met' if lost <= bound else 'missed'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
