"""The suite's own parallel setup (tests/conftest.py): what `make test` relies on to run under xdist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO

SHARED = """
import os, pathlib, pytest

@pytest.fixture(scope="module")
def expensive():
    pathlib.Path(os.environ["OUT"], "built-" + os.environ["PYTEST_XDIST_WORKER"]).touch()

@pytest.mark.parametrize("i", range(6))
def test_shared(expensive, i):
    pathlib.Path(os.environ["OUT"], f"shared-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""

MARKED = """
import os, pathlib, pytest

@pytest.mark.xdist_group("{group}")
@pytest.mark.parametrize("i", range(3))
def test_marked(i):
    pathlib.Path(os.environ["OUT"], f"marked-{name}-{{i}}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""

FREE = """
import os, pathlib, pytest

@pytest.mark.parametrize("i", range(6))
def test_free(tmp_path, i):
    pathlib.Path(os.environ["OUT"], f"free-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.timeout(900)  # a pytest run of its own, with Airflow to import in each worker: minutes on a loaded machine
def test_tests_sharing_a_module_fixture_or_a_group_mark_run_on_one_worker(tmp_path: Path) -> None:
    """With `make test`'s options, tests that use a module-scoped fixture (such as the `airflow
    standalone` of tests/integration) all run on one worker, which builds the fixture once; so do
    tests of one ``xdist_group`` across modules (xdist's own loadgroup loses them on pytest 9.2)."""
    project, out = tmp_path / "project", tmp_path / "out"
    project.mkdir()
    out.mkdir()
    (project / "test_shared.py").write_text(SHARED)
    (project / "test_marked_a.py").write_text(MARKED.format(group="together", name="a"))
    (project / "test_marked_b.py").write_text(MARKED.format(group="together", name="b"))
    (project / "test_free.py").write_text(FREE)
    # not this run's worker id, nor its timeline (the inner run's tests would be written into it)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "GPU_PROVIDER_TEST_TIMELINE"}
    env.update(OUT=str(out), PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytest_args = ["-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "2", "--dist", "loadgroup"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(project)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = {p.name: p.read_text() for p in out.iterdir() if not p.name.startswith("built-")}
    assert len(ran) == 18, ran
    assert len([p for p in out.iterdir() if p.name.startswith("built-")]) == 1, "the module fixture is built once"
    assert len({w for name, w in ran.items() if name.startswith("shared-")}) == 1, ran
    assert len({w for name, w in ran.items() if name.startswith("marked-")}) == 1, ran


def test_each_process_has_its_own_airflow_home() -> None:
    """Under xdist every worker imports conftest.py: its home carries the worker's name, so two workers
    never share a metadata DB, DAG folder or local-backend state dir."""
    home = Path(os.environ["AIRFLOW_HOME"])
    assert home.name.startswith(f"gpu-provider-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    assert os.environ["AIRFLOW__CORE__DAGS_FOLDER"] == str(home / "dags")
    assert os.environ["AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR"] == str(home / "local-jobs")
