"""Operator worlds: the contract suite's backend worlds (``tests/backends/contract/worlds.py``) with what
the operator suite needs on top: the backend as Python source for a DAG file, what the service was asked
to create and to stop, spot capacity that is reclaimed or never comes, and a checkpoint location the
service can use.

Every operator test runs once per world. A fifth backend: subclass its contract world with
:class:`OperatorWorld`, add it to :data:`OPERATOR_WORLDS`, and every operator test runs against it.
What a service does differently lives here, once per backend; the tests read it only through these
methods.
"""

from __future__ import annotations

import json
import threading
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpu_provider import names
from gpu_provider.backends.base import Backend, JobHandle, JobState, JobStatus, TaskKey
from gpu_provider.backends.kubernetes.mapping import CANCEL_ANNOTATION
from gpu_provider.backends.local import common as local_common
from gpu_provider.backends.sagemaker.backend import TAG_STOP_REASON, decode_tag_text
from gpu_provider.testing.worlds import CHECKPOINT_BUCKET
from tests.backends.contract.worlds import (
    BackendWorld,
    BatchBackendWorld,
    KubernetesBackendWorld,
    LocalBackendWorld,
    SageMakerBackendWorld,
    poll_one,
)
from tests.harness import wait_for

#: the run id of a ``dag.test()`` run at the harness's default logical date (``Harness.start``)
RUN_ID = "manual__2026-01-05T00:00:00+00:00"


@dataclass(frozen=True)
class Created:
    """One create request the service accepted, in the terms every backend shares."""

    name: str
    capacity: str
    attempt: int
    #: ``GPU_PROVIDER_RESUME_FROM`` as the job got it ("" for a fresh start)
    resume_from: str


def strip_cancel_prefix(reason: str) -> str:
    """A stop reason as the provider's caller gave it (backends put :data:`names.CANCEL_PREFIX` before it)."""
    return reason[len(names.CANCEL_PREFIX) :] if reason.startswith(names.CANCEL_PREFIX) else reason


class OperatorWorld(BackendWorld):
    """A backend world as the operator suite uses it (on top of the contract world's knobs)."""

    #: a short code that starts every DAG id of this world (DAG ids and job names stay unique per world:
    #: the emulators and the Airflow metadata DB live for the whole test session)
    code: ClassVar[str]
    #: words of the reason the service gives when the job's program exits with code 3
    exit_3_words: ClassVar[str]
    #: words of the reason such an attempt ends with
    preempted_words: ClassVar[str]

    @property
    def preempted_state(self) -> str:
        """The state an attempt ends in when its spot capacity is reclaimed while it runs: PREEMPTED, or where
        the service restarts an interrupted job itself (``capabilities.restarts_inside_job``) CANCELLED, as the
        provider stops it at the restart limit (and counts a preemption)."""
        restarts = self.backend_class().capabilities.restarts_inside_job
        return (JobState.CANCELLED if restarts else JobState.PREEMPTED).value

    def dag_id(self, behaviour: str) -> str:
        """A DAG id for one test of this world: its first 14 characters (what job names keep) are unique."""
        dag_id = f"op{self.code}_{behaviour}"
        assert len(dag_id) <= 14, f"{dag_id!r}: keep DAG ids of the operator suite to 14 characters"
        return dag_id

    def task_key(self, dag_id: str) -> TaskKey:
        """The task instance ``job`` of a harness run of ``dag_id``."""
        return TaskKey(dag_id, "job", RUN_ID)

    @abstractmethod
    def backend_source(self) -> str:
        """The backend of :meth:`backend`, as Python source for a DAG file."""

    def checkpoint_uri(self, tmp: Path, name: str) -> str:
        """Where a job of this world can write checkpoints."""
        return f"file://{tmp / name}"

    @abstractmethod
    def created(self) -> list[Created]:
        """Every job the service was asked to create during this test, oldest first."""

    @abstractmethod
    def stopped(self) -> list[tuple[str, str]]:
        """``(job_id, reason)`` of every stop the provider asked of the service during this test, oldest first
        (the reason as the provider's caller gave it)."""

    @abstractmethod
    def preempt_spot_after(self, seconds: float, task: TaskKey) -> None:
        """Reclaim the spot capacity of ``task``'s first spot attempt ``seconds`` after it starts running
        (call before writing the DAG: a world may say it in the backend's options)."""

    def hold_spot(self) -> None:
        """From now on, spot attempts wait for capacity until :meth:`release_spot`."""
        self.hold_capacity()

    def release_spot(self) -> None:
        self.release_capacity()

    def handles(self, task: TaskKey) -> list[JobHandle]:
        """The attempts of ``task`` the service has, oldest first (what a retry finds)."""
        return self.backend().find_existing(task)

    def status(self, handle: JobHandle) -> JobStatus:
        return poll_one(self.backend(), handle)

    def handle_of(self, task: TaskKey, attempt: Mapping[str, Any]) -> JobHandle:
        """The handle of an attempt of ``task`` (an attempt record from the task's XCom), as a retry finds it."""
        found = {h.job_id: h for h in self.handles(task)}
        assert attempt["job_id"] in found, f"a retry would not find {attempt['job_id']}; found {sorted(found)}"
        return found[attempt["job_id"]]

    def release_spot_once_given_up(self, task: TaskKey) -> threading.Thread:
        """Release the held spot capacity once ``task``'s spot attempt has ended (in a thread): a world that
        holds all of its capacity to hold spot (local) lets the on-demand attempt run then."""

        seen: list[JobHandle] = []

        def given_up() -> bool:
            spot = [h for h in self.handles(task) if h.capacity == names.SPOT]
            if not spot:
                return bool(seen)  # seen, and gone from the lists since (Kubernetes deletes the pod)
            seen[:] = spot[:1]
            return self.status(spot[0]).state.terminal

        def release() -> None:
            try:
                wait_for(given_up, 180, "the spot attempt to be given up")
            finally:
                self.release_spot()

        thread = threading.Thread(target=release, name=f"release-spot-{self.name}", daemon=True)
        thread.start()
        return thread

    def check_found_by_name(self) -> None:
        """Assert how the service was asked for a task's attempts by name (a world may say more)."""


