"""`make demo`: run the example pipeline end to end and say what happened.

It uses a fresh, temporary Airflow home under ``.demo/`` (SQLite metadata DB), runs
``dags/gpu_ml_pipeline.py`` with ``dag.test()`` with one spot interruption during training, shows
the key moments as they happen, and ends with a summary per stage read from the tasks' XCom results.

``--backend local`` (the default) runs the jobs as local processes and simulates the interruption.
``--backend batch`` runs every stage as an AWS Batch job against a local Batch emulator (moto in
server mode, ``gpu_provider/testing/emulators/aws_batch.py``) that this script starts and stops: its job containers
run as local processes, and the first spot training job's host is "reclaimed" 4 s after it starts,
so the job ends ``Host EC2 (instance i-...) terminated.`` and is resubmitted to the on-demand queue.
``--backend sagemaker`` runs every stage as a SageMaker training job against a local SageMaker
emulator (``gpu_provider/testing/emulators/aws_sagemaker.py``): training runs on 2 instances on managed spot, the spot
instances are reclaimed 3 s into training (SageMaker-style, an ``Interrupted`` transition), the task
stops the job and the next attempt runs on-demand, resuming from the checkpoint synced to S3.
``--backend kubernetes`` runs every stage as a pod against a local fake Kubernetes API server
(``gpu_provider/testing/emulators/kubernetes.py``, whose nodes stand in for Karpenter's): training is a 2-node indexed
job on spot, one of its nodes is reclaimed 4 s after it starts (``DisruptionTarget``), and the next
attempt runs on on-demand, resuming from the checkpoint. With ``--cluster`` (and ``KUBECONFIG`` set)
it runs against that cluster instead; it says which.
``--backend aws`` mixes the AWS backends in one DAG run: preprocessing and inference run as AWS Batch
jobs (the Batch emulator, on the ``aws_batch`` connection through ``[gpu_provider] batch_aws_conn_id``)
while training (2 instances, managed spot, one interruption, the resume on-demand) and the evaluation
of its checkpoints run as SageMaker training jobs (the SageMaker emulator, on ``aws_default``, whose S3
holds the checkpoints). Each emulator is its own child process with its own moto server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / ".demo"
STAGES = ("preprocess", "train", "evaluate", "batch_inference")

# Lines of the Airflow log worth showing live (the rest goes to .demo/airflow.log).
_SHOW = re.compile(
    r"Submitted \w+ job|Reattaching|ended PREEMPTED|ended FAILED|ended CANCELLED|SUCCEEDED after|resubmitting on|"
    r"restarted by the service|"
    r"\[job\].*(resumed from|starting from step|stop requested|final|accuracy|rows)",
    re.IGNORECASE,
)
_TS_PREFIX = re.compile(r"^.*?(?=(Submitted|Reattaching|\[job\]|\w+ job gp-))")
_SUFFIX = re.compile(r"(; env keys:.*|\s+\[airflow\.[^\]]*\].*)$")


def _environment(backend: str, emulator: dict[str, Any] | None = None) -> dict[str, str]:
    if backend == "aws":
        return _mixed_aws_environment(_base_environment(backend), emulator)
    if backend == "kubernetes":
        return _kubernetes_environment(_base_environment(backend), emulator)
    return _aws_environment(_base_environment(backend), emulator)


def _kubernetes_environment(env: dict[str, str], emulator: dict[str, Any] | None) -> dict[str, str]:
    kubeconfig = emulator["kubeconfig"] if emulator is not None else os.environ["KUBECONFIG"].split(os.pathsep)[0]
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}}
    env.update(
        {
            "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(connection),
            "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "1",
            # inference and evaluation share one GPU: a MIG slice (the emulator grants any resource)
            "AIRFLOW__GPU_PROVIDER__KUBERNETES_FRACTIONAL_GPU_RESOURCE": os.environ.get(
                "AIRFLOW__GPU_PROVIDER__KUBERNETES_FRACTIONAL_GPU_RESOURCE", "nvidia.com/mig-1g.10gb"
            ),
            "GPU_PIPELINE_IMAGE": os.environ.get("GPU_PIPELINE_IMAGE", "gpu-pipeline:demo"),
        }
    )
    return env


def _base_environment(backend: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(DEMO / "airflow-home"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(DEMO / "local-jobs"),
            "GPU_PIPELINE_DATA_ROOT": "file://" + str(DEMO / "data"),
            "GPU_DEMO_BACKEND": backend,
            "GPU_PIPELINE_BACKEND": backend,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _aws_environment(env: dict[str, str], emulator: dict[str, Any] | None) -> dict[str, str]:
    if emulator is not None:
        connection = {
            "conn_type": "aws",
            "extra": {"endpoint_url": emulator["endpoint_url"], "region_name": emulator["region"]},
        }
        env.update(
            {
                "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection),
                "AWS_ACCESS_KEY_ID": "demo",
                "AWS_SECRET_ACCESS_KEY": "demo",
                "AWS_DEFAULT_REGION": emulator["region"],
                "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": emulator.get("spot_queue", ""),
                "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": emulator.get("on_demand_queue", ""),
                "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "1",
                "GPU_PIPELINE_IMAGE": "gpu-pipeline:demo",
            }
        )
    if emulator is not None and env["GPU_DEMO_BACKEND"] in ("sagemaker", "aws"):
        env.update(
            {
                "AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN": emulator["role_arn"],
                "AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH": "s3://gpu-demo-models/models",
                "GPU_PIPELINE_CHECKPOINT_ROOT": "s3://gpu-demo-checkpoints/gpu_pipeline",
            }
        )
    return env


def _mixed_aws_environment(env: dict[str, str], emulators: dict[str, Any] | None) -> dict[str, str]:
    """``--backend aws``: SageMaker on ``aws_default`` (its S3 holds the checkpoints the sensor and the
    evaluation read), Batch on its own connection ``aws_batch``; the stages are shaped for SageMaker."""
    assert emulators is not None
    env = _aws_environment(env, emulators["sagemaker"])
    batch = emulators["batch"]
    connection = {"conn_type": "aws", "extra": {"endpoint_url": batch["endpoint_url"], "region_name": batch["region"]}}
    env.update(
        {
            "AIRFLOW_CONN_AWS_BATCH": json.dumps(connection),
            "AIRFLOW__GPU_PROVIDER__BATCH_AWS_CONN_ID": "aws_batch",
            "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": batch["spot_queue"],
            "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": batch["on_demand_queue"],
            "GPU_PIPELINE_BACKEND": "sagemaker",
        }
    )
    return env


#: the backend of each stage per demo backend (``aws``: Batch around SageMaker training)
_STAGE_BACKENDS = {"aws": {"preprocess": "batch", "train": "sagemaker", "evaluate": "sagemaker", "infer": "batch"}}


class _MixedEmulators:
    """``--backend aws``: the Batch and the SageMaker emulators, each a child process."""

    def __init__(self) -> None:
        self.batch = _batch_emulator(name="batch-emulator")
        try:
            self.sagemaker = _sagemaker_emulator(name="sagemaker-emulator")
        except BaseException:
            self.batch.stop()
            raise
        self.info = {"batch": self.batch.info, "sagemaker": self.sagemaker.info}

    def stop(self) -> None:
        try:
            self.sagemaker.stop()
        finally:
            self.batch.stop()


class _ChildEmulator:
    """An emulator as a child process that writes a ready file; echoes the lines worth showing."""

    def __init__(self, name: str, argv: list[str], *, label: str, show: tuple[str, ...], logger: str) -> None:
        ready = DEMO / f"{name}.json"
        self.log_path = DEMO / f"{name}.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *argv, "--ready-file", str(ready)],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {label} emulator did not start; see {self.log_path}")
            time.sleep(0.1)
        self.info: dict[str, Any] = json.loads(ready.read_text())
        self._label, self._show, self._logger = label, show, logger
        self._tail = threading.Thread(target=self._echo, daemon=True)
        self._tail.start()

    def _echo(self) -> None:
        """Echo what the service itself saw of interruptions and failures, as they happen."""
        with self.log_path.open() as log:
            while self.proc.poll() is None:
                line = log.readline()
                if not line:
                    time.sleep(0.2)
                    continue
                if any(marker in line for marker in self._show):
                    text = line.split(self._logger, 1)[-1].split("[gpu_provider.testing.emulators.", 1)[0].strip()
                    text = re.sub(r"^\S+Z \[\w+\s*\] ", "", text)
                    # the job runners' lines: "<date> <time> gpu_provider.testing.emulators.<module> ..."
                    text = re.sub(r"^\S+ \S+ gpu_provider\.testing\.emulators\.\w+ ", "", text)
                    print(f"  [{self._label.lower()} emulator] {text}", flush=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()


def _batch_emulator(name: str = "emulator") -> _ChildEmulator:
    """The AWS Batch emulator, for ``--backend batch``: the first spot training job's host is reclaimed."""
    argv = [
        "gpu_provider.testing.emulators.aws_batch",
        "serve",
        "--port",
        "0",
        "--job-cwd",
        str(REPO),
        "--preempt-after",
        "4",
    ]
    argv += ["--preempt-queue", "gpu-spot", "--preempt-name-contains=-train-"]
    return _ChildEmulator(name, argv, label="Batch", show=(" preempted: ", "-> FAILED"), logger=" __main__ ")


