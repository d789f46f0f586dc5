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

Usage: ``python benchmarks/recovery.py [--quick] [--interruptions K]``.
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one interruption with notice, a shorter training")
    parser.add_argument("--interruptions", type=int, default=None, help="K (default 2, --quick 1)")
    parser.add_argument("--after", type=float, default=None, help="seconds after RUNNING (default 9, --quick 6)")
    parser.add_argument("--step-delay", type=float, default=None, help="default 0.1, --quick 0.05")
    parser.add_argument("--checkpoint-every", type=int, default=20)
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
        results: dict[tuple[str, str], dict[str, float]] = {}

        def run(side: str, kind: str, n: int) -> dict[str, float]:
            label = f"{side}_{kind.replace(' ', '_')}_{n}"
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
            template = OURS if side == "ours" else ANCHOR
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
            result = run_dag(dag_file, dag_id, env)
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
            for job in described:
                stream = job["container"].get("logStreamName")
                lines = []
                if stream:
                    events = logs.get_log_events(
                        logGroupName="/aws/batch/job", logStreamName=stream, startFromHead=True
                    )
                    lines = [e["message"] for e in events["events"]]
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
            }
            print(f"  {side} {kind} {n} interruption(s): {row}", flush=True)
            return row

        started = time.monotonic()
        for side in ("ours", "anchor"):  # the uninterrupted runs
            results[(side, "none")] = run(side, "none", 0)
        for kind in kinds:
            for side in ("ours", "anchor"):
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
    names = {"ours": "ours: SpotFallback + Checkpoint", "anchor": "BatchOperator, retry from scratch"}
    for side in ("ours", "anchor"):
        r = results[(side, "none")]
        print(
            f"| none | {names[side]} | {r['jobs']:.0f} | {r['tries']:.0f} | {r['steps_run']:.0f} | - | "
            f"{r['wall']:.1f} | - |"
        )
    worst = 0.0
    for kind in kinds:
        for side in ("ours", "anchor"):
            r, clean = results[(side, kind)], results[(side, "none")]
            lost = (r["wall"] - clean["wall"]) / k
            redone = r["redone"] / k
            if side == "ours":
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