class LocalOperatorWorld(OperatorWorld, LocalBackendWorld):
    """The local backend; its service is the state directory (``request.json`` and ``cancel.json`` per job)."""

    code = "lo"
    exit_3_words = "exited with code 3"
    preempted_words = "simulated spot interruption"

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.options: dict[str, Any] = {
            "state_dir": str(self.state_dir),
            "grace_period": 1.0,
            "gpus": list(self.devices),
        }

    def backend(self) -> Backend:
        from gpu_provider.backends.local import LocalBackend

        return LocalBackend(**self.options)

    def backend_source(self) -> str:
        return f"LocalBackend({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"

    def _requests(self) -> list[dict[str, Any]]:
        jobs = self.state_dir / local_common.JOBS_DIR
        folders = list(jobs.glob("*/")) if jobs.is_dir() else []
        found = [json.loads((d / local_common.REQUEST_FILE).read_text()) for d in folders]
        return sorted(found, key=lambda r: float(r["submitted_at"]))

    def created(self) -> list[Created]:
        return [
            Created(r["job_id"], r["capacity"], int(r["identity"]["attempt"]), r.get("resume_from") or "")
            for r in self._requests()
        ]

    def stopped(self) -> list[tuple[str, str]]:
        jobs = self.state_dir / local_common.JOBS_DIR
        stops = []
        for request in self._requests():
            cancel = jobs / request["job_id"] / local_common.CANCEL_FILE
            if cancel.exists():
                data = json.loads(cancel.read_text())
                stops.append((float(data["at"]), request["job_id"], strip_cancel_prefix(data["reason"])))
        return [(job_id, reason) for _, job_id, reason in sorted(stops)]

    def preempt_spot_after(self, seconds: float, task: TaskKey) -> None:
        # the backend's own simulation: the first spot attempt of every task is interrupted after ``seconds``
        self.options["simulate_preemptions"] = [seconds]

    def hold_spot(self) -> None:
        # the ledger cannot tell spot from on-demand GPUs: hold them all (release_spot_once_given_up frees them)
        self.hold_capacity()