def _sagemaker_emulator(name: str = "emulator") -> _ChildEmulator:
    """The SageMaker emulator, for ``--backend sagemaker``: the spot training instances are reclaimed 3 s in."""
    argv = ["gpu_provider.testing.emulators.aws_sagemaker", "serve", "--port", "0", "--job-cwd", str(REPO)]
    argv += ["--job-root", str(DEMO / "sagemaker-jobs")]
    argv += ["--bucket", "gpu-demo-models", "--bucket", "gpu-demo-checkpoints"]
    argv += ["--step-seconds", "0.5", "--interrupt-after", "3", "--interrupt-name-contains=-train-"]
    show = ("spot interruption", "ended Failed", "ended Stopped", "/Interrupted")
    return _ChildEmulator(name, argv, label="SageMaker", show=show, logger=" __main__ ")


def _kubernetes_emulator() -> _ChildEmulator:
    """The fake Kubernetes API server, for ``--backend kubernetes``: one spot training node is reclaimed."""
    argv = [
        "gpu_provider.testing.emulators.kubernetes",
        "serve",
        "--kubeconfig",
        str(DEMO / "kubeconfig"),
        "--job-cwd",
        str(REPO),
    ]
    argv += ["--reclaim-after", "4", "--reclaim-name-contains=-train-"]
    return _ChildEmulator(
        "kubernetes-emulator", argv, label="Kubernetes", show=("reclaimed spot node",), logger=" __main__ "
    )


