"""Figure 5, launch overhead: from ``execute()`` to the job's process running (local) or to the submit call (remote).

Real Airflow tasks (``dag.test()`` in a child process, ``benchmarks/_dagrun.py``); every operator is a
subclass that only notes the time when its ``execute()`` begins, then runs the operator's own
``execute()``. The end mark:

- **local**: ``GpuJobOperator(backend="local")`` vs ``BashOperator`` (Airflow's way to run a process
  on the worker): the job's command is ``sh -c 'date +%s.%N >> FILE'``, so the end is the moment the
  user's process runs; ``ours_spawn`` is ours with ``[gpu_provider] local_fork_server = false`` (each
  job's supervisor a new interpreter, as before the fork server);
- **batch**: ``GpuJobOperator(backend="batch")`` vs ``BatchOperator``: the SubmitJob request's arrival
  at the Batch emulator;
- **sagemaker**: ``GpuJobOperator(backend="sagemaker")`` vs ``SageMakerTrainingOperator``: the
  CreateTrainingJob request's arrival at the SageMaker emulator;
- **kubernetes**: ``GpuJobOperator(backend="kubernetes")`` vs ``KubernetesPodOperator`` (its pod's
  create request) and ``KubernetesJobOperator`` (its Job's create request) at the fake API server.

Per backend, two child processes run the same tasks in opposite orders (ours first, then the anchor
first), R of each: the first task of a process pays the imports of its operator's clients (a cold
start, as a task in a fresh worker process does); the others are warm. Reported: the cold figure (the
first task of the process in which that side ran first; none for a third side, on Kubernetes) and the
median of the warm ones. Locally the first process finds no fork server (ours spawns its supervisor and
starts the server), so a third process runs ours first again: its first task is the cold figure of a task
process on a host whose fork server runs, as every task after the first in a deployment.

Usage: ``python benchmarks/launch.py [--quick] [--repeat R] [--backends local batch sagemaker kubernetes]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._anchor_env import aws_env, kubernetes_env  # noqa: E402
from benchmarks._dagrun import airflow_env, migrate, run_dag  # noqa: E402

HEADER = """
import time
from datetime import datetime, timedelta
from pathlib import Path
from airflow.sdk import DAG

MARKS = Path({marks!r})


def timed(cls):
    class Timed(cls):
        def execute(self, context):
            with MARKS.open("a") as f:
                f.write(f"{{self.task_id}} {{time.time()}}\\n")
            return super().execute(context)

    Timed.__name__ = "Timed" + cls.__name__
    return Timed

