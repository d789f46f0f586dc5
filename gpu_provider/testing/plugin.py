"""The pytest plugin of ``airflow-provider-gpu``: test your GPU pipelines offline.

Registered through pytest's ``pytest11`` entry point (name ``gpu_provider``; ``-p no:gpu_provider``
turns it off). Importing it is cheap: no moto, boto3, Airflow or emulator is imported until a
fixture that needs one runs. Every fixture name starts with ``gpu_`` (or is ``run_gpu_dag``), so it
does not clash with a project's own fixtures.

Fixtures for users:

* ``gpu_local`` - :class:`~gpu_provider.testing.worlds.LocalWorld`: the local backend with a temporary
  state directory and fake GPUs; ``gpu_local.interrupt({"train": [30]})`` interrupts jobs at chosen
  times. Base install.
* ``gpu_aws`` - :class:`~gpu_provider.testing.worlds.AwsWorld`: AWS Batch (spot and on-demand queues) and
  SageMaker on the emulators, the Airflow AWS connections and the provider's config pointed at them;
  ``reclaim_spot``, ``reclaim_spot_after``, ``hold_spot``, ``throttle``. Needs ``[testing]``.
* ``gpu_kubernetes`` - :class:`~gpu_provider.testing.worlds.KubernetesWorld`: the Kubernetes emulator
  (spot and on-demand nodes) and a kubeconfig pointed at it (``KUBECONFIG`` and ``kubernetes_default``);
  ``disrupt_node``, ``disrupt_after``, ``hold_spot``. Needs ``[testing]``.
* ``run_gpu_dag(dag_file, conf=..., interrupt={"train": [30]})`` - runs a DAG with ``dag.test()`` in a
  child process (a temporary Airflow home, migrated once per session) and returns a
  :class:`~gpu_provider.testing.dagrun.DagRun`: ``run["train"].capacities``, ``.resume_steps``,
  ``.output``, ... for plain asserts.
* ``gpu_check`` - :func:`gpu_provider.testing.check.check_program`: the job-program checker.

Building blocks (session-scoped, one per test process): ``gpu_airflow_home``, ``gpu_job_cwd`` (the folder
emulated jobs run in: the current folder), ``gpu_batch_emulator``, ``gpu_sagemaker_emulator``,
``gpu_kubernetes_emulator``, ``gpu_ec2_emulator``; and per test ``gpu_batch``, ``gpu_sagemaker``,
``gpu_ec2_spot``, ``gpu_dag_runner``. A project may override ``gpu_airflow_home`` or ``gpu_job_cwd``.

The local backend's fork servers of a test session exit 5 s after their last launch (unless
``AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER_IDLE_S`` is set), and those the test process started are
stopped when the session ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gpu_provider.testing.check import CheckReport
    from gpu_provider.testing.dagrun import DagRun, DagRunner
    from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
    from gpu_provider.testing.worlds import AwsWorld, BatchWorld, KubernetesWorld, LocalWorld, SageMakerWorld


def _set_env(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)


# --- the local backend's fork servers --------------------------------------------------------------

#: how long a test session's local fork servers wait for a launch before they exit (a worker's wait 600 s):
#: each test has a state directory, so a fork server, of its own
FORK_SERVER_IDLE_S = "5"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("AIRFLOW__GPU_PROVIDER__LOCAL_FORK_SERVER_IDLE_S", FORK_SERVER_IDLE_S)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from gpu_provider.backends.local.launch import stop_fork_servers

    stop_fork_servers()


# --- Airflow ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gpu_airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary Airflow home with a migrated SQLite metadata DB (about 5 s, once per test process).

    Only the ``dag.test()`` children use it (their environment names it): the test process's own
    Airflow configuration is left alone."""
    home = tmp_path_factory.mktemp("gpu-airflow-home")
    (home / "dags").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__DATABASE__")}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(home / "dags")
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed in {home}:\n{done.stderr[-3000:]}")
    return home


@pytest.fixture(scope="session")
def gpu_job_cwd() -> Path:
    """The folder the emulators run jobs' commands in (the current folder when the session starts)."""
    return Path.cwd()


# --- local -----------------------------------------------------------------------------------------


@pytest.fixture
def gpu_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalWorld]:
    """The local backend with a temporary state directory (also ``[gpu_provider] local_state_dir`` for
    this test and its ``run_gpu_dag`` runs) and two fake GPUs; every job left is cancelled at teardown."""
    from gpu_provider.testing.worlds import LocalWorld

    world = LocalWorld(state_dir=tmp_path / "gpu-local-state")
    _set_env(monkeypatch, world.env())
    try:
        yield world
    finally:
        for interrupter in world.interrupters:
            interrupter.__exit__(None, None, None)
        if world.state_dir.exists():
            backend = world.backend(grace_period=0.5)
            for handle in backend.list_jobs():
                backend.cancel(handle, "test teardown")


