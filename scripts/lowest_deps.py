"""Keep the declared lower bounds true: install the provider against its lowest supported dependencies.

``pin``   resolve the lower bounds of pyproject.toml (``apache-airflow>=3.3.0`` -> ``==3.3.0``, the same for
          every bound of the ``all`` extra) with pip against the package index, the rest of the set taking
          the newest versions those pins accept, and record the result in ``constraints/lowest/py3.X.txt``.
          Airflow's own constraints files live on GitHub, which this project's CI cannot reach, so this
          recorded resolution stands in for "Airflow's constraints for the lowest supported version".
``check`` in a fresh virtualenv (``.venv-lowest``), install the built wheel with those constraints and
          smoke-test it: the base install runs a one-task local DAG with ``airflow dags test``, refuses
          ``backend="batch"`` naming the missing extra and parses the shipped reaper DAG (``dags/gpu_reaper.py``,
          sweeping the local backend, skipping the others); then ``[all]`` builds a Batch client through the
          amazon provider's hook and imports every operator, sensor and trigger.

Run through ``make constraints-lowest`` and ``make test-lowest`` (CI: ``.ci/run``). Needs the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
LOWEST = REPO / "constraints" / "lowest" / f"py{PYVER}.txt"
VENV = REPO / ".venv-lowest"
#: what building the wheel reads
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "gpu_provider")
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]

DAG = """
import sys
from datetime import datetime

from airflow.sdk import DAG
from gpu_provider.operators import GpuJobOperator

with DAG("lowest_smoke", start_date=datetime(2026, 1, 1), schedule=None):
    GpuJobOperator(
        task_id="hello",
        command=[sys.executable, "-c", "print('hello from the lowest supported set')"],
        backend="local",
        poll_interval=0.5,
    )
"""

#: parse the shipped reaper DAG on the base install: it must sweep the local backend and skip the others
REAPER_PARSE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("gpu_reaper", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
op = module.dag.get_task("reap")
print(json.dumps({"backends": [b.name for b in op.backends], "skipped": op.skipped_backends}))
"""

ALL_EXTRA = """
from gpu_provider.backends.aws.calls import aws_client
from gpu_provider.backends import resolve_backend
import gpu_provider.operators, gpu_provider.sensors
import gpu_provider.triggers.gpu_job, gpu_provider.triggers.spot_capacity, gpu_provider.triggers.checkpoint
backend = resolve_backend({"name": "batch", "on_demand_queue": "q", "region_name": "us-east-1"})
client = aws_client("batch", region_name="us-east-1")
print("batch client:", type(client).__name__, client.meta.region_name)
"""


def _project() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pip carries a copy of tomli
        from pip._vendor import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def lower_bounds() -> dict[str, str]:
    """``{distribution: lowest version}`` for the base dependencies and the ``all`` extra."""
    project = _project()
    bounds: dict[str, str] = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["all"]]:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][^,;\s]*)(,.*)?", requirement.strip())
        if not match:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no '>=' lower bound to test")
        bounds[match.group(1).lower()] = match.group(2)
    return bounds


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(args), flush=True)
    return subprocess.run(args, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def make_venv(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    run([sys.executable, "-m", "venv", str(path)])
    python = path / "bin" / "python"
    run([str(python), *PIP, "install", "--upgrade", "pip>=24"])
    return python


def pin() -> None:
    bounds = lower_bounds()
    with tempfile.TemporaryDirectory() as tmp:
        python = make_venv(Path(tmp) / "venv")
        run([str(python), *PIP, "install", *(f"{name}=={version}" for name, version in bounds.items())])
        frozen = run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True).stdout
    keep = [line for line in frozen.splitlines() if line and not line.lower().startswith(("pip==", "setuptools=="))]
    LOWEST.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# The lowest supported set on Python {PYVER}: the lower bounds of pyproject.toml pinned\n"
        f"# ({', '.join(f'{n}=={v}' for n, v in bounds.items())}), the rest resolved by pip from the index.\n"
        "# Regenerate: make constraints-lowest. Checked by: make test-lowest (CI).\n"
    )
    LOWEST.write_text(header + "\n".join(keep) + "\n")
    print(f"wrote {LOWEST.relative_to(REPO)} ({len(keep)} packages)")


def _airflow_env(home: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR=str(home / "gpu_state"),
    )
    return env


