"""The job runner of the SageMaker emulator: each training job's hosts run as local processes.

:class:`JobRunner` is mixed into :class:`gpu_provider.testing.emulators.aws_sagemaker.SageMakerEmulator` (as the Batch
emulator's runner is into its emulator): it takes a job through Starting -> Downloading -> Training
-> Uploading -> Completed with ``SecondaryStatusTransitions``, starts one process per host with its
own ``/opt/ml``, copies each host's output to CloudWatch Logs, syncs ``CheckpointConfig`` with S3,
uploads the model, and answers spot interruptions, stops and time limits. It uses the emulator's
lock, jobs, clients and settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.logs.models import logs_backends

from gpu_provider.testing.emulators.aws_common import DUMMY_CREDENTIALS, job_aws_env
from gpu_provider.testing.emulators.aws_events import publish
from gpu_provider.testing.emulators.core import kill_group, own_rendezvous_port, python_env

__all__ = ["DUMMY_CREDENTIALS", "kill_process"]  # (also importable from here, as before)

logger = logging.getLogger("gpu_provider.testing.emulators.aws_sagemaker")

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_TICK = 0.05
#: A job waiting for held capacity sleeps until something it waits on changes (capacity released, the wait
#: clock, a stop: see ``TrainingJob.nudge``) or its MaxWaitTimeInSeconds runs out; this is only a safety net.
#: (Looking every 0.2 s, 1,000 held jobs' threads piled up on the emulator's lock and starved its requests.)
_HELD_RECHECK = 5.0
#: how often a training host's checkpoint folder is copied to S3
SYNC_EVERY_S = 0.25
MESSAGES = {
    "Starting": "Launching requested ML instances",
    "Downloading": "Downloading input data",
    "Training": "Training image download completed. Training in progress.",
    "Uploading": "Uploading generated training model",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopping": "Stopping the training job",
    "Stopped": "Training job stopped",
    "Interrupted": "Training job interrupted: the managed spot instances were reclaimed (spot interruption); "
    "SageMaker restarts the job from its checkpoint",
    "Reclaimed": "Training job interrupted: the managed spot instances were reclaimed and the job could not be "
    "restarted",
    "MaxWaitTimeExceeded": "Training job exceeded MaxWaitTimeInSeconds: spot capacity did not come in time",
    "MaxRuntimeExceeded": "Training job exceeded MaxRuntimeInSeconds",
}


@dataclasses.dataclass
class Host:
    name: str
    root: Path  # the host's /opt/ml lives under root/opt/ml
    stream: str = ""
    proc: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None
    synced: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)

    @property
    def opt_ml(self) -> Path:
        return self.root / "opt" / "ml"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class TrainingJob:
    """The emulator's state of one training job (guarded by the emulator's lock)."""

    def __init__(self, request: dict[str, Any], arn: str) -> None:
        self.request = request
        self.name = str(request["TrainingJobName"])
        self.arn = arn
        self.created = self.last_modified = self.status_modified = time.time()
        self.status, self.secondary = "InProgress", "Starting"
        self.transitions: list[dict[str, Any]] = []
        self.failure_reason: str | None = None
        self.training_start: float | None = None
        self.training_end: float | None = None
        self.training_seconds = 0.0
        self.tags = {t["Key"]: t.get("Value", "") for t in request.get("Tags") or []}
        self.hosts: list[Host] = []
        self.artifacts: str | None = None
        self.stop_kind: str | None = None  # stop | interrupt | fail
        self.fail_reason: str | None = None
        self.wake = threading.Event()  # a stop, interruption or failure was asked for
        self.nudge = threading.Event()  # that, or a change a job waiting for capacity must look at
        self.hurry = threading.Event()
        self.thread: threading.Thread | None = None
        self.runs = 0

    @property
    def spot(self) -> bool:
        return bool(self.request.get("EnableManagedSpotTraining"))

    @property
    def stopping(self) -> dict[str, Any]:
        return dict(self.request.get("StoppingCondition") or {})

    def alert(self) -> None:
        """A stop, interruption or failure was asked for: wake the job's thread wherever it waits."""
        self.wake.set()
        self.nudge.set()

    def transition(self, secondary: str, status: str | None = None, message: str | None = None) -> None:
        now = time.time()
        if self.transitions and "EndTime" not in self.transitions[-1]:
            self.transitions[-1]["EndTime"] = now
        self.transitions.append(
            {"Status": secondary, "StartTime": now, "StatusMessage": message or MESSAGES[secondary]}
        )
        self.secondary = secondary
        if status is not None and status != self.status:
            # when TrainingJobStatus last changed (SageMakerEmulator.modified_with_status_only)
            self.status_modified = now
        if status is not None:
            self.status = status
        self.last_modified = now

    def billable(self, discount: float) -> int:
        trained = round(self.training_seconds)
        if not self.spot:
            return trained
        return max(1, round(trained * (1 - discount))) if trained else 0


