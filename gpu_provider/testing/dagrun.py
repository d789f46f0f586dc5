"""Run a DAG with ``dag.test()`` in a child process and read what each GPU task did.

The child (``python -m gpu_provider.testing.dagrun DAG_FILE DAG_ID LOGICAL_DATE CONF_JSON OUT_JSON``)
imports the DAG file, creates the team pools its tasks name, runs the DAG with ``dag.test()`` and
writes each task instance's state, try number and XCom (a ``GpuJobOperator``'s ``JobResult``) as JSON.
A child process, so that a test can SIGKILL or SIGTERM the "worker", and so that the test process
never imports Airflow's configuration for the DAG's Airflow home. The children are forked from a warm
server that has imported Airflow once (:mod:`gpu_provider.testing.warm`), unless that is turned off.

:class:`DagRunner` starts such children and cleans up after them (every child killed, every local job
cancelled); :class:`Interrupter` interrupts the local backend's jobs of chosen tasks at chosen times.
The child's code is in :mod:`gpu_provider.testing.dagchild` (its names are importable from here too).
Base install only: nothing here imports moto, boto3 or an emulator.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpu_provider.testing import warm
from gpu_provider.testing.dagchild import NO_LOGICAL_DATE, load_dags, main

__all__ = [
    "NO_LOGICAL_DATE",
    "DagRun",
    "DagRunner",
    "Interrupter",
    "TaskRun",
    "load_dags",
    "main",
    "pid_alive",
    "wait_for",
]

#: a checkpoint folder's name: ``ckpt-<step, zero-padded to 10>``
_CKPT_STEP = re.compile(r"ckpt-(\d+)/?$")


@dataclass
class TaskRun:
    """What one task instance did: its Airflow state and try, and per attempt of its GPU job the
    capacity, the checkpoint it resumed from and the output it declared (from its ``JobResult``)."""

    task_id: str
    state: str
    try_number: int
    xcom: Any

    @property
    def result(self) -> dict[str, Any]:
        """The task's ``JobResult`` (``{}`` for a task that is not a GPU job or returned nothing)."""
        return dict(self.xcom) if isinstance(self.xcom, dict) and "attempts" in self.xcom else {}

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """The attempt records, oldest first (``attempt``, ``capacity``, ``state``, ``resume_from``, ...)."""
        return [dict(a) for a in self.result.get("attempts", [])]

    @property
    def capacities(self) -> list[str]:
        """The capacity of each attempt: ``["spot", "on-demand"]`` after one spot interruption and a fallback."""
        return [str(a.get("capacity")) for a in self.attempts]

    @property
    def attempt_states(self) -> list[str]:
        """How each attempt ended: ``["PREEMPTED", "SUCCEEDED"]``."""
        return [str(a.get("state")) for a in self.attempts]

    @property
    def resume_points(self) -> list[str | None]:
        """The checkpoint each attempt resumed from (``None``: a fresh start)."""
        return [a.get("resume_from") or None for a in self.attempts]

    @property
    def resume_steps(self) -> list[int | None]:
        """The step of each attempt's resume point (``ckpt-0000000062`` -> 62; ``None``: a fresh start)."""
        steps: list[int | None] = []
        for point in self.resume_points:
            match = _CKPT_STEP.search(point or "")
            steps.append(int(match.group(1)) if match else None)
        return steps

    @property
    def interruptions(self) -> int:
        return int(self.result.get("interruptions", 0))

    @property
    def output(self) -> str | None:
        """The output URI the job declared (``gpu_provider.runtime.declare_output``), else ``None``."""
        value = self.result.get("output_uri")
        return str(value) if value else None


@dataclass
class DagRun:
    """A finished child run: its exit code, its JSON dump and its whole log."""

    returncode: int
    result: dict[str, Any]
    log: str

    @property
    def state(self) -> str:
        return str(self.result.get("state"))

    @property
    def run_id(self) -> str:
        return str(self.result.get("run_id"))

    @property
    def tasks(self) -> dict[str, TaskRun]:
        return {name: self[name] for name in self.result.get("tasks", {})}

    def task(self, task_id: str = "job") -> dict[str, Any]:
        """The raw record of one task instance (``state``, ``try_number``, ``xcom``)."""
        return dict(self.result["tasks"][task_id])

    def __getitem__(self, task_id: str) -> TaskRun:
        tasks = self.result.get("tasks", {})
        if task_id not in tasks:
            raise KeyError(f"the run has no task {task_id!r}; its tasks: {sorted(tasks)}")
        raw = tasks[task_id]
        return TaskRun(task_id, str(raw["state"]), int(raw["try_number"]), raw.get("xcom"))


