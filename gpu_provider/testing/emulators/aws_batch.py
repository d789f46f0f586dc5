"""A local AWS Batch: moto in server mode, with each job's container command run as a local process.

What it adds to moto (moto 5.2.5; everything is undone by :meth:`BatchEmulator.stop`):

* **Jobs are real processes.** moto's ``Job.run`` (which would start a Docker container) is replaced:
  the job's command (job definition command, submit-time overrides and ``Ref::`` parameters applied)
  runs with :func:`subprocess.Popen` in its own session, in ``job_cwd``. The image is ignored.
  States advance SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING about ``step_seconds`` apart,
  then SUCCEEDED (exit 0) or FAILED (``statusReason`` "Essential container in task exited",
  ``container.exitCode`` set, ``128 + signal`` for a process killed by a signal).
* **Environment** of a job process: a minimal base (``PATH`` with this interpreter's directory first,
  so ``python`` is the emulator's Python; ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR``, ``PYTHONPATH`` if
  set; ``PYTHONUNBUFFERED=1``, as most Python images set), then, if ``job_aws_env``, what the job's
  task role and region would give it (``AWS_ENDPOINT_URL`` = this emulator, dummy credentials,
  ``AWS_REGION``/``AWS_DEFAULT_REGION``), then the job definition's environment, the submit-time
  overrides, and Batch's own variables (``AWS_BATCH_JOB_ID``, ``AWS_BATCH_JQ_NAME``,
  ``AWS_BATCH_CE_NAME``, ``AWS_BATCH_JOB_ATTEMPT=1``, ``AWS_BATCH_JOB_ARRAY_INDEX`` for array children).
* **Logs** go to moto's CloudWatch Logs, group ``/aws/batch/job``, one stream per container named like
  Batch's ``<jobDefinitionName>/default/<ecs task id>``, line by line while the job runs. The stream is
  ``container.logStreamName`` and ``attempts[-1].container.logStreamName`` of DescribeJobs.
* **Multi-node parallel jobs** run ``numNodes`` processes (``nodeOverrides`` applied, which moto ignores),
  with ``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_NODE_INDEX``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` and,
  on the other nodes only, ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=127.0.0.1``; each node's
  ``AWS_BATCH_JOB_ID`` is ``<jobId>#<node>``. The main node's exit decides the job; when it exits the
  other nodes are stopped (SIGTERM, SIGKILL after ``grace_period``). Each node has its own log stream:
  DescribeJobs on ``<jobId>#<node>`` (and ListJobs ``multiNodeJobId``) shows it; the parent job's
  ``container.logStreamName`` and attempt show the main node's stream.
* **TerminateJob** (any state) and **CancelJob** (SUBMITTED, PENDING, RUNNABLE only, as in real Batch;
  a no-op later) fail the job with the given reason; running processes get SIGTERM to their process
  groups, SIGKILL after ``grace_period``. ``timeout.attemptDurationSeconds`` is enforced the same way.
* **Fault injection:** :meth:`~BatchEmulator.hold` / :meth:`~BatchEmulator.release` (no capacity),
  :meth:`~BatchEmulator.preempt` / :meth:`~BatchEmulator.preempt_after` (spot reclaim: FAILED with
  "Host EC2 (instance i-...) terminated."), :meth:`~BatchEmulator.throttle` and
  :meth:`~BatchEmulator.throttle_bursts` (HTTP 429 ``TooManyRequestsException``, as Batch throttles; any
  action, or ``"*"``), :meth:`~BatchEmulator.lose_response` (the request is carried out, then answered
  with HTTP 500 or a closed connection), :meth:`~BatchEmulator.forget` (a job Batch no
  longer returns), :meth:`~BatchEmulator.report_status` (DescribeJobs answers a state of your choice),
  :meth:`~BatchEmulator.set_status_reason` and ``hold(queue, reason=...)`` (the ``statusReason`` of a
  RUNNABLE job: ``CAPACITY:...``, ``MISCONFIGURATION:...``).
* **Request log:** every Batch and CloudWatch Logs request, parsed, see :meth:`~BatchEmulator.requests`.
* **Real-Batch rules moto does not enforce** are answered with ``ClientException`` (HTTP 400): more than 100 ids
  in DescribeJobs; SubmitJob to a fair-share queue without ``shareIdentifier`` or without a scheduling priority
  (job definition ``schedulingPriority`` or ``schedulingPriorityOverride``);
  ``shareIdentifier``/``schedulingPriorityOverride`` on a queue without a scheduling policy; more than one
  ListJobs filter; SubmitJob on a job definition revision that is not ACTIVE (deregistered). ListJobs without
  ``jobStatus`` or filters returns RUNNING jobs only, filtered results come newest first and leave out array
  children (moto: every status, queue order).

The parts: the job runner (states, processes, logs, multi-node views) is
:mod:`~gpu_provider.testing.emulators.aws_batch_jobs`, the API side (routing, moto's patches, the rules above)
:mod:`~gpu_provider.testing.emulators.aws_batch_api`, the queues and compute environments
:mod:`~gpu_provider.testing.emulators.aws_batch_setup`; what the AWS emulators share (one per process, the
server, the request log and the faults) is :mod:`~gpu_provider.testing.emulators.aws_common` and
:mod:`~gpu_provider.testing.emulators.core`.

Command line, for ``make demo``::

    python -m gpu_provider.testing.emulators.aws_batch serve --port 0 --job-cwd DIR --ready-file PATH [--fair-share]
        [--preempt-after SECONDS --preempt-queue gpu-spot --preempt-name-contains train --preempt-count 1]
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from moto.moto_api import state_manager

from gpu_provider.testing.emulators.aws_batch_api import MAX_DESCRIBE_JOBS, BatchApi, _batch_routes, _error_style
from gpu_provider.testing.emulators.aws_batch_jobs import JobRun, JobRunner, job_state
from gpu_provider.testing.emulators.aws_batch_setup import (
    FAIR_SHARE_QUEUE,
    ON_DEMAND_QUEUE,
    SPOT_QUEUE,
    BatchEnvironment,
    BatchSetup,
    _queue_name,
)
from gpu_provider.testing.emulators.aws_common import OnePerProcess, ServiceKnobs, serve_parser, serve_until_signalled
from gpu_provider.testing.emulators.core import Faults, Patches, RecordingMotoServer, RequestLog, kill_group

__all__ = [
    "FAIR_SHARE_QUEUE",
    "MAX_DESCRIBE_JOBS",
    "ON_DEMAND_QUEUE",
    "SPOT_QUEUE",
    "BatchEmulator",
    "BatchSetup",
    "main",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _PreemptRule:
    seconds: float
    queue: str
    remaining: int
    name_contains: str | None


class BatchEmulator(OnePerProcess, ServiceKnobs, BatchEnvironment, BatchApi, JobRunner):
    """AWS Batch on moto in server mode, running each job's command as a local process.

    :param port: TCP port on 127.0.0.1; 0 picks a free one (see :attr:`endpoint_url`).
    :param job_cwd: working directory of job processes (default: the current directory at start).
    :param step_seconds: time between two state changes of a job (SUBMITTED ... RUNNING).
    :param grace_period: seconds between SIGTERM and SIGKILL when a job is terminated or preempted.
    :param region: the region jobs and resources live in.
    :param job_aws_env: give job processes ``AWS_ENDPOINT_URL`` (this emulator), dummy credentials and
        the region, as a task role would give a real container access to AWS.
    """

    _one_of: ClassVar[str] = "batch"
    _title: ClassVar[str | None] = "AWS Batch emulator"

    def __init__(
        self,
        *,
        port: int = 0,
        job_cwd: str | os.PathLike[str] | None = None,
        step_seconds: float = 0.5,
        grace_period: float = 5.0,
        region: str = "us-east-1",
        job_aws_env: bool = True,
    ) -> None:
        self.port = port
        self.job_cwd = Path(job_cwd) if job_cwd is not None else None
        self.step_seconds = step_seconds
        self.grace_period = grace_period
        self.region = region
        self.job_aws_env = job_aws_env
        self.endpoint_url = ""
        self._server: RecordingMotoServer | None = None
        self._patches = Patches()
        self._runs: dict[str, JobRun] = {}
        self._held: set[str] = set()
        self._held_reasons: dict[str, str] = {}  # queue -> statusReason of its RUNNABLE jobs
        self._preempt_rules: list[_PreemptRule] = []
        self._faults = Faults()
        self._reported_status: dict[str, str] = {}  # job id -> the status DescribeJobs answers instead
        self._log = RequestLog()
        self._lock = threading.RLock()
        self._logs_lock = threading.Lock()
        self._images_seen: set[str] = set()
        self._routes: list[tuple[str, re.Pattern[str], str]] = []
        self._saved_transition: dict[str, Any] | None = None
        self._setup: BatchSetup | None = None

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        with self._lock:
            self._runs.clear()
        self._routes = _batch_routes()
        self._install_patches()
        self._start_server(
            self.port,
            app=lambda app: app,
            action_of=self._action_of,
            error_style=_error_style,
            faults=self._faults,
            log=self._log,
        )
        self._reset_moto()  # a fresh account: nothing left from an earlier server in this process

    def _stop(self) -> None:
        """Kill every job process, stop the server and undo the patches."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.hurry.set()
            run.request_stop("AWS Batch emulator stopped", "shutdown")
        for run in runs:
            for node in run.nodes:
                kill_group(node.proc, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for run in runs:
            if run.job.is_alive():
                run.job.join(max(0.1, deadline - time.monotonic()))
        for run in runs:  # a thread that did not finish in time: make sure its processes are gone anyway
            for node in run.nodes:
                kill_group(node.proc, signal.SIGKILL)
                if node.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        node.proc.wait(timeout=1)
        if self._server is not None and self.endpoint_url:
            with contextlib.suppress(OSError):
                self._reset_moto()
        self._stop_server()
        self._patches.undo()
        if self._saved_transition is not None:
            state_manager.set_transition("batch::job", self._saved_transition)
        else:
            state_manager.unset_transition("batch::job")
        self._setup = None  # moto was reset

    def _reset_moto(self) -> None:
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=30):
            pass

    # ------------------------------------------------------------------ fault injection

    def hold(self, queue: str, reason: str | None = None) -> None:
        """Keep jobs of ``queue`` (name or ARN) RUNNABLE, as with no capacity, until :meth:`release`.

        :param reason: the ``statusReason`` its RUNNABLE jobs show meanwhile, as Batch words it for a
            job blocking its queue, e.g. ``"CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - There is no Spot
            capacity available that meets the job requirements."`` (default: none)
        """
        with self._lock:
            name = _queue_name(queue)
            self._held.add(name)
            if reason is None:
                self._held_reasons.pop(name, None)
            else:
                self._held_reasons[name] = reason

    def release(self, queue: str) -> None:
        """Let held jobs of ``queue`` start."""
        with self._lock:
            self._held.discard(_queue_name(queue))
            self._held_reasons.pop(_queue_name(queue), None)
        self._nudge_held()

    def set_status_reason(self, job_id: str, reason: str | None) -> None:
        """The ``statusReason`` the job shows while it is RUNNABLE (``None``: none), as Batch sets it on a
        job blocking its queue: ``CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - ...`` (it may start later) or
        ``MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - ...`` (it never will: hold its queue to keep it there)."""
        with self._lock:
            run = self._runs.get(job_id)
            if run is None:
                raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
            run.queue_reason = reason

    def preempt(self, job_id: str, instance_id: str | None = None) -> None:
        """Reclaim the job's spot host now: SIGTERM, SIGKILL after ``grace_period``; the job ends FAILED
        with ``Host EC2 (instance i-...) terminated.`` (``instance_id`` or the job's own host)."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
        if run.job.job_stopped:
            raise ValueError(f"AWS Batch emulator: job {job_id} already ended {job_state(run.job)}; cannot preempt it")
        self._preempt(run, instance_id)

    def fail_host(
        self,
        job_id: str,
        reason: str = "CannotInspectContainerError: Could not transition to inspecting; timed out after waiting 30s",
    ) -> None:
        """The job's host or its GPU fails under it now: SIGTERM, SIGKILL after ``grace_period``; the job ends
        FAILED with ``reason`` as its status reason (Batch's words for a host fault, e.g. a container runtime
        that stopped answering or ``nvidia-container-cli: initialization error``)."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
        run.request_stop(reason, "host_fault")

    def preempt_after(self, seconds: float, *, queue: str, count: int = 1, name_contains: str | None = None) -> None:
        """Preempt the next ``count`` jobs submitted to ``queue`` (with ``name_contains`` in their name,
        if given) ``seconds`` after each reaches RUNNING."""
        with self._lock:
            self._preempt_rules.append(_PreemptRule(seconds, _queue_name(queue), count, name_contains))

    def forget(self, job_id: str) -> None:
        """Forget a job, as Batch does some time after it ended (or as if it was deleted): DescribeJobs
        and ListJobs leave it out from now on. A job still active is stopped first, its processes killed."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            raise ValueError(f"AWS Batch emulator: no job {job_id!r} (was it submitted to this emulator?)")
        job = run.job
        if not job.job_stopped:
            run.hurry.set()
            run.request_stop("forgotten by the AWS Batch emulator", "shutdown")
            if job.is_alive():
                job.join(10)
        job.backend._jobs.pop(job.job_id, None)
        with contextlib.suppress(ValueError):
            job.job_queue.jobs.remove(job)
        with self._lock:
            self._runs.pop(job_id, None)
            self._reported_status.pop(job_id, None)
        logger.info("job %s (%s) forgotten", job.job_name, job.job_id)

    def report_status(self, job_id: str, status: str | None) -> None:
        """Make DescribeJobs answer ``status`` for the job (e.g. a state a newer Batch might add) instead
        of its own, until called again with ``None``. The job itself carries on as before."""
        with self._lock:
            if status is None:
                self._reported_status.pop(job_id, None)
            else:
                self._reported_status[job_id] = status

    def reset_faults(self) -> None:
        """Release every held queue, drop pending :meth:`preempt_after` rules, turn throttling and lost
        responses off, and stop overriding reported statuses."""
        with self._lock:
            self._held.clear()
            self._held_reasons.clear()
            self._preempt_rules.clear()
            self._reported_status.clear()
        self._faults.reset()
        self._nudge_held()

    # ------------------------------------------------------------------ inspection

    def job_pids(self, job_id: str) -> list[int]:
        """Pids of the job's live processes (every process in its nodes' process groups)."""
        with self._lock:
            run = self._runs.get(job_id)
        if run is None:
            return []
        groups = {node.proc.pid for node in run.nodes if node.proc is not None}
        if not groups:
            return []
        try:
            entries = os.listdir("/proc")
        except OSError:
            return sorted(node.proc.pid for node in run.nodes if node.proc is not None and node.alive())
        pids = []
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) in groups:
                pids.append(int(entry))
        return sorted(pids)


# ---------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser, serve = serve_parser(
        "gpu_provider.testing.emulators.aws_batch",
        __doc__,
        help="run the emulator with the provider's queues until SIGTERM/SIGINT",
        ready_help="write endpoint and queues here (JSON) once ready",
    )
    serve.add_argument("--fair-share", action="store_true", help="also create the fair-share queue gpu-fair-share")
    serve.add_argument("--preempt-after", type=float, default=None, metavar="SECONDS")
    serve.add_argument("--preempt-queue", default=SPOT_QUEUE)
    serve.add_argument("--preempt-name-contains", default=None)
    serve.add_argument("--preempt-count", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logger.setLevel(logging.INFO)
    logging.getLogger("gpu_provider.testing.emulators").setLevel(logging.INFO)  # the job runner's state changes too
    emulator = BatchEmulator(
        port=args.port,
        job_cwd=args.job_cwd,
        step_seconds=args.step_seconds,
        grace_period=args.grace_period,
        region=args.region,
    )

    def prepare() -> dict[str, Any]:
        setup = emulator.create_environment(fair_share=args.fair_share)
        if args.preempt_after is not None:
            emulator.preempt_after(
                args.preempt_after,
                queue=args.preempt_queue,
                count=args.preempt_count,
                name_contains=args.preempt_name_contains,
            )
        return {
            "spot_queue": setup.spot_queue,
            "on_demand_queue": setup.on_demand_queue,
            "fair_share_queue": setup.fair_share_queue,
        }

    return serve_until_signalled(emulator, args.ready_file, prepare, title="AWS Batch emulator")


if __name__ == "__main__":
    sys.exit(main())