# --- AWS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gpu_batch_emulator(gpu_job_cwd: Path) -> Iterator[BatchWorld]:
    """The AWS Batch emulator with its queues, one per test process (moto's state is global)."""
    from gpu_provider.testing.emulators.aws_batch import BatchEmulator
    from gpu_provider.testing.worlds import BatchWorld

    running = BatchEmulator.running()
    if running is not None:  # a test started one itself
        yield BatchWorld(running, running.create_environment(fair_share=True))
        return
    with BatchEmulator(job_cwd=gpu_job_cwd, step_seconds=0.3, grace_period=3.0) as emulator:
        yield BatchWorld(emulator, emulator.create_environment(fair_share=True))


@pytest.fixture
def gpu_batch(gpu_batch_emulator: BatchWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchWorld]:
    """The Batch emulator for one test: ``aws_default`` points at it; request log reset; faults cleared and
    every job left active terminated at teardown. Its queues are created again if something reset moto."""
    from gpu_provider.backends.batch import known

    emulator = gpu_batch_emulator.emulator
    known.forget()  # each test starts as a fresh worker process: no job definition or queue remembered
    _set_env(monkeypatch, gpu_batch_emulator.connection_env())
    emulator.create_environment(fair_share=gpu_batch_emulator.setup.fair_share_queue is not None)
    emulator.reset_requests()
    try:
        yield gpu_batch_emulator
    finally:
        emulator.reset_faults()
        gpu_batch_emulator.terminate_all()


@pytest.fixture(scope="session")
def gpu_sagemaker_emulator(gpu_job_cwd: Path) -> Iterator[SageMakerWorld]:
    """The SageMaker emulator, one per test process."""
    from gpu_provider.testing.emulators.aws_sagemaker import SageMakerEmulator
    from gpu_provider.testing.worlds import SageMakerWorld

    running = SageMakerEmulator.running()
    if running is not None:
        yield SageMakerWorld(running)
        return
    with (
        tempfile.TemporaryDirectory(prefix="gpu-sagemaker-jobs-") as root,
        SageMakerEmulator(job_root=Path(root), job_cwd=gpu_job_cwd, step_seconds=0.2, grace_period=2.0) as emulator,
    ):
        yield SageMakerWorld(emulator)


