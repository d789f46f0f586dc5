"""A local SageMaker (training jobs): each job's hosts run the job's command as local processes.

moto's SageMaker creates every training job already ``Completed``, never progresses it and has no
StopTrainingJob, so this emulator answers the training-job API itself (in front of moto, on the
shared :mod:`gpu_provider.testing.emulators.core` server: request log, faults) and leaves S3 and
CloudWatch Logs to moto:

* **CreateTrainingJob, DescribeTrainingJob, ListTrainingJobs, StopTrainingJob, AddTags, ListTags,
  DeleteTags** as SageMaker answers them (JSON 1.1), with the rules moto does not enforce answered
  ``ValidationException`` (HTTP 400): managed spot without ``MaxWaitTimeInSeconds`` or with one below
  ``MaxRuntimeInSeconds`` (or ``MaxWaitTimeInSeconds`` without spot); a ``ContainerEntrypoint``/
  ``ContainerArguments`` item over 256 characters; an ``Environment`` value over 512 characters or more
  than 100 variables; more than 50 tags or a tag value with characters SageMaker refuses; a
  ``CheckpointConfig.S3Uri`` that is not ``s3://``; StopTrainingJob of a job that is not InProgress.
  A name in use is ``ResourceInUse``. ListTrainingJobs filters (``NameContains``, ``StatusEquals``,
  ``LastModifiedTimeAfter``/``Before``, ``CreationTimeAfter``/``Before``), sorts (``SortBy``,
  ``SortOrder``) and then pages (``MaxResults``, default 10), as SageMaker does (moto pages first).
* **Time-based progression** with ``SecondaryStatusTransitions``: Starting -> Downloading -> Training
  -> Uploading -> Completed (or Failed with ``FailureReason`` ``AlgorithmError: , exit code: N``),
  about ``step_seconds`` apart; ``TrainingStartTime``/``TrainingEndTime``, ``TrainingTimeInSeconds``
  and ``BillableTimeInSeconds`` (spot: the training time less ``spot_discount``, which is how
  SageMaker reports the spot saving).
* **Hosts are processes**: ``InstanceCount`` processes (``algo-1``...), each with its own
  ``/opt/ml`` mapped to ``<job_root>/<job>/<host>/opt/ml`` (every ``/opt/ml`` in the command and the
  environment is rewritten), ``resourceconfig.json`` in ``/opt/ml/input/config``, ``SM_HOSTS``,
  ``SM_CURRENT_HOST``, ``TRAINING_JOB_NAME``, ``TRAINING_JOB_ARN`` and, as the stand-in for DNS of
  ``algo-1``, ``MASTER_ADDR=127.0.0.1`` where the request sets none. Any host exiting non-zero
  fails the job (the others are stopped). Each host's output goes, line by line, to CloudWatch Logs
  group ``/aws/sagemaker/TrainingJobs``, stream ``<job>/algo-<n>-<epoch>`` (a new one per restart).
* **CheckpointConfig**: the S3 URI is copied into every host's checkpoint folder before the
  training starts, and each host's folder is copied to S3 while it trains and when it stops (files
  that changed, ``LATEST`` last). The model folder of ``algo-1`` is uploaded as
  ``<S3OutputPath>/<job>/output/model.tar.gz`` (``ModelArtifacts``).
* **StopTrainingJob** stops the hosts (SIGTERM, SIGKILL after ``grace_period``): Stopping -> Stopped.
  ``MaxRuntimeInSeconds`` (training time) ends the job Stopped/MaxRuntimeExceeded; a spot job still
  not done ``MaxWaitTimeInSeconds`` after its creation ends Stopped/MaxWaitTimeExceeded.
* **Faults** (from tests): :meth:`~SageMakerEmulator.hold` / :meth:`~SageMakerEmulator.release`
  (no capacity: jobs wait in Starting), :meth:`~SageMakerEmulator.interrupt` and
  :meth:`~SageMakerEmulator.interrupt_after` (a managed-spot reclaim: the hosts are stopped, the
  checkpoints synced, an ``Interrupted`` transition added, and the job restarts from Starting, as
  SageMaker does), :meth:`~SageMakerEmulator.fail` (Failed with a given ``FailureReason``, e.g. ``CapacityError: ...``),
  :meth:`~SageMakerEmulator.forget`, :meth:`~SageMakerEmulator.unlist`,
  :meth:`~SageMakerEmulator.modified_with_status_only` (``LastModifiedTime``
  moves only with ``TrainingJobStatus``),
  :meth:`~SageMakerEmulator.report_status`, and the core's throttling and lost responses.

The parts: the job runner (progression, host processes, logs, checkpoints) is
:mod:`~gpu_provider.testing.emulators.aws_sagemaker_jobs`, the API (routing, the actions, the rules above)
:mod:`~gpu_provider.testing.emulators.aws_sagemaker_api`; what the AWS emulators share (one per process, the
server, the request log and the faults) is :mod:`~gpu_provider.testing.emulators.aws_common` and
:mod:`~gpu_provider.testing.emulators.core`.

Command line, for ``make demo``::

    python -m gpu_provider.testing.emulators.aws_sagemaker serve --port 0 --job-root DIR --job-cwd DIR --ready-file PATH
        [--interrupt-after SECONDS --interrupt-name-contains train --interrupt-count 1]
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

from moto.core import DEFAULT_ACCOUNT_ID

from gpu_provider.testing.emulators.aws_common import OnePerProcess, ServiceKnobs, serve_parser, serve_until_signalled
from gpu_provider.testing.emulators.aws_sagemaker_api import (
    HANDLED,
    ApiError,
    SageMakerApi,
    _action_of,
    _error_style,
    _SageMakerApp,
)
from gpu_provider.testing.emulators.aws_sagemaker_jobs import JobRunner, TrainingJob
from gpu_provider.testing.emulators.core import Faults, RecordingMotoServer, RequestLog, kill_group

__all__ = ["HANDLED", "ROLE_ARN", "ApiError", "SageMakerEmulator", "main"]

logger = logging.getLogger(__name__)

ROLE_ARN = f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/gpu-sagemaker-job"


class SageMakerEmulator(OnePerProcess, ServiceKnobs, SageMakerApi, JobRunner):
    """SageMaker training jobs on a moto server, each host a local process.

    :param port: TCP port on 127.0.0.1; 0 picks a free one (see :attr:`endpoint_url`).
    :param job_root: folder under which each job's hosts get their ``/opt/ml``.
    :param job_cwd: working directory of the host processes (default: the current directory).
    :param step_seconds: time between two secondary statuses before and after training.
    :param grace_period: seconds between SIGTERM and SIGKILL when hosts are stopped.
    :param spot_discount: the share of a spot job's training time SageMaker does not bill.
    """

    _one_of: ClassVar[str] = "sagemaker"
    _title: ClassVar[str | None] = "SageMaker emulator"

    def __init__(
        self,
        *,
        job_root: str | os.PathLike[str],
        port: int = 0,
        job_cwd: str | os.PathLike[str] | None = None,
        step_seconds: float = 0.3,
        grace_period: float = 3.0,
        region: str = "us-east-1",
        spot_discount: float = 0.7,
    ) -> None:
        self.job_root = Path(job_root)
        self.port = port
        self.job_cwd = Path(job_cwd) if job_cwd is not None else None
        self.step_seconds = step_seconds
        self.grace_period = grace_period
        self.region = region
        self.spot_discount = spot_discount
        self.endpoint_url = ""
        self._server: RecordingMotoServer | None = None
        self._faults = Faults()
        self._log = RequestLog()
        self._lock = threading.RLock()
        self._jobs: dict[str, TrainingJob] = {}
        self._held: set[str] = set()  # "spot", "on-demand"
        self._reported: dict[str, tuple[str, str]] = {}
        self._interrupt_rules: list[dict[str, Any]] = []
        self._s3: Any = None
        self._wait_clock = 1.0
        self._status_only_modified = False
        self._unlisted: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        self._start_server(
            self.port,
            app=lambda app: _SageMakerApp(self, app),
            action_of=_action_of,
            error_style=_error_style,
            faults=self._faults,
            log=self._log,
        )
        self._s3 = self.client("s3")

    def _stop(self) -> None:
        """Kill every host process and stop the server. Leaves moto's other state alone."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.hurry.set()
            job.stop_kind = job.stop_kind or "stop"
            job.alert()
        for job in jobs:
            for host in job.hosts:
                kill_group(host.proc, signal.SIGKILL)
        for job in jobs:
            if job.thread is not None:
                job.thread.join(10)
        self._stop_server()

    def create_bucket(self, bucket: str) -> None:
        with contextlib.suppress(self._s3.exceptions.BucketAlreadyOwnedByYou):
            self._s3.create_bucket(Bucket=bucket)

    # ------------------------------------------------------------------ faults and inspection

    def hold(self, capacity: str = "spot", *, instance_type: str | None = None) -> None:
        """Jobs of ``capacity`` (``spot``, ``on-demand``, or ``"*"`` for both) wait in Starting until
        :meth:`release`; with ``instance_type`` (``ml.p5.48xlarge``), only jobs on that instance type."""
        with self._lock:
            self._held.add(f"{capacity}|{instance_type}" if instance_type else capacity)

    def release(self, capacity: str | None = None, *, instance_type: str | None = None) -> None:
        with self._lock:
            if capacity is None:
                self._held.clear()
            else:
                self._held.discard(f"{capacity}|{instance_type}" if instance_type else capacity)
        self._nudge_waiting()

    def interrupt(self, name: str, *, restart: bool = True) -> None:
        """Reclaim a managed-spot job's instances now: SageMaker restarts it from its checkpoint, or with
        ``restart=False`` the job ends there (Stopped/Interrupted), as when it cannot come back."""
        job = self._job(name)
        if not job.spot:
            raise ValueError(f"training job {name} is not a managed spot job: nothing reclaims its instances")
        with self._lock:
            if job.stop_kind is None:
                job.stop_kind = "interrupt" if restart else "reclaim"
        job.alert()

    def interrupt_after(
        self, seconds: float, *, name_contains: str | None = None, count: int = 1, checkpointed: bool = False
    ) -> None:
        """Interrupt the next ``count`` spot jobs (named with ``name_contains``) ``seconds`` into their training;
        with ``checkpointed``, not before the job's first checkpoint (a ``LATEST`` file) was copied to S3, so
        a test of resuming does not depend on how fast a loaded machine starts the training."""
        with self._lock:
            self._interrupt_rules.append(
                {"after": seconds, "contains": name_contains, "left": count, "checkpointed": checkpointed}
            )

    def wait_clock(self, factor: float) -> None:
        """Run the clock of ``MaxWaitTimeInSeconds`` ``factor`` times faster (1: real time), so a test sees
        SageMaker give a spot job up (MaxWaitTimeExceeded) without waiting its limit out."""
        with self._lock:
            self._wait_clock = float(factor)
        self._nudge_waiting()

    def modified_with_status_only(self, on: bool = True) -> None:
        """While on, ``LastModifiedTime`` (DescribeTrainingJob, ListTrainingJobs and its
        ``LastModifiedTimeAfter`` filter) moves only when ``TrainingJobStatus`` changes, not with
        ``SecondaryStatus`` alone (an ``Interrupted`` inside ``InProgress``): AWS does not document
        which it does, so a client must work either way."""
        with self._lock:
            self._status_only_modified = bool(on)

    def unlist(self, name_contains: str) -> None:
        """ListTrainingJobs leaves out the jobs whose names contain ``name_contains`` (DescribeTrainingJob and
        CreateTrainingJob still know them), as an eventually consistent listing can just after a create."""
        with self._lock:
            self._unlisted.append(name_contains)

    def _modified(self, job: TrainingJob) -> float:
        return job.status_modified if self._status_only_modified else job.last_modified

    def fail(self, name: str, reason: str) -> None:
        """End a job Failed now with ``reason`` as its FailureReason (an internal error, say)."""
        job = self._job(name)
        with self._lock:
            job.stop_kind, job.fail_reason = "fail", reason
        job.alert()

    def backdate(self, name: str, seconds: float) -> None:
        """Move a job's clock ``seconds`` back: it was created, and started training, that much earlier
        (a long job seen without waiting it out)."""
        job = self._job(name)
        with self._lock:
            job.created -= seconds
            if job.training_start is not None:
                job.training_start -= seconds
            job.training_seconds += seconds if job.training_start is not None else 0.0
            for transition in job.transitions:
                for key in ("StartTime", "EndTime"):
                    if key in transition:
                        transition[key] -= seconds
        job.nudge.set()

    def forget(self, name: str) -> None:
        with self._lock:
            self._jobs.pop(name, None)

    def report_status(self, name: str, status: str | None, secondary: str | None = None) -> None:
        """DescribeTrainingJob answers this status pair for the job (``None``: the truth again)."""
        with self._lock:
            if status is None:
                self._reported.pop(name, None)
            else:
                self._reported[name] = (status, secondary or status)

    def reset_faults(self) -> None:
        self._faults.reset()
        with self._lock:
            self._held.clear()
            self._reported.clear()
            self._interrupt_rules.clear()
            self._wait_clock = 1.0
            self._status_only_modified = False
            self._unlisted.clear()
        self._nudge_waiting()

    def job(self, name: str) -> TrainingJob:
        return self._job(name)

    def host_pids(self, name: str) -> list[int]:
        return [h.proc.pid for h in self._job(name).hosts if h.proc is not None and h.alive()]

    def stop_all(self, reason: str = "test teardown") -> None:
        """Stop every job still in progress (a fixture's teardown)."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.status == "InProgress"]
            for job in jobs:
                job.stop_kind = job.stop_kind or "stop"
                job.alert()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(self.grace_period + 5)

    def _job(self, name: str) -> TrainingJob:
        with self._lock:
            job = self._jobs.get(name)
        if job is None:
            raise KeyError(f"no training job {name!r} in the SageMaker emulator")
        return job


# ---------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser, serve = serve_parser(
        "gpu_provider.testing.emulators.aws_sagemaker",
        __doc__,
        help="run the emulator until SIGTERM/SIGINT",
        ready_help="write the endpoint here (JSON) once ready",
    )
    serve.add_argument("--job-root", required=True, help="folder of the jobs' /opt/ml folders")
    serve.add_argument("--bucket", action="append", default=[], help="create this S3 bucket (repeatable)")
    serve.add_argument("--interrupt-after", type=float, default=None, metavar="SECONDS")
    serve.add_argument("--interrupt-name-contains", default=None)
    serve.add_argument("--interrupt-count", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logger.setLevel(logging.INFO)
    emulator = SageMakerEmulator(
        port=args.port,
        job_root=args.job_root,
        job_cwd=args.job_cwd,
        step_seconds=args.step_seconds,
        grace_period=args.grace_period,
        region=args.region,
    )

    def prepare() -> dict[str, Any]:
        for bucket in args.bucket:
            emulator.create_bucket(bucket)
        if args.interrupt_after is not None:
            emulator.interrupt_after(
                args.interrupt_after, name_contains=args.interrupt_name_contains, count=args.interrupt_count
            )
        return {"role_arn": ROLE_ARN}

    return serve_until_signalled(emulator, args.ready_file, prepare, title="SageMaker emulator")


if __name__ == "__main__":
    sys.exit(main())
