"""DAG-parse import cost of the provider.

Measures, each in a fresh Python process (alternating, so machine noise hits both alike):

- baseline: ``import airflow.sdk`` (what every DAG file pays);
- provider: ``import airflow.sdk`` then ``from gpu_provider.operators import GpuJobOperator``
  (plus ``from gpu_provider import GpuResources, Checkpoint, SpotFallback``).

Prints the medians, the ratio, our own modules' share from ``python -X importtime``, and whether
any heavy client (boto3, botocore, kubernetes, numpy, torch) was imported. Exits 1 if the ratio
exceeds 1.10 or a heavy client was imported.

Usage: ``make bench`` or ``python benchmarks/import_cost.py [--runs 15]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

BASELINE = """
import time, json, sys
t = time.perf_counter()
import airflow.sdk
print(json.dumps({"total": time.perf_counter() - t}))
"""

PROVIDER = """
import time, json, sys
t = time.perf_counter()
import airflow.sdk
mid = time.perf_counter()
from gpu_provider.operators import GpuJobOperator
from gpu_provider import GpuResources, Checkpoint, SpotFallback
end = time.perf_counter()
heavy = [m for m in ("boto3", "botocore", "kubernetes", "kubernetes_asyncio", "numpy", "torch") if m in sys.modules]
print(json.dumps({"total": end - t, "ours": end - mid, "heavy": heavy}))
"""


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _importtime_top() -> list[tuple[int, str]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import airflow.sdk; from gpu_provider.operators import GpuJobOperator",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip().startswith("gpu_provider"):
            rows.append((int(parts[0].split(":")[1]), parts[2].strip()))
    return sorted(rows, reverse=True)[:8]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    _run(BASELINE)  # warm the file cache once
    base, prov, ours = [], [], []
    heavy: set[str] = set()
    for _ in range(args.runs):
        base.append(float(_run(BASELINE)["total"]))  # type: ignore[arg-type]
        p = _run(PROVIDER)
        prov.append(float(p["total"]))  # type: ignore[arg-type]
        ours.append(float(p["ours"]))  # type: ignore[arg-type]
        heavy.update(p["heavy"])  # type: ignore[arg-type]
    mb, mp, mo = statistics.median(base), statistics.median(prov), statistics.median(ours)
    ratio = mp / mb
    print(f"runs: {args.runs} of each, fresh process per run, Python {sys.version.split()[0]}")
    print(f"median import airflow.sdk                          : {mb * 1000:8.1f} ms")
    print(f"median import airflow.sdk + gpu_provider operator  : {mp * 1000:8.1f} ms")
    print(f"median of the provider's own part                  : {mo * 1000:8.1f} ms")
    print(f"ratio (provider / baseline, medians)               : {ratio:8.3f}  (limit 1.10)")
    print(f"provider's own part / baseline                     : {mo / mb:8.3%}")
    print(f"heavy clients imported at parse time               : {sorted(heavy) or 'none'}")
    print("largest gpu_provider modules by cumulative import time (-X importtime, us):")
    for us, mod in _importtime_top():
        print(f"  {us:8d}  {mod}")
    return 0 if ratio <= 1.10 and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
