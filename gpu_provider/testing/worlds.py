"""What the pytest fixtures hand a test: each emulated service with its setup, the environment that
points Airflow's connections at it, and the helpers a test uses to inject faults.

Importing this module imports no moto, boto3 or emulator (the emulator types are for type checkers
only); the plugin's fixtures start the emulators, which needs the ``[testing]`` extra.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_provider.testing.dagrun import DagRun, DagRunner, Interrupter

if TYPE_CHECKING:
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.testing.emulators.aws_batch import BatchEmulator, BatchSetup
    from gpu_provider.testing.emulators.aws_sagemaker import SageMakerEmulator
    from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator

#: the buckets the SageMaker world creates: models (``output_path``) and checkpoints
OUTPUT_BUCKET = "gpu-sagemaker-output"
CHECKPOINT_BUCKET = "gpu-sagemaker-checkpoints"


def aws_connection_env(endpoint_url: str, region: str, conn_id: str = "aws_default") -> dict[str, str]:
    """Environment that points the Airflow AWS connection ``conn_id`` (and boto3) at an emulator."""
    extra = {"endpoint_url": endpoint_url, "region_name": region}
    return {
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps({"conn_type": "aws", "extra": extra}),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": region,
    }


def _options_source(kind: str, options: dict[str, Any]) -> str:
    return f"{kind}({', '.join(f'{k}={v!r}' for k, v in options.items())})"


@dataclass
class BatchWorld:
    """The AWS Batch emulator with a spot queue, an on-demand queue and a fair-share queue."""

    emulator: BatchEmulator
    setup: BatchSetup

    @property
    def queues(self) -> dict[str, str]:
        return {"spot_queue": self.setup.spot_queue, "on_demand_queue": self.setup.on_demand_queue}

    def connection_env(self, conn_id: str = "aws_default") -> dict[str, str]:
        return aws_connection_env(self.emulator.endpoint_url, self.emulator.region, conn_id)

    def backend_source(self, **options: Any) -> str:
        """Python source of a BatchBackend for a DAG file."""
        return _options_source("BatchBackend", {**self.queues, **options})

    def bodies(self, action: str) -> list[dict[str, Any]]:
        """Bodies of the requests of one action the server accepted (throttled ones left out)."""
        return [r["body"] for r in self.emulator.requests(action) if not r["throttled"]]

    def describe(self, job_id: str) -> dict[str, Any]:
        jobs = self.emulator.client("batch").describe_jobs(jobs=[job_id])["jobs"]
        return dict(jobs[0])

    def active_jobs(self) -> list[dict[str, Any]]:
        """Summaries of the jobs not yet ended, in every queue."""
        client = self.emulator.client("batch")
        queues = [q for q in (self.setup.spot_queue, self.setup.on_demand_queue, self.setup.fair_share_queue) if q]
        return [
            job
            for queue in queues
            for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
            for job in client.list_jobs(jobQueue=queue, jobStatus=status).get("jobSummaryList", [])
        ]

    def terminate_all(self, reason: str = "test teardown") -> None:
        client = self.emulator.client("batch")
        for job in self.active_jobs():
            client.terminate_job(jobId=job["jobId"], reason=reason)


@dataclass
class SageMakerWorld:
    """The SageMaker emulator (training jobs whose hosts run as local processes; S3 and logs on moto)."""

    emulator: SageMakerEmulator

    @property
    def options(self) -> dict[str, Any]:
        from gpu_provider.testing.emulators.aws_sagemaker import ROLE_ARN

        return {"role_arn": ROLE_ARN, "output_path": f"s3://{OUTPUT_BUCKET}/models"}

    def connection_env(self, conn_id: str = "aws_default") -> dict[str, str]:
        return aws_connection_env(self.emulator.endpoint_url, self.emulator.region, conn_id)

    def backend_source(self, **options: Any) -> str:
        """Python source of a SageMakerBackend for a DAG file."""
        return _options_source("SageMakerBackend", {**self.options, **options})

    def bodies(self, action: str) -> list[dict[str, Any]]:
        """Bodies of the requests of one action the server accepted (throttled ones left out)."""
        return [r["body"] for r in self.emulator.requests(action) if not r["throttled"]]

    def describe(self, name: str) -> dict[str, Any]:
        return dict(self.emulator.client("sagemaker").describe_training_job(TrainingJobName=name))

    def ensure_buckets(self) -> None:
        for bucket in (OUTPUT_BUCKET, CHECKPOINT_BUCKET):
            self.emulator.create_bucket(bucket)


@dataclass
class KubernetesWorld:
    """The fake Kubernetes API server (spot and on-demand Karpenter nodes, pods as local processes) and a
    kubeconfig pointing at it."""

    emulator: KubernetesEmulator
    kubeconfig: Path

    def connection_env(self) -> dict[str, str]:
        """Environment that points Airflow's kubernetes_default connection (and ``KUBECONFIG``) at the emulator."""
        extra = {"kube_config_path": str(self.kubeconfig)}
        return {
            "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps({"conn_type": "kubernetes", "extra": extra}),
            "KUBECONFIG": str(self.kubeconfig),
        }

    def count(self, action: str) -> int:
        return sum(1 for r in self.emulator.requests(action) if not r["throttled"])

    def bodies(self, action: str) -> list[dict[str, Any]]:
        return [r["body"]["body"] for r in self.emulator.requests(action) if not r["throttled"]]

    def disrupt_node(self, pod_name: str, namespace: str = "default") -> str:
        """Take back the spot node ``pod_name`` runs on, as Karpenter does on a spot interruption: its pods
        get a ``DisruptionTarget`` condition and are stopped. Returns the node's name."""
        return self.emulator.reclaim(pod_name, namespace)

    def evict(self, pod_name: str, shape: str, namespace: str = "default") -> None:
        """End a running pod with one eviction shape (``pod-storage-limit``, ``memory-over-request``,
        ``memory-pressure``, ``preemption``, ...: see :meth:`KubernetesEmulator.evict`)."""
        self.emulator.evict(pod_name, shape, namespace)

    def disrupt_after(self, seconds: float, *, name_contains: str = "", count: int = 1) -> None:
        """Take back the spot node of the next ``count`` pods whose name holds ``name_contains``,
        ``seconds`` after each starts."""
        self.emulator.reclaim_after(seconds, name_contains=name_contains, count=count)

    def hold_spot(self, held: bool = True) -> None:
        """No new spot node comes up while held (pods asking for spot stay ``Pending``)."""
        self.emulator.set_shortage("spot", held)