def check() -> None:
    if not LOWEST.exists():
        raise SystemExit(f"no lowest constraints for Python {PYVER}: run 'make constraints-lowest' first")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        source = tmp / "source"  # a copy: building in the repository would leave build/ and *.egg-info there
        source.mkdir()
        for name in SOURCES:
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(REPO / name, source / name)
        run([sys.executable, *PIP, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(source)], cwd=tmp)
        (wheel,) = (tmp / "dist").glob("airflow_provider_gpu-*.whl")
        python = make_venv(VENV)
        run([str(python), *PIP, "install", "-c", str(LOWEST), str(wheel)], cwd=tmp)
        installed = run([str(python), "-m", "pip", "freeze"], capture_output=True).stdout.lower()
        airflow = f"apache-airflow=={lower_bounds()['apache-airflow']}"
        if airflow not in installed.splitlines():
            raise SystemExit(f"the base install did not get {airflow}")
        for absent in ("apache-airflow-providers-amazon==", "boto3==", "apache-airflow-providers-cncf-kubernetes=="):
            if absent in installed:
                raise SystemExit(f"the base install pulled {absent.rstrip('=')}: it belongs to an extra")

        home = tmp / "airflow"
        (home / "dags").mkdir(parents=True)
        (home / "dags" / "lowest_smoke.py").write_text(textwrap.dedent(DAG))
        env = _airflow_env(home)
        refused = subprocess.run(
            [str(python), "-c", "from gpu_provider.backends import resolve_backend; resolve_backend('batch')"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        if refused.returncode == 0 or "airflow-provider-gpu[batch]" not in refused.stderr:
            raise SystemExit(f"base install: backend='batch' was not refused naming the extra:\n{refused.stderr}")
        print("base install refuses the batch backend:", refused.stderr.strip().splitlines()[-1])
        shutil.copy(REPO / "dags" / "gpu_reaper.py", home / "dags" / "gpu_reaper.py")
        parsed = subprocess.run(
            [str(python), "-c", REAPER_PARSE, str(home / "dags" / "gpu_reaper.py")],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        if parsed.returncode != 0:
            raise SystemExit(f"base install: dags/gpu_reaper.py does not parse:\n{parsed.stderr[-4000:]}")
        reaper = json.loads(parsed.stdout.strip().splitlines()[-1])
        if reaper["backends"] != ["local"] or not {"batch", "sagemaker", "kubernetes"} <= set(reaper["skipped"]):
            raise SystemExit(f"base install: the reaper DAG should sweep local only and skip the others: {reaper}")
        print(
            "base install: dags/gpu_reaper.py parses, sweeping",
            reaper["backends"],
            "skipping",
            sorted(reaper["skipped"]),
        )
        run([str(python), "-m", "airflow", "db", "migrate"], cwd=tmp, env=env, capture_output=True)
        test = subprocess.run(
            [str(python), "-m", "airflow", "dags", "test", "lowest_smoke"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        runs = run(
            [str(python), "-m", "airflow", "dags", "list-runs", "lowest_smoke", "-o", "json"],
            cwd=tmp,
            env=env,
            capture_output=True,
        ).stdout
        state = json.loads(runs.strip().splitlines()[-1])[0]["state"]
        if state != "success":
            raise SystemExit(f"airflow dags test lowest_smoke ended {state}:\n{(test.stdout + test.stderr)[-6000:]}")
        print("base install: airflow dags test lowest_smoke -> success")

        run([str(python), *PIP, "install", "-c", str(LOWEST), f"{wheel}[all]"], cwd=tmp)
        print(run([str(python), "-c", ALL_EXTRA], cwd=tmp, env=env, capture_output=True).stdout.strip())
    versions = run([str(python), "-m", "pip", "freeze"], capture_output=True).stdout.lower().splitlines()
    tested = [f"{name}=={version}" for name, version in lower_bounds().items()]
    if not set(tested) <= set(versions):
        raise SystemExit(f"[all] did not install the lower bounds: {sorted(set(tested) - set(versions))}")
    print("tested:", ", ".join(tested))
    print(f"lowest supported set: OK in {time.monotonic() - started:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["pin", "check"])
    {"pin": pin, "check": check}[parser.parse_args().command]()


if __name__ == "__main__":
    main()