"""

# per backend: (import lines, ours task, anchor tasks {label: code}); {i} is the repetition, {job} the job marks file
OURS_TASK = (
    "timed(GpuJobOperator)(task_id='ours_{i}', backend={backend!r}, image='x', command={command}, "
    "capacity='on-demand', poll_interval=1, deferrable=False)"
)
ANCHORS: dict[str, tuple[str, dict[str, str]]] = {
    "local": (
        "from airflow.providers.standard.operators.bash import BashOperator\n\n\n"
        "class SpawnGpuJobOperator(GpuJobOperator):\n"
        "    # ours with [gpu_provider] local_fork_server = false: the supervisor spawned as a new interpreter\n"
        "    def execute(self, context):\n"
        "        import os\n"
        "        os.environ['AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER'] = 'false'\n"
        "        try:\n"
        "            return super().execute(context)\n"
        "        finally:\n"
        "            del os.environ['AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER']\n",
        {
            "BashOperator": "timed(BashOperator)(task_id='BashOperator_{i}', bash_command={bash!r})",
            "ours_spawn": "timed(SpawnGpuJobOperator)(task_id='ours_spawn_{i}', backend='local', image='x', "
            "command=['sh', '-c', {bash!r}], capacity='on-demand', poll_interval=1, deferrable=False)",
        },
    ),
    "batch": (
        "from airflow.providers.amazon.aws.operators.batch import BatchOperator",
        {
            "BatchOperator": "timed(BatchOperator)(task_id='BatchOperator_{i}', job_name='launch-{i}', "
            "job_definition='bench-launch', job_queue={queue!r}, container_overrides={{'command': ['true']}}, "
            "wait_for_completion=False, deferrable=False)"
        },
    ),
    "sagemaker": (
        "from airflow.providers.amazon.aws.operators.sagemaker import SageMakerTrainingOperator",
        {
            "SageMakerTrainingOperator": "timed(SageMakerTrainingOperator)(task_id='SageMakerTrainingOperator_{i}', "
            "config={sm_config}, wait_for_completion=False, deferrable=False)"
        },
    ),
    "kubernetes": (
        "from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator\n"
        "from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator",
        {
            "KubernetesPodOperator": "timed(KubernetesPodOperator)(task_id='KubernetesPodOperator_{i}', "
            "name='kpo-{i}', image='x', cmds=['true'], get_logs=False, deferrable=False, "
            "base_container_name='main', execution_timeout=timedelta(seconds=30))",
            "KubernetesJobOperator": "timed(KubernetesJobOperator)(task_id='KubernetesJobOperator_{i}', "
            "name='kjo-{i}', image='x', cmds=['true'], wait_until_job_complete=False, deferrable=False)",
        },
    ),
}
SUBMIT = {"batch": "SubmitJob", "sagemaker": "CreateTrainingJob"}


@contextmanager
def emulated(kind: str, root: Path) -> Iterator[tuple[dict[str, str], dict[str, Any], Callable[[], list[Any]]]]:
    """The backend's emulator: the tasks' environment, template values, and its request log."""
    if kind == "local":
        yield {"AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(root / "local-jobs")}, {}, list
        return
    if kind == "batch":
        from gpu_provider.testing.emulators.aws_batch import BatchEmulator

        with BatchEmulator(job_cwd=REPO) as emulator:
            setup = emulator.create_environment(fair_share=False)
            emulator.client("batch").register_job_definition(
                jobDefinitionName="bench-launch",
                type="container",
                containerProperties={"image": "x", "vcpus": 1, "memory": 512, "command": ["true"]},
            )
            env = aws_env(emulator.endpoint_url, emulator.region)
            env["AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE"] = setup.spot_queue
            env["AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE"] = setup.on_demand_queue
            yield env, {"queue": setup.on_demand_queue}, emulator.requests
        return
    if kind == "sagemaker":
        from gpu_provider.testing.emulators.aws_sagemaker import ROLE_ARN, SageMakerEmulator

        with SageMakerEmulator(job_root=root / "sm", job_cwd=REPO) as emulator:
            emulator.create_bucket("bench-models")
            env = aws_env(emulator.endpoint_url, emulator.region)
            env["AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN"] = ROLE_ARN
            env["AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH"] = "s3://bench-models/out"
            config = {
                "TrainingJobName": "launch-{{ ti.task_id | replace('_', '-') }}",
                "AlgorithmSpecification": {
                    "TrainingImage": "x",
                    "TrainingInputMode": "File",
                    "ContainerEntrypoint": ["true"],  # the emulator runs no image's default command
                },
                "RoleArn": ROLE_ARN,
                "OutputDataConfig": {"S3OutputPath": "s3://bench-models/out"},
                "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
                "StoppingCondition": {"MaxRuntimeInSeconds": 600},
            }
            yield env, {"sm_config": repr(config)}, emulator.requests
            emulator.stop_all("benchmark done")
        return
    from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator

    with KubernetesEmulator(job_cwd=REPO) as emulator:
        yield kubernetes_env(emulator.kubeconfig(root / "kubeconfig")), {}, emulator.requests
        emulator.reset()


def _dag(kind: str, dag_id: str, order: list[str], repeat: int, marks: Path, jobs: Path, values: dict[str, Any]) -> str:
    """A DAG of ``repeat`` rounds, each side once per round in ``order``, chained so they run one by one."""
    imports, anchors = ANCHORS[kind]
    bash = f"date +%s.%N | sed 's/^/job /' >> {jobs}"
    lines = [HEADER.format(marks=str(marks)), "from gpu_provider.operators import GpuJobOperator", imports, ""]
    lines.append(f"with DAG(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:")
    lines.append("    chain = []")
    for i in range(repeat):
        for side in order:
            if side == "ours":
                code = OURS_TASK.format(
                    i=i, backend=kind, command=repr(["sh", "-c", bash] if kind == "local" else ["true"])
                )
            else:
                code = anchors[side].format(i=i, bash=bash, **values)
            lines.append(f"    chain.append({code})")
    lines.append("    for a, b in zip(chain, chain[1:]):\n        b.trigger_rule = 'all_done'\n        a >> b")
    return "\n".join(lines) + "\n"


def measure(kind: str, repeat: int, root: Path) -> dict[str, dict[str, Any]]:
    """Per side: the cold figure and the warm ones, in seconds."""
    anchors = list(ANCHORS[kind][1])
    out: dict[str, dict[str, Any]] = {side: {"cold": None, "warm": []} for side in ["ours", *anchors]}
    with emulated(kind, root) as (extra, values, requests):
        env = airflow_env(root / "airflow", extra)
        migrate(env)
        orders = [["ours", *anchors], [*anchors, "ours"]]
        if kind == "local":
            # the first process found no fork server (the host's first launch, or the first after the server's
            # idle exit): its cold figure spawned the supervisor. A third process, ours first again, shows the
            # cold figure of a task process on a host whose fork server runs (every later task's in a deployment)
            orders.append(["ours", *anchors])
        for n, order in enumerate(orders):
            dag_id = f"launch_{kind}_{n}"
            marks, jobs = root / f"{dag_id}.marks", root / f"{dag_id}.jobs"
            dag_file = root / "airflow" / "dags" / f"{dag_id}.py"
            dag_file.write_text(_dag(kind, dag_id, order, repeat, marks, jobs, values))
            before = len(requests())
            result = run_dag(dag_file, dag_id, env)
            # the fake API server reports the first container's status under the name "main" whatever the
            # pod spec calls it, so KubernetesPodOperator gets base_container_name="main" (with its default
            # "base" its sync wait never saw its container complete); should it still hang, its 30 s
            # execution_timeout ends it long after the create request this figure measures: say so, go on
            failed = {t: s for t, s in result["tasks"].items() if s["state"] != "success"}
            for task_id in [t for t in failed if t.startswith("KubernetesPodOperator_")]:
                print(f"  {dag_id}: {task_id} ended {failed.pop(task_id)['state']} (its create request counts)")
            if failed:
                raise RuntimeError(f"{dag_id}: tasks did not succeed: {failed}: {result['log'][-4000:]}")
            starts = [(line.split()[0], float(line.split()[1])) for line in marks.read_text().splitlines()]
            if kind == "local":  # both sides' processes append to the same file, in task order
                ends = [float(line.split()[1]) for line in jobs.read_text().splitlines()]
            else:
                new = requests()[before:]
                ends = [r["time"] for r in new if r["action"] in (SUBMIT.get(kind), "create pods", "create jobs")]
            if len(ends) != len(starts):
                raise RuntimeError(f"{dag_id}: {len(starts)} executes but {len(ends)} launches: {ends}")
            for position, ((task_id, start), end) in enumerate(zip(starts, ends, strict=True)):
                side = task_id.rsplit("_", 1)[0]
                delay = end - start
                if position == 0:
                    out[side]["cold" if n < 2 else "cold_server_up"] = delay
                else:
                    out[side]["warm"].append(delay)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds per process, local and Batch only")
    parser.add_argument("--repeat", type=int, default=None, help="rounds per process (default 3, --quick 2)")
    parser.add_argument("--backends", nargs="+", default=None)
    args = parser.parse_args()
    repeat = args.repeat or (2 if args.quick else 3)
    kinds = args.backends or (["local", "batch"] if args.quick else ["local", "batch", "sagemaker", "kubernetes"])
    logging.getLogger("gpu_provider.testing.emulators").setLevel(logging.WARNING)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-launch-") as tmp:
        for kind in kinds:
            root = Path(tmp, kind)
            root.mkdir()
            results[kind] = measure(kind, repeat, root)
            print(f"  {kind}: {json.dumps(results[kind])}", flush=True)
    elapsed = time.monotonic() - started
    ends = {"local": "user's process runs", "batch": "SubmitJob", "sagemaker": "CreateTrainingJob"}
    print(
        f"Figure 5, launch overhead: {repeat} rounds per process, 2 processes per backend (local: 3), {elapsed:.0f} s"
    )
    print("| backend | until | side | cold (first task in a process) ms | warm median ms | warm max ms | warm x ours |")
    print("|---|---|---|---|---|---|---|")
    for kind, sides in results.items():
        ours = statistics.median(sides["ours"]["warm"])
        for side, r in sides.items():
            warm = statistics.median(r["warm"])
            until = ends.get(kind, "create pod / job")
            cold = "-" if r["cold"] is None else f"{r['cold'] * 1000:.0f}"
            print(
                f"| {kind} | {until} | {side} | {cold} | {warm * 1000:.0f} | "
                f"{max(r['warm']) * 1000:.0f} | {warm / ours:.2f} |"
            )
            if r.get("cold_server_up") is not None:
                cold_up = r["cold_server_up"] * 1000
                print(f"| {kind} | {until} | {side}, fork server running | {cold_up:.0f} | - | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