class _AwsRequests:
    """Reading an AWS emulator's request log (bodies of the requests the server accepted)."""

    emulator: Any

    def bodies(self, action: str) -> list[dict[str, Any]]:
        return [r["body"] for r in self.emulator.requests(action) if not r["throttled"]]


def _env_list(entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(e["name"]): str(e.get("value", "")) for e in entries}


class BatchOperatorWorld(OperatorWorld, _AwsRequests, BatchBackendWorld):
    """AWS Batch: a spot queue and an on-demand queue; a stop is ``TerminateJob``."""

    code = "ba"
    exit_3_words = "Essential container in task exited"
    preempted_words = "Host EC2 (instance i-"

    def backend_source(self) -> str:
        return self.batch.backend_source()

    def created(self) -> list[Created]:
        created = []
        for body in self.bodies("SubmitJob"):
            overrides = body.get("containerOverrides")
            if "nodeOverrides" in body:  # a multi-node job: every node gets the same environment
                (overrides,) = [o["containerOverrides"] for o in body["nodeOverrides"]["nodePropertyOverrides"]]
            env = _env_list((overrides or {}).get("environment") or [])
            capacity = names.SPOT if body["jobQueue"] == self.batch.setup.spot_queue else names.ON_DEMAND
            assert body["jobQueue"] in (self.batch.setup.spot_queue, self.batch.setup.on_demand_queue), body
            created.append(
                Created(body["jobName"], capacity, int(env[names.ENV_ATTEMPT]), env.get(names.ENV_RESUME_FROM, ""))
            )
        return created

    def stopped(self) -> list[tuple[str, str]]:
        stops = []
        for body in self.bodies("TerminateJob"):
            assert body["reason"].startswith(names.CANCEL_PREFIX), f"a TerminateJob without our prefix: {body}"
            stops.append((body["jobId"], strip_cancel_prefix(body["reason"])))
        return stops

    def preempt_spot_after(self, seconds: float, task: TaskKey) -> None:
        self.emulator.preempt_after(seconds, queue=self.batch.setup.spot_queue, name_contains=task.prefix)

    def hold_spot(self) -> None:
        self.emulator.hold(self.batch.setup.spot_queue)

    def release_spot(self) -> None:
        self.emulator.release(self.batch.setup.spot_queue)

    def check_found_by_name(self) -> None:
        assert {b["filters"][0]["name"] for b in self.bodies("ListJobs")} == {"JOB_NAME"}


class SageMakerOperatorWorld(OperatorWorld, _AwsRequests, SageMakerBackendWorld):
    """SageMaker training jobs; a stop is ``StopTrainingJob`` after a tag with the reason; a reclaimed spot
    job is restarted by SageMaker itself (``capabilities.restarts_inside_job``) until the restart limit."""

    code = "sm"
    exit_3_words = "AlgorithmError: , exit code: 3"
    preempted_words = names.RESTART_LIMIT_MARK

    def backend_source(self) -> str:
        return self.sagemaker.backend_source()

    def checkpoint_uri(self, tmp: Path, name: str) -> str:
        return f"s3://{CHECKPOINT_BUCKET}/{tmp.name}/{name}"  # SageMaker syncs checkpoints with S3 only

    def created(self) -> list[Created]:
        return [
            Created(
                b["TrainingJobName"],
                names.SPOT if b.get("EnableManagedSpotTraining") else names.ON_DEMAND,
                int(b["Environment"][names.ENV_ATTEMPT]),
                b["Environment"].get(names.ENV_RESUME_FROM, ""),
            )
            for b in self.bodies("CreateTrainingJob")
        ]

    def stopped(self) -> list[tuple[str, str]]:
        reasons: dict[str, str] = {}
        for body in self.bodies("AddTags"):
            for tag in body["Tags"]:
                if tag["Key"] == TAG_STOP_REASON:
                    reasons[body["ResourceArn"].rsplit("/", 1)[1]] = strip_cancel_prefix(decode_tag_text(tag["Value"]))
        stops = []
        for body in self.bodies("StopTrainingJob"):
            name = body["TrainingJobName"]
            assert name in reasons, f"StopTrainingJob of {name} without the reason tagged first"
            stops.append((name, reasons[name]))
        return stops

    def preempt_spot_after(self, seconds: float, task: TaskKey) -> None:
        self.emulator.interrupt_after(seconds, name_contains=task.prefix)

    def hold_spot(self) -> None:
        self.emulator.hold(names.SPOT)

    def release_spot(self) -> None:
        self.emulator.release(names.SPOT)