class ChildProcess(Protocol):
    """A started run: a ``subprocess.Popen``, or a :class:`~gpu_provider.testing.warm.WarmChild` forked by
    the warm server; either is a process group of its own (``os.killpg(child.pid, ...)``)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def _kill(proc: ChildProcess) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@dataclass
class DagRunner:
    """Starts ``dag.test()`` children against one Airflow home, and cleans up after them.

    :param home: the Airflow home (a migrated metadata DB) the children use
    :param tmp: where results and logs are written
    :param state_dir: the local backend's state directory the children's default ``LocalBackend`` uses
        (``[gpu_provider] local_state_dir``); every job left there is cancelled by :meth:`cleanup`
    :param env: more environment for every child (connections, config)
    :param warm: fork the children from a warm server (:mod:`gpu_provider.testing.warm`: the same run,
        about 14 s less CPU each); False, or ``GPU_PROVIDER_TESTING_WARM=0``: a fresh interpreter each
    """

    home: Path
    tmp: Path
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    warm: bool = True
    started: list[ChildProcess] = field(default_factory=list)

    def child_env(self, dag_file: Path, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                # dag.test() needs the DAG file inside the DAGs folder
                "AIRFLOW__CORE__DAGS_FOLDER": str(Path(dag_file).resolve().parent),
                "AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(self.state_dir),
            }
        )
        env.update(self.env)
        env.update(extra_env or {})
        return env

    def start(
        self,
        dag_file: str | os.PathLike[str],
        dag_id: str | None = None,
        *,
        logical_date: str | None = "2026-01-05T00:00:00+00:00",
        conf: Mapping[str, Any] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> tuple[ChildProcess, Path, Path]:
        """Start a child that runs ``dag_id`` (default: the file's only DAG) of ``dag_file``.

        :param logical_date: ISO 8601; ``None``: a run without a logical date and data interval, as the UI
            and the REST API make with ``logical_date: null`` (its run id from the time it starts)
        """
        dag_file = Path(dag_file).resolve()
        if not dag_file.is_file():
            raise FileNotFoundError(f"dag_file={str(dag_file)!r} is not a file")
        name = dag_id or dag_file.stem
        out = self.tmp / f"{name}-{time.monotonic_ns()}.json"
        log = out.with_suffix(".log")
        self.tmp.mkdir(parents=True, exist_ok=True)
        when = NO_LOGICAL_DATE if logical_date is None else logical_date
        run_args = [str(dag_file), dag_id or "", when, json.dumps(dict(conf or {})), str(out)]
        env = self.child_env(dag_file, extra_env)
        log.write_text("")  # exists at once: a test may read it before the run has written anything
        server = warm.WarmServer.for_env(env) if self.warm and warm.enabled(env) else None
        proc: ChildProcess
        if server is not None:
            proc = server.start(run_args, env, log)
        else:
            with log.open("w") as log_file:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gpu_provider.testing.dagrun", *run_args],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    text=True,
                    start_new_session=True,
                )
        self.started.append(proc)
        return proc, out, log

    def run(
        self, dag_file: str | os.PathLike[str], dag_id: str | None = None, *, timeout: float = 180, **kwargs: Any
    ) -> DagRun:
        return self.finish(*self.start(dag_file, dag_id, **kwargs), timeout=timeout)

    def finish(self, proc: ChildProcess, out: Path, log: Path, *, timeout: float = 180) -> DagRun:
        """Wait for a run :meth:`start` began, and read its result."""
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            _kill(proc)
        text = log.read_text()
        if not out.exists():
            raise AssertionError(f"dag.test child exited {rc} without a result; log tail:\n{text[-4000:]}")
        return DagRun(rc, json.loads(out.read_text()), text)

    def cleanup(self) -> None:
        """Kill every child still running and cancel every local job left in the state directory."""
        for proc in self.started:
            _kill(proc)
        self.started.clear()
        from gpu_provider.backends.local import LocalBackend

        backend = LocalBackend(state_dir=str(self.state_dir), grace_period=0.5)
        for handle in backend.list_jobs():
            backend.cancel(handle, "test teardown")


class Interrupter:
    """Interrupts the local backend's jobs of chosen tasks at chosen times, from outside the DAG.

    ``{"train": [30, 5]}``: attempt 1 of task ``train`` is interrupted 30 s after its processes started,
    attempt 2 after 5 s; later attempts run undisturbed. An interruption is the local backend's
    simulated spot interruption (SIGTERM, its grace period, SIGKILL; the attempt ends ``PREEMPTED``),
    on any capacity, so a DAG is tested as it is written. Runs in a thread while the DAG runs.
    """

    def __init__(self, state_dir: Path, plan: Mapping[str, Sequence[float]], *, poll: float = 0.1) -> None:
        for task_id, times in plan.items():
            if not isinstance(times, (list, tuple)) or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in times
            ):
                raise ValueError(
                    f"interrupt[{task_id!r}]={times!r} must be a list of seconds (>= 0) after the start of "
                    "attempt 1, 2, ... of that task, e.g. {'train': [30]}"
                )
        self.state_dir = state_dir
        self.plan = {task: [float(t) for t in times] for task, times in plan.items()}
        self.poll = poll
        self.done: list[tuple[str, int, str]] = []  # (task id, attempt, job id) interrupted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-provider-interrupter", daemon=True)

    def __enter__(self) -> Interrupter:
        if self.plan:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        from gpu_provider.backends.base import JobState
        from gpu_provider.backends.local import LocalBackend

        backend = LocalBackend(state_dir=str(self.state_dir))
        seen: set[str] = set()
        while not self._stop.wait(self.poll):
            try:
                owned = backend.list_owned() if backend.state_dir.exists() else []
            except OSError:
                continue
            for job in owned:
                task = job.task.task_id if job.task is not None else None
                times = self.plan.get(task or "")
                index = job.handle.attempt - 1
                if job.handle.job_id in seen or times is None or index >= len(times):
                    continue
                if job.state is not JobState.RUNNING or job.started_at is None:
                    continue
                if time.time() - job.started_at >= times[index]:
                    seen.add(job.handle.job_id)
                    try:
                        backend.simulate_preemption(job.handle)
                    except Exception:  # the job ended meanwhile: nothing to interrupt
                        continue
                    self.done.append((str(task), job.handle.attempt, job.handle.job_id))


def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` every ``interval`` seconds (50 ms unless told) until it returns something true (returned),
    else fail after ``timeout``. A predicate that asks a server (a REST call, a DB query) costs that server CPU on
    every poll: such waits poll less often."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # the state follows the command name in parentheses, which may itself hold spaces
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    main()
