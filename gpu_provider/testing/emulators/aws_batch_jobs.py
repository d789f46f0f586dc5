"""The job runner of the AWS Batch emulator: each job's containers run as local processes.

:class:`JobRunner` is mixed into :class:`gpu_provider.testing.emulators.aws_batch.BatchEmulator`: it takes a moto job
through SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING about ``step_seconds`` apart, starts
one process per node (in its own session, with Batch's environment), copies each node's output to
its CloudWatch Logs stream line by line, stops the processes on a terminate, a preemption or a
timeout (SIGTERM, SIGKILL after ``grace_period``), and ends the job SUCCEEDED or FAILED. It also
answers for the nodes of multi-node jobs (``<jobId>#<index>``, :class:`NodeView`).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from moto.batch import models as batch_models

from gpu_provider.runtime.secrets import resolve as resolve_secrets
from gpu_provider.testing.emulators.aws_common import DUMMY_CREDENTIALS, aws_client, job_aws_env
from gpu_provider.testing.emulators.aws_events import publish
from gpu_provider.testing.emulators.core import current_body, kill_group, own_rendezvous_port, python_env

__all__ = ["DUMMY_CREDENTIALS", "kill_group"]  # (also importable from here, as before)

logger = logging.getLogger(__name__)

LOG_GROUP = "/aws/batch/job"
ESSENTIAL_CONTAINER_EXITED = "Essential container in task exited"
DEPENDENT_JOB_FAILED = "Dependent Job failed"
ATTEMPT_TIMED_OUT = "Job attempt duration exceeded timeout"
MAIN_NODE_ADDRESS = "127.0.0.1"

_POLL = 0.05
#: A job held RUNNABLE is woken by :meth:`JobRunner._nudge_held` or a stop request; this is only a safety net.
_HELD_RECHECK = 5.0


@dataclasses.dataclass
class Node:
    """One container of a job (the only one, or one node of a multi-node job)."""

    index: int
    command: list[str]
    env: dict[str, str]
    stream: str
    proc: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class JobRun:
    """The emulator's side of one moto job: its submit request, processes and stop request."""

    def __init__(self, job: batch_models.Job, submit: dict[str, Any]) -> None:
        self.job = job
        self.submit = submit
        self.instance_id = "i-" + uuid.uuid4().hex[:17]
        self.nodes: list[Node] = []
        self.main_index = 0
        self.num_nodes = 1
        self.started = False
        self.preempt_delay: float | None = None
        self.queue_reason: str | None = None  # statusReason while RUNNABLE (set_status_reason)
        self.stop_reason: str | None = None
        self.stop_kind: str | None = None  # terminate | preempt | timeout | shutdown
        self.wake = threading.Event()  # set on a stop request
        self.nudge = threading.Event()  # set on a stop request and when a held queue is released
        self.hurry = threading.Event()  # set by BatchEmulator.stop: no grace period
        self._lock = threading.Lock()

    def request_stop(self, reason: str, kind: str) -> bool:
        """Ask the job's thread to end the job FAILED with ``reason``; the first request wins."""
        with self._lock:
            if self.stop_kind is not None or self.job.job_stopped:
                return False
            self.stop_reason, self.stop_kind = reason, kind
        self.job.stop = True
        self.wake.set()
        self.nudge.set()
        return True

    @property
    def main(self) -> Node:
        return self.nodes[self.main_index]


def container_exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def job_state(job: batch_models.Job) -> str:
    """The job's state as a plain string, read without moto's automatic progression."""
    state = job._status
    return str(getattr(state, "value", state))


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def env_dict(entries: Iterable[dict[str, str]] | None) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in entries or ()}


def target_nodes(target: str, num_nodes: int) -> range:
    start, sep, end = target.partition(":")
    if not sep:
        return range(int(start), int(start) + 1)
    return range(int(start) if start else 0, (int(end) if end else num_nodes - 1) + 1)


