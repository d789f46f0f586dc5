"""The built wheel, installed (not editable) into a fresh virtualenv, runs the example pipeline.

What a pip user does: install the wheel, copy ``gpu_ml_pipeline.py`` into the dags folder, and run
``airflow dags test gpu_ml_pipeline``. To stay fast and offline, the wheel is built without build
isolation and installed with ``--no-deps``; Airflow, the amazon provider and numpy come from this
test's own virtualenv, added to the new one's path by a ``.pth`` line. Such a line only appends the
folder to ``sys.path`` (the ``.pth`` files inside it, such as the editable install's hook, are not
run), so ``gpu_provider`` is found only in the wheel; every command runs in a temporary folder, so
the repository is not on the path either.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what setuptools needs to build the wheel: the project file, the README (the long description), the
#: license files, the package
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "gpu_provider")


@dataclass
class Installed:
    """A virtualenv holding the wheel, and the wheel itself."""

    wheel: Path
    python: Path
    site: Path
    tmp: Path

    def run(self, args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the new virtualenv's Python in a temporary folder (never the repository)."""
        return subprocess.run(
            [str(self.python), *args], cwd=self.tmp, env=env, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy: building in the shared tree would write build/ and *.egg-info there
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(source)],
        cwd=tmp,
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp / "dist").glob("airflow_provider_gpu-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # --ignore-installed: a gpu_provider pip sees through this process's path is not an install of the wheel
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--ignore-installed", str(wheel)], cwd=tmp, check=True
    )
    (site / "_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return Installed(wheel=wheel, python=python, site=site, tmp=tmp)


def test_the_wheel_holds_the_package_and_the_example_programs(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {f"gpu_provider/examples/{stage}.py" for stage in ("preprocess", "train", "infer")} <= names
    assert "gpu_provider/py.typed" in names
    assert "gpu_provider/spend/prices.json" in names, "the shipped price table is package data"
    # nothing but the package and its metadata: no tests, dags, emulators or scripts
    distribution, version = installed.wheel.name.split("-")[:2]
    assert {name.split("/")[0] for name in names} == {"gpu_provider", f"{distribution}-{version}.dist-info"}


def _metadata(wheel: Path) -> list[str]:
    (metadata,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA")]
    return zipfile.ZipFile(wheel).read(metadata).decode().splitlines()


def test_the_installed_wheel_prices_jobs_from_its_shipped_table(installed: Installed) -> None:
    code = (
        "import gpu_provider.spend.prices as p; from gpu_provider.job import GpuResources\n"
        "price = p.PriceBook().job_price(GpuResources(gpu_type='h100', gpus=8), 'on-demand', 'us-west-2')\n"
        "print(p.__file__, price.instance_type, price.usd_per_hour, p.shipped_table()['retrieved'])"
    )
    done = installed.run(["-c", code], env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    where, itype, usd, retrieved = done.stdout.split()
    assert where.startswith(str(installed.site)), where  # from the wheel, not the repository
    assert (itype, float(usd), retrieved) == ("p5.48xlarge", 55.04, "2026-12-03")


def test_the_wheel_declares_what_the_code_needs(installed: Installed) -> None:
    lines = _metadata(installed.wheel)
    requires = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    assert "apache-airflow<4,>=3.3.0" in requires, "the task state store is Airflow 3.3's"
    # the base install is Airflow alone: every service client comes with the backend's extra
    assert [r for r in requires if "extra ==" not in r] == ["apache-airflow<4,>=3.3.0"]
    assert 'numpy>=1.24; extra == "examples"' in requires
    for extra in ("aws", "batch", "sagemaker", "all"):
        assert f'apache-airflow-providers-amazon>=9.6.0; extra == "{extra}"' in requires
        assert f'boto3>=1.37.0; extra == "{extra}"' in requires
    for extra in ("kubernetes", "all"):
        assert f'apache-airflow-providers-cncf-kubernetes>=10.0.0; extra == "{extra}"' in requires
    provides = {line.removeprefix("Provides-Extra: ") for line in lines if line.startswith("Provides-Extra: ")}
    assert {"aws", "batch", "sagemaker", "kubernetes", "all", "examples", "testing", "dev"} <= provides


#: what the [testing] extra brings that the base install must never import
TESTING_ONLY = ("moto", "flask", "boto3", "botocore", "gpu_provider.testing.emulators")


def test_the_wheel_without_the_testing_extra_imports_no_moto_and_no_emulator(installed: Installed) -> None:
    """The base install stays light: the package, its operators, sensors, triggers and the testing package and
    pytest plugin (which pytest loads in every environment the wheel is installed in) import no moto, no
    boto3 and no emulator; without the extra (its modules blocked, as if not installed), an emulator
    fails naming ``airflow-provider-gpu[testing]``."""
    requires = [line.removeprefix("Requires-Dist: ") for line in _metadata(installed.wheel) if "Requires-Dist" in line]
    assert 'moto[server]>=5.0; extra == "testing"' in requires
    assert not [r for r in requires if r.startswith("moto") and 'extra == "testing"' not in r and "dev" not in r]
    code = (
        "import importlib, json, sys\n"
        "for blocked in ('moto', 'flask', 'boto3', 'botocore'):\n"
        "    sys.modules[blocked] = None  # as if the extra were not installed\n"
        "import gpu_provider, gpu_provider.operators, gpu_provider.sensors, gpu_provider.triggers\n"
        "import gpu_provider.testing, gpu_provider.testing.plugin, gpu_provider.testing.dagrun\n"
        "import gpu_provider.testing.check\n"
        f"loaded = sorted(m for m in sys.modules if sys.modules[m] is not None and m.startswith({TESTING_ONLY!r}))\n"
        "try:\n"
        "    importlib.import_module('gpu_provider.testing.emulators.aws_batch')\n"
        "except ImportError as err:\n"
        "    error = f'{type(err).__name__}: {err}'\n"
        "print(json.dumps({'loaded': loaded, 'where': gpu_provider.__file__, 'error': error}))\n"
    )
    done = installed.run(["-c", code], env={"PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["where"].startswith(str(installed.site))
    assert result["loaded"] == []
    assert result["error"].startswith("MissingExtraError: gpu_provider.testing.emulators needs moto"), result
    assert "pip install 'airflow-provider-gpu[testing]'" in result["error"]
    # the plugin is registered with pytest through the wheel's entry point
    points = installed.run(
        ["-c", "from importlib.metadata import entry_points as e; print([p.value for p in e(group='pytest11')])"],
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert "gpu_provider.testing.plugin" in points.stdout, points.stdout + points.stderr


def test_the_wheel_carries_its_license(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    (info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/NOTICE"} <= set(names)
    text = zipfile.ZipFile(installed.wheel).read(f"{info}/licenses/LICENSE").decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    lines = _metadata(installed.wheel)
    assert "License-Expression: Apache-2.0" in lines
    assert {"License-File: LICENSE", "License-File: NOTICE"} <= set(lines)
    # the long description is the README: on a package index it has no relative link to follow
    description = "\n".join(lines)
    assert "](dags/" not in description and "](constraints/" not in description


def test_the_runtime_helper_runs_in_an_image_without_airflow(installed: Installed, tmp_path: Path) -> None:
    """What a training image does: ``pip install --no-deps airflow-provider-gpu`` and nothing else.

    A new virtualenv without Airflow, boto3 or numpy (no path to this test's packages): the launch
    wrapper runs a command with the rendezvous variables, and a checkpoint is saved and restored.
    """
    venv = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q", "--python", str(python)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPU_PROVIDER")) and k != "PYTHONPATH"}
    # --ignore-installed: pip must not take a gpu_provider it sees through this test's path for an install
    subprocess.run(
        [*pip, "install", "--no-deps", "--ignore-installed", str(installed.wheel)], cwd=tmp_path, env=env, check=True
    )
    env.update({"GPU_PROVIDER_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(), "NNODES": "2", "NODE_RANK": "1"})
    env.update({"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500"})

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    absent = run(
        ["-c", "import importlib.util as u; print([m for m in ('airflow', 'boto3', 'numpy') if u.find_spec(m)])"]
    )
    assert absent.stdout.strip() == "[]", absent.stderr
    launched = run(
        [
            "-m",
            "gpu_provider.runtime.launch",
            "--",
            str(python),
            "-c",
            "import os, sys; print(os.environ['NNODES'], os.environ['NODE_RANK'], os.environ['MASTER_ADDR']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'boto3')))",
        ]
    )
    assert launched.returncode == 0, launched.stderr
    # the last line marks the end of this node's log (the job's command exited 0)
    assert launched.stdout.splitlines() == ["2 1 10.0.0.5", "[]", "gpu_provider: end-of-log node=1 nnodes=2 exit=0"]

    job = """
import os, sys
from pathlib import Path
from gpu_provider.runtime import latest_checkpoint, restore_checkpoint, save_checkpoint
uri = os.environ["GPU_PROVIDER_CHECKPOINT_URI"]
with save_checkpoint(uri, 7, keep=2) as folder:
    (Path(folder) / "weights.txt").write_text("step 7 weights")
latest = latest_checkpoint(uri)
print(latest.rsplit("/", 1)[1], (restore_checkpoint(latest) / "weights.txt").read_text())
print(sorted(m for m in sys.modules if m.split(".")[0] in ("airflow", "boto3", "numpy")))
"""
    saved = run(["-m", "gpu_provider.runtime.launch", "--", str(python), "-c", job])
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.splitlines()[:-1] == ["ckpt-0000000007 step 7 weights", "[]"]
    s3 = run(["-c", "from gpu_provider.runtime import latest_checkpoint; latest_checkpoint('s3://bucket/ckpt')"])
    assert "s3:// checkpoints need boto3 in the job's environment" in s3.stderr and "pip install boto3" in s3.stderr


@pytest.fixture
def pipeline_env(installed: Installed, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A fresh Airflow home with the example DAG copied into its dags folder; jobs cancelled at the end."""
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    shutil.copy(REPO / "dags" / "gpu_ml_pipeline.py", home / "dags")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPU_PIPELINE")) and k != "PYTHONPATH"}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(tmp_path / "state"),
            # the fork server its local jobs start exits soon after the test, not 10 minutes later
            "AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER_IDLE_S": "5",
            "GPU_PIPELINE_DATA_ROOT": (tmp_path / "data").as_uri(),
        }
    )
    yield env
    from gpu_provider.backends.local import LocalBackend

    backend = LocalBackend(state_dir=str(tmp_path / "state"), grace_period=0.5)
    for handle in backend.list_jobs():
        backend.cancel(handle, "test teardown")


@pytest.mark.timeout(900)  # the deadlines below are for a hung run, not a slow one: a loaded machine takes minutes
def test_the_example_pipeline_runs_from_the_wheel(installed: Installed, pipeline_env: dict[str, str]) -> None:
    started = time.monotonic()
    where = installed.run(
        ["-c", "import gpu_provider.examples.train as m, json, sys; print(m.__file__); print(json.dumps(sys.path))"],
        pipeline_env,
    )
    module_file, path = where.stdout.splitlines()
    assert module_file.startswith(str(installed.site)), "gpu_provider must come from the installed wheel"
    # no other folder on the path holds the package (the repository, the editable install) to fall back on
    others = [Path(entry or installed.tmp) for entry in json.loads(path) if Path(entry) != installed.site]
    assert not [entry for entry in others if (entry / "gpu_provider").exists()]

    migrate = installed.run(["-m", "airflow", "db", "migrate"], pipeline_env)
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    conf = json.dumps({"epochs": 1, "step_delay": 0})
    test = installed.run(
        ["-m", "airflow", "dags", "test", "gpu_ml_pipeline", "2026-03-02", "-c", conf], pipeline_env, timeout=600
    )
    log = test.stdout + test.stderr
    runs = installed.run(["-m", "airflow", "dags", "list-runs", "gpu_ml_pipeline", "-o", "json"], pipeline_env)
    elapsed = time.monotonic() - started
    assert json.loads(runs.stdout.strip().splitlines()[-1])[0]["state"] == "success", log[-6000:]
    data = Path(pipeline_env["GPU_PIPELINE_DATA_ROOT"].removeprefix("file://"))
    (metrics,) = data.glob("*/runs/*/predictions/metrics.json")
    assert json.loads(metrics.read_text())["accuracy"] > 0.8
    assert "XCom not found" not in log
    # how long it took is printed, not asserted: timings belong in benchmarks/ (a loaded CI machine took 142 s)
    print(f"\nwheel install: the example pipeline ran in {elapsed:.0f}s")


# --- gpu_provider.testing from the wheel: a user's own project tests its pipeline ----------------------------

SAMPLE_DAG = """
import sys
from pathlib import Path

from airflow.sdk import DAG
from gpu_provider import SpotFallback
from gpu_provider.operators import GpuJobOperator

PROJECT = Path(__file__).resolve().parent.parent
DATA = PROJECT / "data" / "{{ run_id | path_segment }}"

with DAG(dag_id="sample_pipeline", schedule=None, catchup=False, params={"steps": 30}) as dag:
    prep = GpuJobOperator(
        task_id="prep",
        command=[sys.executable, str(PROJECT / "jobs" / "prep.py"), f"{DATA}/prep"],
        backend="local",
    )
    # the same training on each backend, on spot with a fallback to on-demand
    for task_id, backend in {"local": "local", "batch": "batch", "k8s": "kubernetes"}.items():
        prep >> GpuJobOperator(
            task_id=task_id,
            command=[
                sys.executable, str(PROJECT / "jobs" / "train.py"),
                "--data", "{{ ti.xcom_pull(task_ids='prep')['output_uri'] }}",
                "--steps", "{{ params.steps }}",
                "--out", f"{DATA}/{task_id}/model",
            ],
            backend=backend,
            image="sample-trainer:1",
            capacity=SpotFallback(after_preemptions=1, backoff=0),
            checkpoint=f"file://{DATA}/{task_id}/checkpoints",
        )
"""

SAMPLE_PREP = """
import sys
from pathlib import Path
from gpu_provider.runtime import declare_output

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / "rows.txt").write_text("1 2 3")
declare_output(out.as_uri())
"""

SAMPLE_TRAIN = """
import argparse, json, sys, time
from pathlib import Path
from gpu_provider.runtime import (
    declare_output, install_stop_handler, job_env, restore_checkpoint, resume_checkpoint, save_checkpoint
)

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", required=True)
args = parser.parse_args()
env, stop = job_env(), install_stop_handler()
step, starts = 0, []
resumed = resume_checkpoint()
if resumed:
    state = json.loads((restore_checkpoint(resumed) / "state.json").read_text())
    step, starts = state["step"], state["starts"]
starts.append(step)

def save():
    with save_checkpoint(env.checkpoint_uri, step) as folder:
        (folder / "state.json").write_text(json.dumps({"step": step, "starts": starts}))

while step < args.steps:
    time.sleep(0.1)
    step += 1
    if stop.requested:
        save()
        sys.exit(143)
    if step % 2 == 0:
        save()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
(out / "model.json").write_text(json.dumps({"steps": step, "starts": starts}))
declare_output(out.as_uri())
"""

#: a job program that ignores SIGTERM: an interruption kills it after the grace period, unsaved
SAMPLE_DEAF = """
import json, signal, time
from gpu_provider.runtime import job_env, save_checkpoint

signal.signal(signal.SIGTERM, signal.SIG_IGN)
env = job_env()
for step in range(1, 31):
    time.sleep(0.05)
    if step % 5 == 0:
        with save_checkpoint(env.checkpoint_uri, step) as folder:
            (folder / "state.json").write_text(json.dumps({"step": step}))
"""

SAMPLE_TESTS = """
import json
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
DAG = PROJECT / "dags" / "sample_pipeline.py"


def test_training_on_every_backend_resumes_on_demand_after_a_spot_interruption(
    run_gpu_dag, gpu_local, gpu_aws, gpu_kubernetes
):
    gpu_aws.reclaim_spot_after(2.0, name_contains="-batch-")
    gpu_kubernetes.disrupt_after(2.0, name_contains="-k8s-")
    run = run_gpu_dag(DAG, interrupt={"local": [2.0]})

    assert run.state == "success", run.log[-3000:]
    assert run["prep"].output.endswith("/prep") and run["prep"].capacities == ["on-demand"]
    for task_id in ("local", "batch", "k8s"):
        task = run[task_id]
        assert task.capacities == ["spot", "on-demand"], (task_id, task.attempts)
        assert task.attempt_states == ["PREEMPTED", "SUCCEEDED"], (task_id, task.attempts)
        assert task.resume_steps[0] is None and (task.resume_steps[1] or 0) > 0, (task_id, task.attempts)
        model = json.loads((Path(task.output.removeprefix("file://")) / "model.json").read_text())
        assert model == {"steps": 30, "starts": [0, task.resume_steps[1]]}, task_id
    assert [a["queue"] for a in run["batch"].attempts] == ["gpu-spot", "gpu-on-demand"]
    assert "terminated" in run["batch"].attempts[0]["reason"]
    assert "DisruptionTarget" in run["k8s"].attempts[0]["reason"]
    assert gpu_local.jobs(), "the local tasks ran in the fixture's state directory"


def test_the_checker_reports_a_program_that_ignores_sigterm(gpu_check):
    report = gpu_check([sys.executable, str(PROJECT / "jobs" / "deaf.py")], interrupt_after=0.5, grace_period=0.5)
    assert not report.ok
    assert report["sigterm"].ok is False, report.text()
    assert "ignores or blocks SIGTERM" in report["sigterm"].message
    assert report["output"].ok is False
"""


@pytest.mark.timeout(600)
def test_a_sample_project_tests_its_pipeline_with_the_testing_extra(installed: Installed, tmp_path: Path) -> None:
    """What a user does: ``pip install 'airflow-provider-gpu[testing]'`` next to their project, then write
    plain pytest tests with the plugin's fixtures (found through the entry point; no conftest). Offline:
    the extra's requirements are satisfied by what this test's environment has (the ``.pth`` line)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q", "--python"]
    extra = subprocess.run(
        [*pip, str(installed.python), "install", "--no-index", f"{installed.wheel}[testing]"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert extra.returncode == 0, extra.stdout + extra.stderr
    project = tmp_path / "sample"
    files = {
        "dags/sample_pipeline.py": SAMPLE_DAG,
        "jobs/prep.py": SAMPLE_PREP,
        "jobs/train.py": SAMPLE_TRAIN,
        "jobs/deaf.py": SAMPLE_DEAF,
        "tests/test_sample_pipeline.py": SAMPLE_TESTS,
    }
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text.lstrip())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPU_", "PYTEST")) and k != "PYTHONPATH"}
    started = time.monotonic()
    done = subprocess.run(
        [str(installed.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    assert "2 passed" in output, output[-3000:]
    print(f"\nsample project: its tests with gpu_provider.testing's fixtures passed in {elapsed:.0f}s")
