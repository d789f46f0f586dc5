"""Test session setup: a private Airflow home (SQLite) configured before anything imports Airflow.

`make test` runs the suite in parallel (pytest-xdist). Each worker is its own process and imports
this file, so each gets its own Airflow home, metadata DB, local-backend state dir and emulators
(session fixtures run once per worker); tests/parallel.py keeps the tests that share a module-scoped
fixture on one worker.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The fixtures of gpu_provider.testing's pytest plugin (gpu_batch, gpu_kubernetes, ...) come through its
# pytest11 entry point where the package is installed (see pytest_configure below); these modules give
# them this suite's names and add its own.
pytest_plugins = (
    "tests.harness",
    "tests.statsd",
    "tests.batch_world",
    "tests.ec2_world",
    "tests.kubernetes_world",
    "tests.sagemaker_world",
    "tests.parallel",
)

# one home per process: under xdist every worker (gw0, gw1, ...) gets its own
_HOME = Path(tempfile.mkdtemp(prefix=f"gpu-provider-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(_HOME / "dags"),
        "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(_HOME / "local-jobs"),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # tasks that do not set poll_interval poll often (the local backend's default is 2 s); a
        # test that is about the default removes this with monkeypatch
        "AIRFLOW__GPU_PROVIDER__POLL_INTERVAL": "0.3",
        # after a job without end-of-log markers ends, read for late lines every 0.2 s, not every 1 s (the
        # emulators have every line in before they report the end); tests/engine/test_end_of_log.py checks it
        "AIRFLOW__GPU_PROVIDER__LOG_SETTLE_READ_S": "0.2",
    }
)
(_HOME / "dags").mkdir()


@pytest.fixture(scope="session")
def airflow_home(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A migrated metadata DB in the private Airflow home. ``airflow db migrate`` takes about 5 s (3 CPU s):
    under xdist the first worker that needs it migrates and leaves a copy of the fresh DB in a folder the
    controller named, and the other workers copy that file instead of migrating again."""
    workerinput: dict[str, Any] | None = getattr(request.config, "workerinput", None)
    shared = workerinput.get(_FRESH_DB_KEY) if workerinput else None
    if shared is None:
        _migrate()
    else:
        with (Path(shared) / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one worker migrates; the others wait for its copy
            fresh = Path(shared) / "airflow.db"
            if fresh.exists():
                shutil.copyfile(fresh, _HOME / "airflow.db")
            else:
                _migrate()
                shutil.copyfile(_HOME / "airflow.db", Path(shared) / "airflow.db.part")
                os.replace(Path(shared) / "airflow.db.part", fresh)
    yield _HOME


def _migrate() -> None:
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )


#: the workers' input key naming the folder of the freshly migrated metadata DB (see ``airflow_home``)
_FRESH_DB_KEY = "gpu_provider_fresh_db_dir"
_FRESH_DB_DIR = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    config: pytest.Config = node.config
    if _FRESH_DB_DIR not in config.stash:
        config.stash[_FRESH_DB_DIR] = Path(tempfile.mkdtemp(prefix="gpu-provider-fresh-db-"))
    node.workerinput[_FRESH_DB_KEY] = str(config.stash[_FRESH_DB_DIR])


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FRESH_DB_DIR, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    # gpu_provider.testing's plugin: loaded by pytest through the entry point of an install made with this
    # pyproject.toml; loaded here when this environment's install predates it (or runs with PYTHONPATH)
    manager = config.pluginmanager
    if not (manager.has_plugin("gpu_provider") or manager.has_plugin("gpu_provider.testing.plugin")):
        manager.import_plugin("gpu_provider.testing.plugin")


@pytest.fixture(scope="session")
def gpu_airflow_home(airflow_home: Path) -> Path:
    """The plugin's dag.test() runs use this suite's Airflow home."""
    return airflow_home


#: seconds between a Batch job's states before RUNNING (SUBMITTED, PENDING, RUNNABLE, STARTING) in this suite's
#: emulator; the plugin's default is 0.3 s. No test waits on how long a state lasts: a test that needs a job to
#: stay queued holds its queue, and the spot reclaims count from RUNNING.
BATCH_STEP_S = 0.1


@pytest.fixture(scope="session")
def gpu_batch_emulator(gpu_batch_emulator: Any) -> Any:
    """The plugin's Batch emulator, stepping every :data:`BATCH_STEP_S` (each job reaches RUNNING about 0.8 s
    sooner: the suite waits on a few hundred Batch jobs)."""
    gpu_batch_emulator.emulator.step_seconds = BATCH_STEP_S
    return gpu_batch_emulator


@pytest.fixture(scope="session")
def gpu_job_cwd() -> Path:
    """The emulators run jobs' commands in the repository (the tests' job programs are found from there)."""
    return Path(__file__).resolve().parent.parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Every job the tests started was cancelled or finished: its supervisor must be exiting. Wait for
    # the supervisors this process started, and name any that would outlive the session.
    from gpu_provider.backends.local import launch

    deadline = time.monotonic() + 15
    leftovers = []
    for proc in list(launch._children):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            leftovers.append(proc.pid)
    if leftovers:
        print(f"\nWARNING: local job supervisors still running after the tests: {leftovers}", file=sys.stderr)
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # GPU_PROVIDER_TEST_TIMELINE=FILE: each test's worker, start and end (wall clock) appended to FILE, to see
    # how the parallel run packs its tests (which ones start late and make the run's tail); off by default
    timeline = os.environ.get("GPU_PROVIDER_TEST_TIMELINE")
    started = time.time()
    yield
    if timeline:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(timeline, "a") as out:
            out.write(f"{worker}\t{started:.3f}\t{time.time():.3f}\t{item.nodeid}\n")