class JobRunner:
    """The job lifecycle and processes of :class:`~gpu_provider.testing.emulators.aws_batch.BatchEmulator` (a mixin)."""

    step_seconds: float
    grace_period: float
    job_cwd: Path | None
    job_aws_env: bool
    endpoint_url: str
    region: str
    _runs: dict[str, JobRun]
    _lock: threading.RLock
    _logs_lock: threading.Lock
    _images_seen: set[str]
    _held: set[str]
    _preempt_rules: list[Any]

    def _register(self, job: batch_models.Job) -> None:
        """Called on the server thread that serves SubmitJob, before the job's thread starts."""
        run = JobRun(job, dict(current_body("SubmitJob") or {}))
        with self._lock:
            for rule in self._preempt_rules:
                if (
                    rule.remaining > 0
                    and rule.queue == job.job_queue.name
                    and (rule.name_contains is None or rule.name_contains in job.job_name)
                ):
                    rule.remaining -= 1
                    run.preempt_delay = rule.seconds
                    break
            self._runs[job.job_id] = run

    def _run(self, job: batch_models.Job) -> None:
        """A job's thread (replaces moto's ``Job.run``)."""
        run = self._runs[job.job_id]
        try:
            self._lifecycle(run)
        except Exception as err:  # an emulator bug must end the job, not leave it hanging
            logger.exception("AWS Batch emulator: job %s (%s) crashed the emulator", job.job_name, job.job_id)
            self._finish(run, success=False, reason=f"AWS Batch emulator error: {err}")
        finally:
            for node in run.nodes:
                kill_group(node.proc, signal.SIGKILL)
                if node.proc is not None:
                    node.proc.wait()

    def _lifecycle(self, run: JobRun) -> None:
        job = run.job
        if not self._pause(run):
            self._finish_stopped(run)
            return
        self._set_status(run, "PENDING")
        if job.depends_on and not self._wait_for_dependencies(run):
            return
        if not self._pause(run):
            self._finish_stopped(run)
            return
        self._set_status(run, "RUNNABLE")
        self._wait_while_held(run)
        if not self._pause(run):
            self._finish_stopped(run)
            return
        self._set_status(run, "STARTING")
        if not self._pause(run):
            self._finish_stopped(run)
            return
        try:
            self._start_nodes(run)
        except OSError as err:  # what Docker reports when the command cannot be executed
            command = run.nodes[0].command[0] if run.nodes and run.nodes[0].command else ""
            reason = f'CannotStartContainerError: exec: "{command}": {err.strerror or err}'
            self._finish(run, success=False, reason=reason)
            return
        except ValueError as err:
            self._finish(run, success=False, reason=f"CannotStartContainerError: {err}")
            return
        except LookupError as err:
            reason = f"ResourceInitializationError: unable to pull secrets or registry auth: {err}"
            self._finish(run, success=False, reason=reason)
            return
        self._set_status(run, "RUNNING")
        self._monitor(run)

    def _pause(self, run: JobRun) -> bool:
        """Wait one step; False if the job was asked to stop meanwhile."""
        run.wake.wait(self.step_seconds)
        return run.stop_kind is None

    def _wait_while_held(self, run: JobRun) -> None:
        """Sleep while the job's queue is held, until a release or a stop request wakes it: a thousand
        held jobs cost the emulator nothing (a poll each every 50 ms took half a core)."""
        while True:
            run.nudge.clear()  # before looking, so a release that comes after the look is not missed
            if run.stop_kind is not None or not self._is_held(run.job.job_queue.name):
                return
            run.nudge.wait(_HELD_RECHECK)

    def _nudge_held(self) -> None:
        """Wake every job waiting in a held queue to look again (called after a queue is released)."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.nudge.set()

    def _is_held(self, queue: str) -> bool:
        with self._lock:
            return queue in self._held

    def _set_status(self, run: JobRun, status: str) -> None:
        before = job_state(run.job)
        run.job.status = status
        logger.info("job %s (%s) %s -> %s", run.job.job_name, run.job.job_id, before, status)
        if status != before:
            self._state_event(run.job)

    @staticmethod
    def _state_event(job: batch_models.Job) -> None:
        """The "Batch Job State Change" event AWS Batch sends to EventBridge (a few of its detail's fields)."""
        status = job_state(job)
        detail = {
            "jobName": job.job_name,
            "jobId": job.job_id,
            "jobArn": job.arn,
            "jobQueue": job.job_queue.arn,
            "status": status,
            "statusReason": job.job_stopped_reason or "",
        }
        publish(
            account=job.backend.account_id,
            region=job.backend.region_name,
            source="aws.batch",
            detail_type="Batch Job State Change",
            detail=detail,
            resource=job.arn,
        )

    def _wait_for_dependencies(self, run: JobRun) -> bool:
        ids = [d["jobId"] for d in run.job.depends_on or []]
        backend = run.job.backend
        while True:
            if run.stop_kind is not None:
                self._finish_stopped(run)
                return False
            deps = [backend._jobs.get(i) for i in ids]
            if any(d is None or d.status == "FAILED" for d in deps):
                self._finish(run, success=False, reason=DEPENDENT_JOB_FAILED)
                return False
            if all(d is not None and d.status == "SUCCEEDED" for d in deps):
                return True
            run.wake.wait(_POLL * 2)

    # --- processes

    def _plan_nodes(self, run: JobRun) -> list[Node]:
        job = run.job
        job_def = job.job_definition
        batch_env = {
            "AWS_BATCH_JOB_ID": job.job_id,
            "AWS_BATCH_JQ_NAME": job.job_queue.name,
            "AWS_BATCH_JOB_ATTEMPT": "1",
        }
        if job.job_queue.environments:
            batch_env["AWS_BATCH_CE_NAME"] = job.job_queue.environments[0].name
        if "index" in job.array_properties:
            batch_env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(job.array_properties["index"])
        if job_def.type != "multinode":
            props = job_def.container_properties or {}
            self._note_image(props.get("image"))
            command = job._get_container_property("command", [])
            env = env_dict(props.get("environment"))
            env.update(env_dict(job.container_overrides.get("environment")))
            env.update(self._secret_env(props))
            env.update(batch_env)
            return [Node(0, self._resolve_command(job, command), env, self._stream_name(job))]

        node_props = job_def.node_properties or {}
        overrides = run.submit.get("nodeOverrides") or {}
        num_nodes = int(overrides.get("numNodes") or node_props["numNodes"])
        main = int(node_props.get("mainNode", 0))
        run.num_nodes, run.main_index = num_nodes, main
        containers: dict[int, dict[str, Any]] = {}
        for node_range in node_props.get("nodeRangeProperties", []):
            for i in target_nodes(node_range["targetNodes"], num_nodes):
                containers[i] = node_range.get("container") or {}
        commands = {i: c.get("command") or [] for i, c in containers.items()}
        envs = {i: env_dict(c.get("environment")) for i, c in containers.items()}
        for override in overrides.get("nodePropertyOverrides", []):
            container = override.get("containerOverrides") or {}
            for i in target_nodes(override["targetNodes"], num_nodes):
                if container.get("command"):
                    commands[i] = container["command"]
                envs.setdefault(i, {}).update(env_dict(container.get("environment")))
        nodes = []
        for i in range(num_nodes):
            if i not in containers:
                raise ValueError(f"node {i} of {num_nodes} is in no nodeRangeProperties targetNodes range")
            self._note_image(containers[i].get("image"))
            env = {
                **envs[i],
                **self._secret_env(containers[i]),
                **batch_env,
                "AWS_BATCH_JOB_ID": f"{job.job_id}#{i}",
                "AWS_BATCH_JOB_NUM_NODES": str(num_nodes),
                "AWS_BATCH_JOB_NODE_INDEX": str(i),
                "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(main),
            }
            if i != main:
                env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = MAIN_NODE_ADDRESS
            own_rendezvous_port(env, f"batch/{id(self)}/{job.job_id}")  # nodes of their own: no other job's port
            nodes.append(Node(i, self._resolve_command(job, commands[i]), env, self._stream_name(job)))
        return nodes

    def _secret_env(self, container: dict[str, Any]) -> dict[str, str]:
        """What Batch puts into the container from its ``secrets`` (real Batch reads them with the execution
        role; here from this emulator's Secrets Manager and SSM). ``LookupError`` names what failed."""
        refs = {str(s["name"]): str(s["valueFrom"]) for s in container.get("secrets") or []}
        if not refs:
            return {}

        def client(service: str, region: str | None) -> Any:
            return aws_client(service, endpoint_url=self.endpoint_url, region=region or self.region)

        return resolve_secrets(refs, client)

    @staticmethod
    def _resolve_command(job: batch_models.Job, command: Any) -> list[str]:
        if not command:
            return []
        return [str(part) for part in job._add_parameters_to_command(command)]

    @staticmethod
    def _stream_name(job: batch_models.Job) -> str:
        return f"{job.job_definition.name}/default/{uuid.uuid4().hex}"

    def _note_image(self, image: str | None) -> None:
        if image and image not in self._images_seen:
            self._images_seen.add(image)
            logger.info("image %s is not pulled: AWS Batch emulator jobs run their command on this host", image)

    def _base_env(self) -> dict[str, str]:
        env = python_env()
        if self.job_aws_env:
            env.update(job_aws_env(self.endpoint_url, self.region))
        return env

    def _start_nodes(self, run: JobRun) -> None:
        job = run.job
        run.nodes = nodes = self._plan_nodes(run)
        for node in nodes:
            if not node.command:
                raise ValueError(
                    f"no command for node {node.index}: the emulator cannot run an image's default command"
                )
        logs = job._log_backend
        with self._logs_lock:
            logs.ensure_log_group(LOG_GROUP)
            for node in nodes:
                logs.ensure_log_stream(LOG_GROUP, node.stream)
        base = self._base_env()
        cwd = self.job_cwd or Path.cwd()
        order = [run.main] + [n for n in nodes if n.index != run.main_index]  # Batch starts the main node first
        # the containers' start, taken before they run: a job that ends at once (its end is recorded by another
        # thread) must not end before it started, as it did on a loaded machine (no GPU time)
        started_at = datetime.now()
        try:
            for node in order:
                node.proc = subprocess.Popen(
                    node.command,
                    cwd=cwd,
                    env={**base, **node.env},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                node.reader = threading.Thread(
                    target=self._pump_logs,
                    args=(job, node),
                    name=f"batch-emulator-logs-{job.job_id}-{node.index}",
                    daemon=True,
                )
                node.reader.start()
        except OSError:
            for node in nodes:
                kill_group(node.proc, signal.SIGKILL)
            raise
        job.job_started_at = started_at
        run.started = True
        job.log_stream_name = run.main.stream
        clusters = [env.ecs_name for env in job.job_queue.environments] or ["batch"]
        ecs = f"arn:aws:ecs:{job.backend.region_name}:{job.backend.account_id}"
        task_id = run.main.stream.rsplit("/", 1)[1]
        attempt = {
            "container": {
                "containerInstanceArn": f"{ecs}:container-instance/{clusters[0]}/{uuid.uuid4().hex}",
                "taskArn": f"{ecs}:task/{clusters[0]}/{task_id}",
                "logStreamName": run.main.stream,
                "networkInterfaces": [{"privateIpv4Address": MAIN_NODE_ADDRESS}],
            },
            "startedAt": millis(job.job_started_at),
        }
        job.latest_attempt = attempt
        job.attempts.append(attempt)

    def _pump_logs(self, job: batch_models.Job, node: Node) -> None:
        """Copy a container's output to its CloudWatch stream, one event per line, as it is printed."""
        assert node.proc is not None and node.proc.stdout is not None
        logs = job._log_backend
        with node.proc.stdout:
            for raw in iter(node.proc.stdout.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line:
                    continue
                event = {"timestamp": int(time.time() * 1000), "message": line}
                try:
                    with self._logs_lock:
                        logs.put_log_events(LOG_GROUP, node.stream, [event])
                except Exception:  # the backend was reset under a job being killed: drain and drop
                    logger.debug("dropped a log line of job %s", job.job_id, exc_info=True)

    def _monitor(self, run: JobRun) -> None:
        start = time.monotonic()
        duration = run.job._get_attempt_duration()
        timeout_at = start + duration if duration else None
        preempt_at = start + run.preempt_delay if run.preempt_delay is not None else None
        while run.stop_kind is None:
            now = time.monotonic()
            if preempt_at is not None and now >= preempt_at:
                self._preempt(run, None)
                break
            if timeout_at is not None and now >= timeout_at:
                run.request_stop(ATTEMPT_TIMED_OUT, "timeout")
                break
            if not run.main.alive():
                break
            run.wake.wait(_POLL)
        if run.stop_kind is not None:
            self._stop_nodes(run, run.nodes)
        else:  # the main node exited: Batch stops the other nodes
            self._stop_nodes(run, [n for n in run.nodes if n.index != run.main_index])
        for node in run.nodes:  # the container is gone: so is anything its command left behind
            kill_group(node.proc, signal.SIGKILL)
            if node.proc is not None:
                node.proc.wait()
        for node in run.nodes:
            if node.reader is not None:
                node.reader.join(timeout=5)
        assert run.main.proc is not None
        exit_code = container_exit_code(run.main.proc.returncode)
        if run.stop_kind == "preempt":  # the host went away: no exit code
            self._finish(run, success=False, reason=run.stop_reason or "")
        elif run.stop_kind is not None:
            self._finish(run, success=False, reason=run.stop_reason or "", exit_code=exit_code)
        else:
            self._finish(run, success=exit_code == 0, reason=ESSENTIAL_CONTAINER_EXITED, exit_code=exit_code)

    def _stop_nodes(self, run: JobRun, nodes: list[Node]) -> None:
        """SIGTERM to the nodes' process groups, SIGKILL to what is left after the grace period."""
        alive = [n for n in nodes if n.alive()]
        if not alive:
            return
        for node in alive:
            kill_group(node.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        while any(n.alive() for n in alive) and time.monotonic() < deadline and not run.hurry.is_set():
            run.hurry.wait(_POLL)
        for node in alive:
            if node.alive():
                kill_group(node.proc, signal.SIGKILL)

    def _preempt(self, run: JobRun, instance_id: str | None) -> None:
        reason = f"Host EC2 (instance {instance_id or run.instance_id}) terminated."
        if run.request_stop(reason, "preempt"):
            logger.info("job %s (%s) preempted: %s", run.job.job_name, run.job.job_id, reason)

    def _finish_stopped(self, run: JobRun) -> None:
        self._finish(run, success=False, reason=run.stop_reason or "")

    def _finish(self, run: JobRun, *, success: bool, reason: str, exit_code: int | None = None) -> None:
        job = run.job
        if job.job_stopped:
            return
        before = job_state(job)
        job.exit_code = exit_code
        job.job_stopped_reason = reason
        if job.latest_attempt is not None:
            job.latest_attempt["statusReason"] = reason
            if exit_code is not None:
                job.latest_attempt["container"]["exitCode"] = exit_code
        job._mark_stopped(success=success)
        self._state_event(job)
        logger.info(
            "job %s (%s) %s -> %s: %s%s",
            job.job_name,
            job.job_id,
            before,
            job_state(job),
            reason,
            f" (exit code {exit_code})" if exit_code is not None else "",
        )

    # --- multi-node: the node jobs <jobId>#<index>

    def _node_view(self, job: batch_models.Job, index: int) -> NodeView | None:
        run = self._runs.get(job.job_id)
        if run is None or job.job_definition.type != "multinode" or not 0 <= index < run.num_nodes:
            return None
        node = run.nodes[index] if index < len(run.nodes) else None
        return NodeView(run, index, node)


class NodeView:
    """DescribeJobs / ListJobs entry of one node of a multi-node job (``<jobId>#<index>``)."""

    def __init__(self, run: JobRun, index: int, node: Node | None) -> None:
        self.run, self.index, self.node = run, index, node

    def status(self) -> str:
        job, node = self.run.job, self.node
        if node is None or node.proc is None or node.alive():
            return job_state(job)
        if self.index == self.run.main_index and job.job_stopped:
            return job_state(job)
        if self.run.stop_kind is not None:
            return "FAILED"
        return "SUCCEEDED" if node.proc.returncode == 0 else "FAILED"

    def describe_short(self) -> dict[str, Any]:
        job = self.run.job
        status = self.status()
        result: dict[str, Any] = {
            "jobId": f"{job.job_id}#{self.index}",
            "jobArn": f"{job.arn}#{self.index}",
            "jobName": job.job_name,
            "createdAt": millis(job.job_created_at),
            "status": status,
            "jobDefinition": job.job_definition.arn,
            "nodeProperties": {
                "isMainNode": self.index == self.run.main_index,
                "numNodes": self.run.num_nodes,
                "nodeIndex": self.index,
            },
        }
        if self.run.started:
            result["startedAt"] = millis(job.job_started_at)
        if status in ("SUCCEEDED", "FAILED"):
            result["stoppedAt"] = millis(job.job_stopped_at if job.job_stopped else datetime.now())
            if job.job_stopped_reason:
                result["statusReason"] = job.job_stopped_reason
            if self.node is not None and self.node.proc is not None and self.run.stop_kind != "preempt":
                result["container"] = {"exitCode": container_exit_code(self.node.proc.returncode)}
        return result

    def describe(self) -> dict[str, Any]:
        result = self.describe_short()
        result.pop("nodeProperties")
        result["jobQueue"] = self.run.job.job_queue.arn
        result["nodeDetails"] = {"nodeIndex": self.index, "isMainNode": self.index == self.run.main_index}
        container: dict[str, Any] = dict(result.get("container", {}))
        if self.node is not None:
            container["command"] = self.node.command
            container["environment"] = [{"name": k, "value": v} for k, v in self.node.env.items()]
            if self.run.started:
                container["logStreamName"] = self.node.stream
        result["container"] = container
        result["attempts"] = (
            [{"container": {"logStreamName": self.node.stream}, "startedAt": result["startedAt"]}]
            if self.run.started and self.node is not None
            else []
        )
        return result