@dataclass
class AwsWorld:
    """``gpu_aws``: AWS Batch (spot and on-demand queues) and SageMaker on the emulators, and the Airflow
    connections pointing at them: ``aws_default`` (SageMaker, S3) and ``aws_batch`` (Batch, set as
    ``[gpu_provider] batch_aws_conn_id``), with the queues, role and output path in the provider's config."""

    batch: BatchWorld
    sagemaker: SageMakerWorld

    def env(self) -> dict[str, str]:
        """The environment a test (and the ``dag.test()`` child of ``run_gpu_dag``) runs with."""
        env = {**self.sagemaker.connection_env("aws_default"), **self.batch.connection_env("aws_batch")}
        env.update(
            {
                "AIRFLOW__GPU_PROVIDER__BATCH_AWS_CONN_ID": "aws_batch",
                "AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE": self.batch.setup.spot_queue,
                "AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE": self.batch.setup.on_demand_queue,
                "AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN": self.sagemaker.options["role_arn"],
                "AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH": self.sagemaker.options["output_path"],
            }
        )
        return env

    @property
    def checkpoint_bucket(self) -> str:
        return CHECKPOINT_BUCKET

    def reclaim_spot(self, job: str) -> None:
        """Reclaim the spot capacity under a running job now: a Batch job id (it ends FAILED with
        ``Host EC2 (instance ...) terminated.``) or a SageMaker training job name (managed spot: an
        ``Interrupted`` transition, then SageMaker restarts it)."""
        if self._is_batch_job(job):
            self.batch.emulator.preempt(job)
        else:
            self.sagemaker.emulator.interrupt(job)

    def reclaim_spot_after(self, seconds: float, *, name_contains: str | None = None, count: int = 1) -> None:
        """Reclaim the next ``count`` spot jobs (Batch, on the spot queue; SageMaker, on managed spot) whose
        name holds ``name_contains``, ``seconds`` after each starts running."""
        self.batch.emulator.preempt_after(
            seconds, queue=self.batch.setup.spot_queue, count=count, name_contains=name_contains
        )
        self.sagemaker.emulator.interrupt_after(seconds, name_contains=name_contains, count=count)

    def hold_spot(self) -> None:
        """No spot capacity until :meth:`release_spot`: spot jobs stay queued (Batch RUNNABLE, SageMaker Starting)."""
        self.batch.emulator.hold(self.batch.setup.spot_queue, "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY")
        self.sagemaker.emulator.hold("spot")

    def release_spot(self) -> None:
        self.batch.emulator.release(self.batch.setup.spot_queue)
        self.sagemaker.emulator.release("spot")

    def throttle(self, action: str, every: int = 2) -> None:
        """Answer every ``every``-th request of ``action`` (``DescribeJobs``, ``DescribeTrainingJob``...)
        with a throttling error, on both services."""
        self.batch.emulator.throttle(action, every)
        self.sagemaker.emulator.throttle(action, every)

    def _is_batch_job(self, job: str) -> bool:
        try:
            return bool(self.batch.emulator.client("batch").describe_jobs(jobs=[job])["jobs"])
        except Exception:  # not a Batch job id
            return False


