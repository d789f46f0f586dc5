"""Figure 1, DAG parse: what a DAG file pays to import our operators vs the anchor operators.

Every case runs in a fresh Python process (as a DAG processor's parse does after a fork: nothing
cached in the process), and the cases are interleaved round by round, so machine load hits all alike:

- ``airflow.sdk``: ``import airflow.sdk``, the floor every Airflow 3 DAG file pays;
- ``gpu_provider``: the floor, then every operator, sensor and spec class a DAG file of ours imports
  (``GpuJobOperator``, ``GpuReaperOperator``, ``GpuJobSensor``, ``CheckpointSensor``,
  ``SpotCapacitySensor``, ``GpuResources``, ``Checkpoint``, ``SpotFallback``);
- one case per anchor: the floor, then ``BatchOperator``, ``SageMakerTrainingOperator``,
  ``KubernetesPodOperator`` or ``KubernetesJobOperator``;
- the example pipeline ``dags/gpu_ml_pipeline.py`` vs the same pipeline written with the anchor
  operators, ``benchmarks/anchor_pipeline_dag.py``: the whole file executed as Airflow's DAG
  processor does (``importlib`` from a path; the DAG object built).

Reported per case: the process wall and CPU time (interpreter start to exit, measured from outside),
the time of the imports alone (measured inside), the CPU time of what the case imports on top of
``import airflow.sdk`` (measured inside: every probe imports the floor first, then times the rest), and
the number of modules imported; medians over the rounds, and ratios to the floor. Targets:
``gpu_provider`` at most 1.10x the floor (judged on the whole process's CPU) and below every anchor
(judged on the CPU of the imports each adds to the floor: the floor's own ~3 s, with ~100 ms of noise
between processes, drops out). Prints the table; exits 0 (measures, does not judge).

Usage: ``python benchmarks/parse_cost.py [--quick] [--runs N]`` (``make bench`` runs ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("boto3", "botocore", "kubernetes", "kubernetes_asyncio", "aiobotocore", "numpy", "torch")

#: every DAG file imports this first; each probe imports it, then times what its case adds on top
FLOOR_IMPORT = "import airflow.sdk"

_PROBE = """
import sys, time, json
t0, c0 = time.perf_counter(), time.process_time()
{floor}
t1, c1 = time.perf_counter(), time.process_time()
{body}
t2, c2 = time.perf_counter(), time.process_time()
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"inner": t2 - t0, "own": t2 - t1, "own_cpu": c2 - c1, "modules": len(sys.modules), "heavy": heavy}}))
"""

_DAG_FILE = """
import importlib.util
spec = importlib.util.spec_from_file_location("parsed_dag", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.dag.task_dict, "no tasks"
"""

OURS = "gpu_provider operators+sensors"

CASES: dict[str, str] = {
    "airflow.sdk (floor)": "import airflow.sdk",
    "gpu_provider operators+sensors": (
        "import airflow.sdk\n"
        "from gpu_provider.operators import GpuJobOperator, GpuReaperOperator\n"
        "from gpu_provider.sensors import GpuJobSensor, CheckpointSensor, SpotCapacitySensor\n"
        "from gpu_provider import GpuResources, Checkpoint, SpotFallback"
    ),
    "BatchOperator": "import airflow.sdk\nfrom airflow.providers.amazon.aws.operators.batch import BatchOperator",
    "SageMakerTrainingOperator": (
        "import airflow.sdk\nfrom airflow.providers.amazon.aws.operators.sagemaker import SageMakerTrainingOperator"
    ),
    "KubernetesPodOperator": (
        "import airflow.sdk\nfrom airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator"
    ),
    "KubernetesJobOperator": (
        "import airflow.sdk\nfrom airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator"
    ),
    "DAG: dags/gpu_ml_pipeline.py": _DAG_FILE.format(path=str(REPO / "dags" / "gpu_ml_pipeline.py")),
    "DAG: anchor_pipeline_dag.py": _DAG_FILE.format(path=str(REPO / "benchmarks" / "anchor_pipeline_dag.py")),
}


@dataclass
class Sample:
    wall: float  # process wall time, from outside
    cpu: float  # the process's CPU time (user + system), from outside: robust to a loaded machine
    inner: float  # the imports alone, from inside
    modules: int
    heavy: list[str]
    own: float = 0.0  # what the case adds on top of the floor's import, wall time, from inside
    own_cpu: float = 0.0  # the same, CPU time of the process (a few ms of noise instead of ~100)


def child_env(airflow_home: str) -> dict[str, str]:
    """The environment of every probe: a private Airflow home, this checkout first on the path."""
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": airflow_home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "GPU_PIPELINE_BACKEND": "local",
            "GPU_PIPELINE_DATA_ROOT": Path(airflow_home, "data").as_uri(),
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
    )
    return env


def probe(body: str, env: dict[str, str], floor: str = FLOOR_IMPORT) -> Sample:
    """Run ``floor`` then ``body`` in a fresh interpreter; its wall and CPU time from outside, what
    ``body`` adds on top of ``floor`` from inside, and what it imported."""
    code = _PROBE.format(floor=floor, body=body, heavy=HEAVY)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"probe failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return Sample(
        wall,
        cpu,
        float(out["inner"]),
        int(out["modules"]),
        list(out["heavy"]),
        float(out["own"]),
        float(out["own_cpu"]),
    )


def measure(
    cases: dict[str, str], runs: int, env: dict[str, str], floor: str = FLOOR_IMPORT
) -> dict[str, list[Sample]]:
    """``runs`` rounds; each round runs every case once, in a rotated order (no case always first)."""
    names = list(cases)
    for name in names:  # warm the file cache and Airflow's home once
        probe(cases[name], env, floor)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    for r in range(runs):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(probe(cases[name], env, floor))
    return samples


def table(samples: dict[str, list[Sample]], floor: str) -> list[str]:
    """The printed table: medians, and ratios to the floor's medians."""
    fw = statistics.median(s.wall for s in samples[floor])
    fc = statistics.median(s.cpu for s in samples[floor])
    fi = statistics.median(s.inner for s in samples[floor])
    fm = statistics.median(s.modules for s in samples[floor])
    lines = [
        "| case | process wall ms | x floor | process CPU ms | x floor | imports ms | x floor | own imports CPU ms "
        "| modules | + over floor | heavy clients |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in samples.items():
        w = statistics.median(s.wall for s in rows)
        c = statistics.median(s.cpu for s in rows)
        i = statistics.median(s.inner for s in rows)
        m = statistics.median(s.modules for s in rows)
        own = statistics.median(s.own_cpu for s in rows)
        heavy = sorted({h for s in rows for h in s.heavy}) or ["none"]
        lines.append(
            f"| {name} | {w * 1000:.0f} | {w / fw:.3f} | {c * 1000:.0f} | {c / fc:.3f} | {i * 1000:.0f} | "
            f"{i / fi:.3f} | {own * 1000:.0f} | {m:.0f} | {m - fm:+.0f} | {', '.join(heavy)} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds (CI)")
    parser.add_argument("--runs", type=int, default=None, help="rounds (default 6, --quick 2)")
    args = parser.parse_args()
    runs = args.runs or (2 if args.quick else 6)
    with tempfile.TemporaryDirectory(prefix="gpu-bench-parse-") as home:
        env = child_env(home)
        started = time.monotonic()
        samples = measure(CASES, runs, env)
        elapsed = time.monotonic() - started
    floor = "airflow.sdk (floor)"
    print(
        f"Figure 1, DAG parse: {runs} rounds, {len(CASES)} cases interleaved, fresh process each, "
        f"Python {sys.version.split()[0]}, {elapsed:.0f} s"
    )
    for line in table(samples, floor):
        print(line)
    ours = statistics.median(s.wall for s in samples[OURS])
    ours_in = statistics.median(s.inner for s in samples[OURS])
    base = statistics.median(s.wall for s in samples[floor])
    base_in = statistics.median(s.inner for s in samples[floor])
    ours_cpu = statistics.median(s.cpu for s in samples[OURS])
    base_cpu = statistics.median(s.cpu for s in samples[floor])
    anchors = ["BatchOperator", "SageMakerTrainingOperator", "KubernetesPodOperator", "KubernetesJobOperator"]
    cheapest = min(statistics.median(s.wall for s in samples[a]) for a in anchors)
    cheapest_cpu = min(statistics.median(s.cpu for s in samples[a]) for a in anchors)
    cheapest_in = min(statistics.median(s.inner for s in samples[a]) for a in anchors)
    over = (ours / base, ours_cpu / base_cpu, ours_in / base_in)
    under = (ours / cheapest, ours_cpu / cheapest_cpu, ours_in / cheapest_in)
    # judged on CPU time: on a shared machine wall time measures the other processes as much as ours
    print(
        f"target: gpu_provider <= 1.10x floor (judged on process CPU): CPU {over[1]:.3f}x -> "
        f"{'met' if over[1] <= 1.10 else 'missed'} (wall {over[0]:.3f}x, imports wall {over[2]:.3f}x)"
    )
    print(
        f"whole process: CPU {under[1]:.3f}x of the cheapest anchor's (wall {under[0]:.3f}x, imports wall "
        f"{under[2]:.3f}x)"
    )
    # below every anchor: judged on what each adds on top of the floor's import, timed inside the process
    # (the CPU the floor itself takes, ~3 s with ~100 ms of noise between processes, drops out)
    own = {name: statistics.median(s.own_cpu for s in samples[name]) for name in [*anchors, OURS]}
    cheapest_own = min(anchors, key=lambda a: own[a])
    print(
        "target: below every anchor (judged on the CPU of the imports added to the floor): "
        f"ours {own[OURS] * 1000:.0f} ms vs {cheapest_own} {own[cheapest_own] * 1000:.0f} ms, the cheapest anchor -> "
        f"{'met' if own[OURS] < own[cheapest_own] else 'missed'} ({own[OURS] / own[cheapest_own]:.2f}x; "
        + ", ".join(f"{a} {own[OURS] / own[a]:.2f}x" for a in anchors)
        + ")"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
