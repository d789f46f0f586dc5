"""``gpu-provider emulator batch|sagemaker|kubernetes|ec2``: start one emulator and print the settings to paste.

Each emulator runs in this process on 127.0.0.1 until Ctrl-C (SIGINT) or SIGTERM, then stops its jobs.
Once it is ready it prints the environment that points Airflow (scheduler, triggerer, workers, ``airflow
dags test``) and the provider at it, as ``export`` lines, and the same connection as an ``airflow
connections add`` command; ``--settings-file PATH`` also writes the ``export`` lines there, to
``source``. Jobs run as local processes in ``--job-cwd`` (default: the current folder), so the job
programs must be importable from there (``pip install 'airflow-provider-gpu[examples]'``).

Needs the ``testing`` extra (moto, and the kubernetes client for the Kubernetes emulator).
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

KINDS = ("batch", "sagemaker", "kubernetes", "ec2")
#: dummy credentials: botocore signs every request, the emulators check none
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "emulator", "AWS_SECRET_ACCESS_KEY": "emulator"}
#: the buckets the SageMaker emulator creates: model artifacts and checkpoints
SAGEMAKER_BUCKETS = ("gpu-models", "gpu-checkpoints")


def stop_event(signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """An event the first of ``signals`` sets: an emulator's command runs until it is set."""
    stop = threading.Event()
    for sig in signals:
        signal.signal(sig, lambda *_: stop.set())
    return stop


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a reader waiting for the file never sees half of it."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


def _aws_connection(endpoint_url: str, region: str) -> dict[str, Any]:
    return {"conn_type": "aws", "extra": {"endpoint_url": endpoint_url, "region_name": region}}