@pytest.fixture
def gpu_sagemaker(gpu_sagemaker_emulator: SageMakerWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[SageMakerWorld]:
    """The SageMaker emulator for one test: ``aws_default`` points at it, its buckets exist (another emulator
    starting in this process resets moto); faults cleared and every job left stopped at teardown."""
    emulator = gpu_sagemaker_emulator.emulator
    _set_env(monkeypatch, gpu_sagemaker_emulator.connection_env())
    emulator.reset_requests()
    gpu_sagemaker_emulator.ensure_buckets()
    try:
        yield gpu_sagemaker_emulator
    finally:
        emulator.reset_faults()
        emulator.stop_all()


@pytest.fixture
def gpu_aws(
    gpu_batch: BatchWorld, gpu_sagemaker: SageMakerWorld, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AwsWorld]:
    """AWS Batch and SageMaker on the emulators, for one test (see :class:`~gpu_provider.testing.worlds.AwsWorld`)."""
    from gpu_provider.testing.worlds import AwsWorld

    world = AwsWorld(batch=gpu_batch, sagemaker=gpu_sagemaker)
    gpu_batch.emulator.create_environment(fair_share=True)
    gpu_sagemaker.ensure_buckets()
    _set_env(monkeypatch, world.env())
    try:
        yield world
    finally:
        world.release_spot()


@pytest.fixture(scope="session")
def gpu_ec2_emulator() -> Iterator[Ec2SpotEmulator]:
    """The EC2 spot signals emulator (placement scores, spot prices), one per test process."""
    from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator

    running = Ec2SpotEmulator.running()
    if running is not None:
        yield running
        return
    with Ec2SpotEmulator() as emulator:
        yield emulator


@pytest.fixture
def gpu_ec2_spot(gpu_ec2_emulator: Ec2SpotEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ec2SpotEmulator]:
    """The EC2 spot emulator for one test: ``aws_default`` points at it; no scores, prices or faults."""
    from gpu_provider.testing.worlds import aws_connection_env

    _set_env(monkeypatch, aws_connection_env(gpu_ec2_emulator.endpoint_url, gpu_ec2_emulator.region))
    gpu_ec2_emulator.reset()
    try:
        yield gpu_ec2_emulator
    finally:
        gpu_ec2_emulator.reset()


# --- Kubernetes ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gpu_kubernetes_emulator(gpu_job_cwd: Path) -> Iterator[KubernetesWorld]:
    """The fake Kubernetes API server and a kubeconfig pointing at it, one per test process."""
    from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator
    from gpu_provider.testing.worlds import KubernetesWorld

    with (
        tempfile.TemporaryDirectory(prefix="gpu-provider-k8s-") as folder,
        KubernetesEmulator(job_cwd=gpu_job_cwd, node_delay=0.3, start_delay=0.3, grace_period=2.0) as emulator,
    ):
        yield KubernetesWorld(emulator, emulator.kubeconfig(Path(folder) / "kubeconfig"))


@pytest.fixture
def gpu_kubernetes(
    gpu_kubernetes_emulator: KubernetesWorld, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubernetesWorld]:
    """The Kubernetes emulator for one test: ``KUBECONFIG`` and ``kubernetes_default`` point at it; faults,
    shortages and every pod, job and service left are cleared before and after."""
    _set_env(monkeypatch, gpu_kubernetes_emulator.connection_env())
    gpu_kubernetes_emulator.emulator.reset()
    try:
        yield gpu_kubernetes_emulator
    finally:
        gpu_kubernetes_emulator.emulator.reset()


# --- running DAGs ----------------------------------------------------------------------------------


@pytest.fixture
def gpu_dag_runner(gpu_airflow_home: Path, gpu_local: LocalWorld, tmp_path: Path) -> Iterator[DagRunner]:
    """Starts ``dag.test()`` children (Airflow home ``gpu_airflow_home``, local jobs in ``gpu_local``'s state
    directory, this test's environment: the connections other fixtures set); kills them and cancels their
    local jobs at teardown."""
    from gpu_provider.testing.dagrun import DagRunner

    runner = DagRunner(home=gpu_airflow_home, tmp=tmp_path / "gpu-dag-runs", state_dir=gpu_local.state_dir)
    runner.env["AIRFLOW__GPU_PROVIDER__POLL_INTERVAL"] = os.environ.get("AIRFLOW__GPU_PROVIDER__POLL_INTERVAL", "0.5")
    try:
        yield runner
    finally:
        runner.cleanup()


RunGpuDag = Callable[..., "DagRun"]
#: run_gpu_dag's default logical date: the time of the call
_NOW = "now"


@pytest.fixture
def run_gpu_dag(gpu_dag_runner: DagRunner, gpu_local: LocalWorld) -> RunGpuDag:
    """``run_gpu_dag(dag_file, dag_id=None, conf=None, interrupt=None, env=None, logical_date=<now>, timeout=300)``:
    run the DAG with ``dag.test()`` and return what each task did.

    :param interrupt: ``{"train": [30]}`` interrupts attempt 1 of task ``train`` (on the local backend)
        30 s after it starts; ``[30, 5]`` also attempt 2 after 5 s
    :param env: more environment for the run (e.g. the DAG's own settings)
    :param logical_date: ISO 8601; default: now, so each run has its own run id (the same date twice re-runs
        the same task instances, as clearing them would); ``None``: a run without a logical date or data
        interval, as the UI and the REST API trigger with ``logical_date: null``
    """

    def run(
        dag_file: str | os.PathLike[str],
        dag_id: str | None = None,
        *,
        conf: Mapping[str, Any] | None = None,
        interrupt: Mapping[str, Sequence[float]] | None = None,
        env: Mapping[str, str] | None = None,
        logical_date: str | None = _NOW,
        timeout: float = 300,
    ) -> DagRun:
        # a new run id for every run (unless asked): two runs never share a task instance or run-scoped paths
        when = datetime.now(timezone.utc).isoformat(timespec="microseconds") if logical_date == _NOW else logical_date
        with gpu_local.interrupt(dict(interrupt or {})):
            return gpu_dag_runner.run(dag_file, dag_id, conf=conf, extra_env=env, logical_date=when, timeout=timeout)

    return run


@pytest.fixture
def gpu_check(gpu_local: LocalWorld) -> Callable[..., CheckReport]:
    """``gpu_check(command, interrupt_after=3.0, ...)``: :func:`gpu_provider.testing.check.check_program`
    with this test's local state directory."""
    from gpu_provider.testing.check import check_program

    def check(command: Sequence[str], **kwargs: Any) -> CheckReport:
        kwargs.setdefault("state_dir", gpu_local.state_dir / "check")
        return check_program(command, **kwargs)

    return check