@dataclass
class LocalWorld:
    """``gpu_local``: the local backend with a temporary state directory and fake GPUs.

    DAG tasks that use ``backend="local"`` (or a ``LocalBackend`` without ``state_dir``) run with this
    state directory when run through ``run_gpu_dag``; :meth:`backend` builds one for direct use.
    """

    state_dir: Path
    gpus: Sequence[int] = (0, 1)
    grace_period: float = 2.0
    interrupters: list[Interrupter] = field(default_factory=list)

    def backend(self, **options: Any) -> LocalBackend:
        """A ``LocalBackend`` on this state directory with the fake GPUs (``CUDA_VISIBLE_DEVICES`` set to
        them; nothing asks ``nvidia-smi``); ``simulate_preemptions=[8]`` interrupts spot attempts."""
        from gpu_provider.backends.local import LocalBackend

        defaults: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "gpus": list(self.gpus),
            "grace_period": self.grace_period,
        }
        return LocalBackend(**{**defaults, **options})

    def backend_source(self, **options: Any) -> str:
        """Python source of the same backend, for a DAG file."""
        defaults = {"state_dir": str(self.state_dir), "gpus": list(self.gpus), "grace_period": self.grace_period}
        return _options_source("LocalBackend", {**defaults, **options})

    def interrupt(self, plan: dict[str, Sequence[float]]) -> Interrupter:
        """Interrupt jobs of this state directory while a DAG runs: ``{"train": [30]}`` interrupts attempt 1
        of task ``train`` 30 s after it starts (see :class:`~gpu_provider.testing.dagrun.Interrupter`).
        Use as a context manager around the run, or let the fixture stop it at teardown."""
        interrupter = Interrupter(self.state_dir, plan)
        self.interrupters.append(interrupter)
        return interrupter

    def jobs(self) -> list[Any]:
        """The handles of every job in the state directory, oldest first."""
        return self.backend().list_jobs() if self.state_dir.exists() else []

    def env(self) -> dict[str, str]:
        return {"AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(self.state_dir)}


__all__ = [
    "CHECKPOINT_BUCKET",
    "OUTPUT_BUCKET",
    "AwsWorld",
    "BatchWorld",
    "DagRun",
    "DagRunner",
    "KubernetesWorld",
    "LocalWorld",
    "SageMakerWorld",
    "aws_connection_env",
]