def _start(kind: str, args: argparse.Namespace) -> tuple[AbstractContextManager[Any], dict[str, str], str, str]:
    """The started emulator, its settings, the connection id they define, and a line saying what it serves."""
    folder = Path(args.dir or Path.cwd() / ".gpu-provider-emulators" / kind).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    settings: dict[str, str] = {}
    if kind == "batch":
        from gpu_provider.testing.emulators.aws_batch import BatchEmulator

        batch = BatchEmulator(port=args.port, job_cwd=args.job_cwd, region=args.region).start()
        setup = batch.create_environment(fair_share=True)
        settings["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(_aws_connection(batch.endpoint_url, args.region))
        settings.update(CREDENTIALS, AWS_DEFAULT_REGION=args.region)
        settings["AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE"] = setup.spot_queue
        settings["AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE"] = setup.on_demand_queue
        # the example pipeline's stages on a container backend name an image (the emulator runs the command)
        settings["GPU_PIPELINE_IMAGE"] = "gpu-pipeline:emulator"
        what = f"AWS Batch emulator at {batch.endpoint_url} (queues {setup.spot_queue}, {setup.on_demand_queue})"
        return _Stopping(batch), settings, "aws_default", what
    if kind == "sagemaker":
        from gpu_provider.testing.emulators.aws_sagemaker import ROLE_ARN, SageMakerEmulator

        sagemaker = SageMakerEmulator(
            port=args.port, job_root=folder / "jobs", job_cwd=args.job_cwd, region=args.region
        ).start()
        for bucket in SAGEMAKER_BUCKETS:
            sagemaker.create_bucket(bucket)
        settings["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(_aws_connection(sagemaker.endpoint_url, args.region))
        settings.update(CREDENTIALS, AWS_DEFAULT_REGION=args.region)
        settings["AIRFLOW__GPU_PROVIDER__SAGEMAKER_ROLE_ARN"] = ROLE_ARN
        settings["AIRFLOW__GPU_PROVIDER__SAGEMAKER_OUTPUT_PATH"] = f"s3://{SAGEMAKER_BUCKETS[0]}/models"
        # SageMaker syncs checkpoints with S3 only: the example pipeline's checkpoints go to the emulator's S3
        settings["GPU_PIPELINE_CHECKPOINT_ROOT"] = f"s3://{SAGEMAKER_BUCKETS[1]}/gpu_pipeline"
        settings["GPU_PIPELINE_IMAGE"] = "gpu-pipeline:emulator"
        what = f"SageMaker emulator at {sagemaker.endpoint_url} (S3 buckets {', '.join(SAGEMAKER_BUCKETS)})"
        return _Stopping(sagemaker), settings, "aws_default", what
    if kind == "kubernetes":
        from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator

        kubernetes = KubernetesEmulator(port=args.port, job_cwd=args.job_cwd).start()
        kubeconfig = kubernetes.kubeconfig(folder / "kubeconfig")
        connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}
        settings["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(connection)
        settings["KUBECONFIG"] = str(kubeconfig)
        # inference and evaluation of the example share a GPU through a MIG slice (the emulator grants any)
        settings["AIRFLOW__GPU_PROVIDER__KUBERNETES_FRACTIONAL_GPU_RESOURCE"] = "nvidia.com/mig-1g.10gb"
        settings["GPU_PIPELINE_IMAGE"] = "gpu-pipeline:emulator"
        what = f"Kubernetes emulator at {kubernetes.url} (kubeconfig {kubeconfig})"
        return _Stopping(kubernetes), settings, "kubernetes_default", what
    from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator

    ec2 = Ec2SpotEmulator(port=args.port, region=args.region).start()
    settings["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(_aws_connection(ec2.endpoint_url, args.region))
    settings.update(CREDENTIALS, AWS_DEFAULT_REGION=args.region)
    what = (
        f"EC2 spot emulator at {ec2.endpoint_url} (spot placement scores and prices: every region scores 1 "
        "until set with Ec2SpotEmulator.set_scores)"
    )
    return _Stopping(ec2), settings, "aws_default", what


class _Stopping(AbstractContextManager[Any]):
    """Stops a started emulator on exit (its jobs too, for those that run jobs)."""

    def __init__(self, emulator: Any) -> None:
        self.emulator = emulator

    def __exit__(self, *exc: object) -> None:
        stop_all = getattr(self.emulator, "stop_all", None)
        if callable(stop_all):
            stop_all("emulator stopped")
        self.emulator.stop()


def settings_text(settings: dict[str, str], conn_id: str) -> str:
    """The ``export`` lines, and the connection as an ``airflow connections add`` command (commented)."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in settings.items()]
    variable = "AIRFLOW_CONN_" + conn_id.upper()
    if variable in settings:
        connection = json.loads(settings[variable])
        add = (
            f"airflow connections add {conn_id} --conn-type {connection['conn_type']} "
            f"--conn-extra {shlex.quote(json.dumps(connection['extra']))}"
        )
        lines.append(f"# or, instead of {variable}, in the metadata DB: {add}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None, prog: str = "gpu-provider emulator") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("kind", choices=KINDS, help="which emulator")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default 0: a free one)")
    parser.add_argument("--region", default="us-east-1", help="AWS region of the AWS emulators (default us-east-1)")
    parser.add_argument("--job-cwd", default=None, help="working folder of the jobs' processes (default: here)")
    parser.add_argument(
        "--dir",
        default=None,
        help="the emulator's files (kubeconfig, SageMaker's /opt/ml folders); default: ./.gpu-provider-emulators/KIND",
    )
    parser.add_argument("--settings-file", default=None, help="also write the export lines here once ready")
    args = parser.parse_args(argv)
    if args.port < 0 or args.port > 65535:
        parser.error(f"--port {args.port}: give 0 (a free port) or a port from 1 to 65535")
    stop = stop_event()
    try:
        running, settings, conn_id, what = _start(args.kind, args)
    except OSError as err:
        print(f"gpu-provider emulator: error: could not start the {args.kind} emulator: {err}", file=sys.stderr)
        return 1
    with running:
        text = settings_text(settings, conn_id)
        print(f"{what}. Ctrl-C stops it.", flush=True)
        print("# Paste into the environment of Airflow (scheduler, triggerer, workers, airflow dags test):")
        print(text, end="", flush=True)
        if args.settings_file:
            write_atomically(Path(args.settings_file), text)
        stop.wait()
    print(f"{args.kind} emulator stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