def _run_child(env: dict[str, str], log_path: Path) -> int:
    """Run the DAG in a child process (Airflow reads its config at import), echoing key lines."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if _SHOW.search(line):
                print("  " + _SUFFIX.sub("", _TS_PREFIX.sub("", line.rstrip()))[:400], flush=True)
        return proc.wait()


def _child() -> None:
    """Inside the child: migrate the DB, create the team pool, run the DAG, dump the XComs."""
    from airflow.utils.db import initdb  # noqa: F401  (fails early if Airflow is broken)

    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)

    from airflow.models.pool import Pool
    from airflow.models.xcom import XComModel
    from airflow.sdk import timezone
    from airflow.utils.session import create_session

    Pool.create_or_update_pool("gpu_research", slots=8, description="GPUs of team research", include_deferred=True)

    sys.path.insert(0, str(REPO / "dags"))
    import gpu_ml_pipeline

    backend = os.environ["GPU_DEMO_BACKEND"]
    stages = _STAGE_BACKENDS.get(backend, dict.fromkeys(("preprocess", "train", "evaluate", "infer"), backend))
    conf = {
        **{f"{stage}_backend": name for stage, name in stages.items()},
        "epochs": 4,
        "step_delay": 0.05,
        "simulate_preemption_after": "4",
    }
    dr = gpu_ml_pipeline.dag.test(logical_date=timezone.utcnow(), run_conf=conf)
    results: dict[str, Any] = {"state": str(dr.state), "run_id": dr.run_id, "stages": {}}
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            row = (
                session.query(XComModel)
                .filter_by(dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, key="return_value")
                .one_or_none()
            )
            value = XComModel.deserialize_value(row) if row is not None else None
            results["stages"][ti.task_id] = {"state": str(ti.state), "try_number": ti.try_number, "result": value}
    (DEMO / "result.json").write_text(json.dumps(results, indent=2, default=str))


def _step(uri: str | None) -> str:
    if not uri:
        return "step 0 (fresh start)"
    match = re.search(r"ckpt-(\d+)", uri)
    return f"checkpoint step {int(match.group(1))}" if match else uri


def _summary(results: dict[str, Any]) -> bool:
    print()
    print(f"Pipeline run {results['run_id']}: {results['state']}")
    ok = True
    for stage in STAGES:
        info = results["stages"].get(stage)
        if info is None:
            print(f"\n  {stage}: did not run")
            ok = False
            continue
        result = info["result"] or {}
        on = f" on {result['backend']}" if result.get("backend") else ""
        print(f"\n  {stage}{on}: {info['state']} (Airflow try {info['try_number']})")
        if not result:
            ok = False
            continue
        for a in result["attempts"]:
            reason = f" - {a['reason']}" if a.get("reason") else ""
            reason = (f" queue {a['queue']}" if a.get("queue") else "") + reason
            if a.get("restarts"):
                reason = f" - interrupted {a['restarts']}x inside the job (restarted by the service){reason}"
            if a.get("billable_seconds") is not None:
                saving = f" (spot saving {a['spot_saving_pct']:.0f}%)" if a.get("spot_saving_pct") is not None else ""
                reason = f"; billable {a['billable_seconds']:.0f}s{saving} on {a.get('instance_type')}" + reason
            start = f"resumed from {_step(a.get('resume_from'))}" if result.get("checkpoint_uri") else "no checkpoint"
            print(
                f"    attempt {a['attempt']}: {a['capacity']:<9} {a['state']:<9} "
                f"{start}; {a['gpu_seconds']:.1f} GPU-s{reason}"
            )
        print(f"    GPU-seconds: {result['gpu_seconds']:.1f}   output: {result.get('output_uri')}")
        ok = ok and info["state"].endswith("success")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--cluster", action="store_true", help="--backend kubernetes: run against the cluster of $KUBECONFIG"
    )
    args = parser.parse_args()
    if args.child:
        _child()
        return 0
    if args.backend not in ("local", "batch", "sagemaker", "kubernetes", "aws"):
        print(
            f"make demo BACKEND={args.backend}: the demo runs on 'local', 'batch', 'sagemaker', 'kubernetes' or "
            "'aws' (Batch and SageMaker in one run).",
            file=sys.stderr,
        )
        return 2
    if args.cluster and (args.backend != "kubernetes" or not os.environ.get("KUBECONFIG")):
        print("--cluster runs the kubernetes demo against the cluster of $KUBECONFIG: set both.", file=sys.stderr)
        return 2
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True)
    log_path = DEMO / "airflow.log"
    started = time.monotonic()
    emulator: Any = None
    if args.backend == "batch":
        print("airflow-provider-gpu demo: gpu_ml_pipeline on AWS Batch (a local emulator: moto server, jobs run here)")
        print("  preprocess -> train (1 node, spot queue with on-demand fallback; the spot host is reclaimed 4 s in)")
        print("  -> inference (spot queue)")
        emulator = _batch_emulator()
        print(f"  Batch emulator at {emulator.info['endpoint_url']}: queues {emulator.info['spot_queue']} (spot), ")
        print(f"  {emulator.info['on_demand_queue']} (on-demand); its log: {emulator.log_path.relative_to(REPO)}")
    elif args.backend == "sagemaker":
        print("airflow-provider-gpu demo: gpu_ml_pipeline on SageMaker (a local emulator: hosts run here, S3 on moto)")
        print("  preprocess -> train (2 instances, managed spot with on-demand fallback; the spot instances are")
        print("  reclaimed 3 s into training) -> inference; evaluation of each checkpoint from S3 while it trains")
        emulator = _sagemaker_emulator()
        print(
            f"  SageMaker emulator at {emulator.info['endpoint_url']}; its log: {emulator.log_path.relative_to(REPO)}"
        )
    elif args.backend == "aws":
        print("airflow-provider-gpu demo: gpu_ml_pipeline on AWS Batch and SageMaker in one run (two local emulators)")
        print("  preprocess on Batch -> train on SageMaker (2 instances, managed spot with on-demand fallback; the")
        print("  spot instances are reclaimed 3 s into training) -> inference on Batch; evaluation on SageMaker")
        emulator = _MixedEmulators()
        print(f"  Batch emulator at {emulator.info['batch']['endpoint_url']} (connection aws_batch), SageMaker")
        print(f"  emulator at {emulator.info['sagemaker']['endpoint_url']} (aws_default); logs under .demo/")
    elif args.backend == "kubernetes" and args.cluster:
        print(
            "airflow-provider-gpu demo: gpu_ml_pipeline on the Kubernetes cluster of "
            f"KUBECONFIG={os.environ['KUBECONFIG']}"
        )
        print("  (a real cluster: no interruption is injected; Karpenter and the NodePools of docker/karpenter decide)")
    elif args.backend == "kubernetes":
        print(
            "airflow-provider-gpu demo: gpu_ml_pipeline on Kubernetes "
            "(a local emulator: fake API server, pods run here)"
        )
        print("  preprocess -> train (2-node indexed job on spot; one spot node is reclaimed 4 s in) -> inference")
        emulator = _kubernetes_emulator()
        print(f"  Kubernetes emulator at {emulator.info['url']}, kubeconfig {emulator.info['kubeconfig']};")
        print(f"  its log: {emulator.log_path.relative_to(REPO)}")
    else:
        print("airflow-provider-gpu demo: gpu_ml_pipeline on the local backend")
        print("  preprocess -> train (2 nodes, spot with on-demand fallback, one simulated interruption) -> inference")
        emulator = None
    print(f"  Airflow home and data under {DEMO.relative_to(REPO)}/, full log in {log_path.relative_to(REPO)}\n")
    try:
        rc = _run_child(_environment(args.backend, emulator.info if emulator else None), log_path)
    finally:
        if emulator is not None:
            emulator.stop()
    result_file = DEMO / "result.json"
    if rc != 0 or not result_file.exists():
        print(f"\nThe demo failed (exit {rc}); last lines of {log_path}:", file=sys.stderr)
        print("".join(log_path.read_text().splitlines(keepends=True)[-40:]), file=sys.stderr)
        return 1
    ok = _summary(json.loads(result_file.read_text()))
    print(f"\nDone in {time.monotonic() - started:.0f}s.")
    return 0 if ok else 1


if __name__ == "__main__":
    threading.current_thread().name = "demo"
    sys.exit(main())