class KubernetesOperatorWorld(OperatorWorld, KubernetesBackendWorld):
    """Kubernetes with Karpenter: a one-node job is a pod, a multi-node job an indexed Job; a stop is an
    annotation with the reason, then a delete with ``propagationPolicy: Foreground`` (so the pods go too)."""

    code = "k8"
    exit_3_words = "exit code 3"
    preempted_words = "DisruptionTarget"

    def backend_source(self) -> str:
        return repr({"name": "kubernetes"})

    def _bodies(self, action: str) -> list[dict[str, Any]]:
        return [r["body"]["body"] for r in self.emulator.requests(action) if not r["throttled"]]

    def created(self) -> list[Created]:
        created = []
        for entry in self.emulator.requests():
            if entry["throttled"] or entry["action"] not in ("create pods", "create jobs"):
                continue
            manifest = entry["body"]["body"]
            pod = manifest["spec"]["template"]["spec"] if manifest["kind"] == "Job" else manifest["spec"]
            env = _env_list(pod["containers"][0]["env"])
            created.append(
                Created(
                    manifest["metadata"]["name"],
                    pod["nodeSelector"]["karpenter.sh/capacity-type"],
                    int(env[names.ENV_ATTEMPT]),
                    env.get(names.ENV_RESUME_FROM, ""),
                )
            )
        return created

    def stopped(self) -> list[tuple[str, str]]:
        reasons: dict[str, str] = {}
        for entry in self.emulator.requests():
            if entry["action"] in ("patch pods", "patch jobs") and not entry["throttled"]:
                annotations = (entry["body"]["body"].get("metadata") or {}).get("annotations") or {}
                if CANCEL_ANNOTATION in annotations:
                    name = entry["body"]["path"].rsplit("/", 1)[1]
                    reasons[name] = strip_cancel_prefix(annotations[CANCEL_ANNOTATION])
        stops = []
        for entry in self.emulator.requests():
            if entry["action"] in ("delete pods", "delete jobs") and not entry["throttled"]:
                name = entry["body"]["path"].rsplit("/", 1)[1]
                if name not in reasons:
                    continue  # not a stop of ours (a pod that can never start, deleted with its reason elsewhere)
                assert entry["body"]["body"].get("propagationPolicy") == "Foreground", entry
                stops.append((name, reasons[name]))
        return stops

    def preempt_spot_after(self, seconds: float, task: TaskKey) -> None:
        self.emulator.reclaim_after(seconds, name_contains=task.prefix)

    def hold_spot(self) -> None:
        self.emulator.set_shortage(names.SPOT)

    def handle_of(self, task: TaskKey, attempt: Mapping[str, Any]) -> JobHandle:
        # a deleted pod is gone from the lists; its Event stays, and a poll of its handle reads it
        found = {h.job_id: h for h in self.handles(task)}
        if attempt["job_id"] in found:
            return found[attempt["job_id"]]
        job_id, name = attempt["job_id"], attempt["name"]
        return JobHandle("kubernetes", job_id, name, attempt["attempt"], attempt["capacity"], 0.0, {"kind": "Pod"})

    def release_spot(self) -> None:
        self.emulator.set_shortage(names.SPOT, False)


#: every world the operator suite runs against, by name (the ``world`` fixture's parameters)
OPERATOR_WORLDS: dict[str, type[OperatorWorld]] = {
    "local": LocalOperatorWorld,
    "batch": BatchOperatorWorld,
    "kubernetes": KubernetesOperatorWorld,
    "sagemaker": SageMakerOperatorWorld,
}


@pytest.fixture(name="world", params=list(OPERATOR_WORLDS))
def operator_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OperatorWorld]:
    """Fixture ``world``: one backend and its emulator for an operator test (it says what the service was asked
    to create and stop); whatever the test left running is stopped after it. Import it where it is used."""
    built = OPERATOR_WORLDS[request.param].create(request, tmp_path)
    assert isinstance(built, OperatorWorld)
    try:
        yield built
    finally:
        built.cleanup()