class JobRunner:
    """What runs a training job (mixed into the emulator, whose state it uses)."""

    def _set(self, job: TrainingJob, secondary: str, status: str | None = None, message: str | None = None) -> None:
        with self._lock:
            before = job.status
            job.transition(secondary, status, message)
        logger.info("training job %s: %s/%s", job.name, job.status, secondary)
        if job.status != before:
            self._state_event(job)

    def _state_event(self, job: TrainingJob) -> None:
        """The "SageMaker Training Job State Change" event SageMaker sends to EventBridge (a few fields)."""
        detail = {
            "TrainingJobName": job.name,
            "TrainingJobArn": job.arn,
            "TrainingJobStatus": job.status,
            "SecondaryStatus": job.secondary,
            "FailureReason": job.failure_reason or "",
        }
        publish(
            account=job.arn.split(":")[4],
            region=job.arn.split(":")[3],
            source="aws.sagemaker",
            detail_type="SageMaker Training Job State Change",
            detail=detail,
            resource=job.arn,
        )

    def _pause(self, job: TrainingJob, seconds: float) -> bool:
        """Wait ``seconds``; ``True`` when a stop, interruption or failure came meanwhile."""
        return job.wake.wait(seconds) or job.stop_kind is not None

    def _waited_too_long(self, job: TrainingJob) -> bool:
        wait = job.stopping.get("MaxWaitTimeInSeconds")
        return bool(job.spot and wait and (time.time() - job.created) * self._wait_clock > float(wait))

    def _until_max_wait(self, job: TrainingJob) -> float:
        """Seconds until a held spot job's MaxWaitTimeInSeconds runs out (by the wait clock), at most the
        safety net's."""
        wait = job.stopping.get("MaxWaitTimeInSeconds")
        if not (job.spot and wait):
            return _HELD_RECHECK
        with self._lock:
            left = float(wait) / self._wait_clock - (time.time() - job.created)
        return min(_HELD_RECHECK, max(0.01, left))

    def _nudge_waiting(self) -> None:
        """Wake every job waiting for capacity to look again (capacity, the wait clock or a job's age changed)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.nudge.set()

    def _lifecycle(self, job: TrainingJob) -> None:
        try:
            self._run_job(job)
        except Exception as err:  # the emulator's own failure: the job fails with it, never hangs
            logger.exception("training job %s: emulator error", job.name)
            self._end(job, "Failed", "Failed", f"InternalServerError: emulator error: {err}")

    def _run_job(self, job: TrainingJob) -> None:
        capacity = "spot" if job.spot else "on-demand"
        while True:
            job.runs += 1
            # waiting for instances (the spot wait)
            while True:
                job.nudge.clear()  # before looking, so a change that comes after the look is not missed
                if self._waited_too_long(job):
                    self._end(job, "Stopped", "MaxWaitTimeExceeded", MESSAGES["MaxWaitTimeExceeded"])
                    return
                instance_type = (job.request.get("ResourceConfig") or {}).get("InstanceType")
                with self._lock:
                    held = bool({capacity, "*", f"{capacity}|{instance_type}", f"*|{instance_type}"} & self._held)
                if not held or job.wake.is_set() or job.stop_kind is not None:
                    break
                job.nudge.wait(self._until_max_wait(job))
            if job.stop_kind is not None or self._pause(job, self.step_seconds):
                if self._stopped_early(job):
                    return
                continue
            self._set(job, "Downloading")
            failure = self._download_checkpoints(job)
            if failure:
                self._end(job, "Failed", "Failed", failure)
                return
            if self._pause(job, self.step_seconds):
                if self._stopped_early(job):
                    return
                continue
            with self._lock:
                if job.training_start is None:
                    job.training_start = time.time()
            self._set(job, "Training")
            outcome = self._train(job)
            if outcome == "interrupted":
                continue  # SageMaker restarts the job itself, from its checkpoint
            return

    def _stopped_early(self, job: TrainingJob) -> bool:
        """A stop or failure before training: end the job; an interruption before training restarts it."""
        kind = job.stop_kind
        if kind == "interrupt":
            self._interrupted(job)
            return False
        if kind == "fail":
            self._end(job, "Failed", "Failed", job.fail_reason or "InternalServerError")
        elif kind == "reclaim":
            self._end(job, "Stopped", "Interrupted", MESSAGES["Reclaimed"])
        else:
            self._end(job, "Stopped", "Stopped", MESSAGES["Stopped"])
        return True

    def _interrupted(self, job: TrainingJob) -> None:
        with self._lock:
            job.stop_kind = None
            job.wake.clear()
            job.transition("Interrupted")
        logger.info("training job %s: spot interruption; restarting it", job.name)
        self._set(job, "Starting", message="Restarting the training job after a spot interruption")

    def _train(self, job: TrainingJob) -> str:
        """Run the hosts until they end or something stops them: ``ended`` or ``interrupted``."""
        self._start_hosts(job)
        began = time.time()
        last_sync = began
        runtime = float(job.stopping.get("MaxRuntimeInSeconds") or 86400)
        rule = self._interrupt_rule(job)
        while True:
            now = time.time()
            done = [h for h in job.hosts if not h.alive()]
            failed = [h for h in done if h.proc is not None and h.proc.returncode != 0]
            if failed or len(done) == len(job.hosts):
                break
            if rule is not None and now - began >= rule[0] and (not rule[1] or self._checkpointed(job)):
                with self._lock:
                    job.stop_kind = job.stop_kind or "interrupt"
                rule = None
            if job.stop_kind is not None:
                break
            if job.training_seconds + (now - began) > runtime:
                job.stop_kind = "runtime"
                break
            if self._waited_too_long(job):
                job.stop_kind = "maxwait"
                break
            if now - last_sync >= SYNC_EVERY_S:
                self._sync_checkpoints(job)
                last_sync = now
            job.wake.wait(_TICK)
        kind = job.stop_kind
        if kind is not None or failed:
            self._stop_hosts(job)
        for host in job.hosts:
            if host.reader is not None:
                host.reader.join(5)
        with self._lock:
            job.training_seconds += time.time() - began
        self._sync_checkpoints(job)
        if kind == "interrupt":
            self._interrupted(job)
            return "interrupted"
        if kind == "fail":
            self._end(job, "Failed", "Failed", job.fail_reason or "InternalServerError")
        elif kind == "reclaim":
            self._end(job, "Stopped", "Interrupted", MESSAGES["Reclaimed"])
        elif kind == "runtime":
            self._end(job, "Stopped", "MaxRuntimeExceeded", MESSAGES["MaxRuntimeExceeded"])
        elif kind == "maxwait":
            self._end(job, "Stopped", "MaxWaitTimeExceeded", MESSAGES["MaxWaitTimeExceeded"])
        elif kind is not None:
            self._end(job, "Stopped", "Stopped", MESSAGES["Stopped"])
        elif failed:
            code = _exit_code(failed[0].proc)
            self._end(job, "Failed", "Failed", f"AlgorithmError: , exit code: {code}")
        else:
            self._set(job, "Uploading")
            self._upload_model(job)
            if self._pause(job, self.step_seconds / 2) and job.stop_kind == "stop":
                self._end(job, "Stopped", "Stopped", MESSAGES["Stopped"])
            else:
                self._end(job, "Completed", "Completed", MESSAGES["Completed"])
        return "ended"

    def _interrupt_rule(self, job: TrainingJob) -> tuple[float, bool] | None:
        """(seconds into the training, whether to wait for a first checkpoint) of the rule ``job`` takes up."""
        if not job.spot:
            return None
        with self._lock:
            for rule in self._interrupt_rules:
                if rule["left"] > 0 and (rule["contains"] is None or rule["contains"] in job.name):
                    rule["left"] -= 1
                    return float(rule["after"]), bool(rule.get("checkpointed"))
        return None

    @staticmethod
    def _checkpointed(job: TrainingJob) -> bool:
        """Whether a ``LATEST`` checkpoint file of any host was copied to S3."""
        return any(rel.rsplit("/", 1)[-1] == "LATEST" for host in job.hosts for rel in host.synced)

    def _end(self, job: TrainingJob, status: str, secondary: str, reason: str) -> None:
        with self._lock:
            now = time.time()
            if job.training_start is not None:
                job.training_end = now
            if status == "Failed" or secondary in ("MaxWaitTimeExceeded",):
                job.failure_reason = reason
            job.transition(secondary, status, reason if status != "Completed" else None)
            if job.transitions:
                job.transitions[-1]["EndTime"] = now
        logger.info("training job %s ended %s/%s: %s", job.name, status, secondary, reason)
        self._state_event(job)

    # ------------------------------------------------------------------ hosts

    def _start_hosts(self, job: TrainingJob) -> None:
        req = job.request
        count = int(req["ResourceConfig"].get("InstanceCount") or 1)
        names = [f"algo-{i}" for i in range(1, count + 1)]
        algorithm = req["AlgorithmSpecification"]
        command = list(algorithm.get("ContainerEntrypoint") or []) + list(algorithm.get("ContainerArguments") or [])
        if not command:
            raise ValueError("no ContainerEntrypoint: the emulator cannot run an image's default command")
        logs = logs_backends[DEFAULT_ACCOUNT_ID][self.region]
        stamp = int(time.time())
        hosts = []
        for name in names:
            root = self.job_root / job.name / name
            host = Host(name=name, root=root, stream=f"{job.name}/{name}-{stamp}{'' if job.runs == 1 else job.runs}")
            prior = next((h for h in job.hosts if h.name == name), None)
            if prior is not None:
                host.synced = prior.synced
            for sub in ("checkpoints", "model", "output", "input/config"):
                (host.opt_ml / sub).mkdir(parents=True, exist_ok=True)
            config = {"current_host": name, "hosts": names, "network_interface_name": "eth0"}
            (host.opt_ml / "input" / "config" / "resourceconfig.json").write_text(json.dumps(config))
            hosts.append(host)
        logs.ensure_log_group(LOG_GROUP)
        for host in hosts:
            logs.ensure_log_stream(LOG_GROUP, host.stream)
        job.hosts = hosts
        base = {**python_env(), **job_aws_env(self.endpoint_url, self.region)}
        for host in hosts:
            here_ml = str(host.opt_ml)
            env = {**base, **{k: str(v).replace("/opt/ml", here_ml) for k, v in (req.get("Environment") or {}).items()}}
            env.update(
                {
                    "SM_HOSTS": json.dumps(names),
                    "SM_CURRENT_HOST": host.name,
                    "TRAINING_JOB_NAME": job.name,
                    "TRAINING_JOB_ARN": job.arn,
                }
            )
            env.setdefault("MASTER_ADDR", "127.0.0.1")  # the stand-in for DNS of algo-1
            own_rendezvous_port(env, f"sagemaker/{id(self)}/{job.name}")  # hosts of their own: no other job's port
            argv = [arg.replace("/opt/ml", here_ml) for arg in command]
            host.proc = subprocess.Popen(
                argv,
                cwd=self.job_cwd or Path.cwd(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            host.reader = threading.Thread(target=self._pump_logs, args=(host,), daemon=True)
            host.reader.start()

    def _pump_logs(self, host: Host) -> None:
        assert host.proc is not None and host.proc.stdout is not None
        logs = logs_backends[DEFAULT_ACCOUNT_ID][self.region]
        with host.proc.stdout:
            for raw in iter(host.proc.stdout.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line:
                    continue
                try:
                    logs.put_log_events(
                        LOG_GROUP, host.stream, [{"timestamp": int(time.time() * 1000), "message": line}]
                    )
                except Exception:  # moto was reset under a job being stopped: drop the line
                    logger.debug("dropped a log line of %s", host.stream, exc_info=True)

    def _stop_hosts(self, job: TrainingJob) -> None:
        for host in job.hosts:
            if host.alive():
                kill_process(host.proc, signal.SIGTERM)
        deadline = time.monotonic() + (0 if job.hurry.is_set() else self.grace_period)
        while time.monotonic() < deadline and any(h.alive() for h in job.hosts):
            time.sleep(_TICK)
        for host in job.hosts:
            kill_process(host.proc, signal.SIGKILL)
            if host.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.proc.wait(timeout=5)

    # ------------------------------------------------------------------ S3

    def _checkpoint_location(self, job: TrainingJob) -> tuple[str, str, str] | None:
        config = job.request.get("CheckpointConfig")
        if not config:
            return None
        bucket, _, prefix = str(config["S3Uri"])[len("s3://") :].partition("/")
        local = str(config.get("LocalPath") or "/opt/ml/checkpoints")
        return bucket, prefix.rstrip("/"), local

    def _download_checkpoints(self, job: TrainingJob) -> str | None:
        where = self._checkpoint_location(job)
        if where is None:
            return None
        bucket, prefix, local = where
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix + "/" if prefix else ""
            )
            objects = [o["Key"] for page in pages for o in page.get("Contents") or []]
        except Exception as err:
            return f"ClientError: cannot read CheckpointConfig.S3Uri s3://{bucket}/{prefix}: {err}"
        count = int(job.request["ResourceConfig"].get("InstanceCount") or 1)
        for i in range(1, count + 1):
            root = self.job_root / job.name / f"algo-{i}" / local.lstrip("/")
            for key in objects:
                rel = key[len(prefix) + 1 :] if prefix else key
                if not rel:
                    continue
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        return None

    def _sync_checkpoints(self, job: TrainingJob) -> None:
        """Copy each host's changed checkpoint files to the S3 URI (``LATEST`` files last)."""
        where = self._checkpoint_location(job)
        if where is None:
            return
        bucket, prefix, local = where
        for host in job.hosts:
            root = host.root / local.lstrip("/")
            if not root.is_dir():
                continue
            # os.walk: the job adds and prunes checkpoint folders while this looks (errors are skipped)
            found = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
            files = sorted(found, key=lambda p: (p.name == "LATEST", str(p)))
            for path in files:
                try:
                    stat = path.stat()
                    rel = path.relative_to(root).as_posix()
                    if host.synced.get(rel) == (stat.st_mtime, stat.st_size):
                        continue
                    data = path.read_bytes()
                except OSError:  # written or removed while we looked: the next sync takes it
                    continue
                key = f"{prefix}/{rel}" if prefix else rel
                try:
                    self._s3.put_object(Bucket=bucket, Key=key, Body=data)
                except Exception:
                    logger.warning("training job %s: checkpoint upload of %s failed", job.name, key, exc_info=True)
                    continue
                host.synced[rel] = (stat.st_mtime, stat.st_size)

    def _upload_model(self, job: TrainingJob) -> None:
        output = str(job.request["OutputDataConfig"]["S3OutputPath"]).rstrip("/")
        bucket, _, prefix = output[len("s3://") :].partition("/")
        key = "/".join(p for p in (prefix, job.name, "output", "model.tar.gz") if p)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            model = job.hosts[0].opt_ml / "model"
            if model.is_dir():
                tar.add(model, arcname=".")
        try:
            self._s3.put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())
        except Exception as err:
            logger.warning("training job %s: model upload failed: %s", job.name, err)
        job.artifacts = f"s3://{bucket}/{key}"


kill_process = kill_group  # the name this module gave it


def _exit_code(proc: subprocess.Popen[bytes] | None) -> int:
    code = proc.returncode if proc is not None else None
    if code is None:
        return 1
    return 128 - code if code < 0 else code
