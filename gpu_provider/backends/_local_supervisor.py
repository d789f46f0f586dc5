"""The per-job supervisor of the local backend: ``python -m gpu_provider.backends._local_supervisor <job_dir>``.

``LocalBackend.submit`` starts one supervisor per job in a new session, so the job outlives the
Airflow worker that submitted it. The supervisor waits for GPUs, starts one process per node (each
in its own process group, so the command's children can be stopped with it), copies their output
into ``job.log``, enforces the max runtime and simulated spot interruptions, and records every
state change in ``status.json``. SIGTERM (sent by ``LocalBackend.cancel``) stops the job as
cancelled. The on-disk layout is described in :mod:`gpu_provider.backends._local_common`.

Standard library only, and no Airflow: it starts fast and stays small.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import IO, Any

from gpu_provider.backends import _local_common as common
from gpu_provider.backends._local_gpus import Allocation, allocate, format_devices, never_fits, release

#: how often the supervisor looks at its node processes (and at cancel requests)
_TICK_S = 0.05
#: how often a job waiting for GPUs retries the allocation
_GPU_RETRY_S = 0.5
#: how long to wait for the log pumps after the nodes are gone (a detached grandchild may hold a pipe)
_PUMP_JOIN_S = 2.0


def _exit_code(returncode: int) -> int:
    """A shell-style exit code: a process killed by signal N reports 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _describe_exit(rank: int, returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"node {rank} was killed by signal {-returncode} ({name})"
    return f"node {rank} exited with code {returncode}"


def _free_port() -> int:
    """A TCP port free on the loopback interface right now (the rendezvous port of the job)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Supervisor:
    """Runs one job described by ``<job_dir>/request.json`` to a terminal state.

    :param job_dir: the job's directory, created by ``LocalBackend.submit``
    """

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        request = common.read_json(job_dir / common.REQUEST_FILE)
        if request is None:
            raise RuntimeError(f"{job_dir / common.REQUEST_FILE} is missing or not valid JSON")
        self.request: dict[str, Any] = request
        self.job_id = str(request["job_id"])
        self.state_dir = Path(request["state_dir"])
        self.pid = os.getpid()
        self.pid_start = common.process_start_time(self.pid)
        self.status: dict[str, Any] = common.read_json(job_dir / common.STATUS_FILE) or {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pumps: list[threading.Thread] = []
        self.allocated = False
        self.sigterm = False
        self._log_lock = threading.Lock()
        self._log: IO[bytes] = open(job_dir / common.LOG_FILE, "ab")  # noqa: SIM115 - closed in run()

    # --- bookkeeping ---------------------------------------------------------------------------

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: only set a flag; the main loop turns it into a cancel."""
        self.sigterm = True

    def set_state(self, state: str, reason: str = "", **fields: Any) -> None:
        if state in common.TERMINAL_STATES and self.allocated:
            # GPUs go back before the final state is visible: whoever sees the end may reuse them at once
            release(self.state_dir, self.job_id)
            self.allocated = False
        self.status.update(fields)
        self.status.update(
            state=state,
            reason=reason,
            supervisor_pid=self.pid,
            supervisor_start=self.pid_start,
            updated_at=time.time(),
        )
        common.write_json_atomic(self.job_dir / common.STATUS_FILE, self.status)

    def note(self, message: str) -> None:
        """A line of the supervisor's own in the job log (what happened to the job, and why)."""
        self._write_log(b"[local] " + message.encode() + b"\n")

    def _write_log(self, data: bytes) -> None:
        # one write per line under a lock, so lines of concurrent nodes never interleave mid-line
        with self._log_lock:
            self._log.write(data)
            self._log.flush()

    def cancel_reason(self) -> str | None:
        """Why the job is to be cancelled, or ``None``. cancel.json is checked too, not only the
        signal: a SIGTERM that arrived before the handler was installed would otherwise be lost."""
        info = common.read_json(self.job_dir / common.CANCEL_FILE)
        if info is not None:
            return str(info.get("reason") or "cancelled")
        if self.sigterm:
            return "local supervisor received SIGTERM"
        return None

    # --- the job -------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._run()
            return 0
        except BaseException as err:
            traceback.print_exc()
            self._stop_nodes(grace=0.0)
            self.set_state(common.FAILED, f"local supervisor error: {type(err).__name__}: {err}", ended_at=time.time())
            return 1
        finally:
            if self.allocated:
                release(self.state_dir, self.job_id)
            self._log.close()

    def _run(self) -> None:
        req = self.request
        resources = req["resources"]
        gpus, nodes = float(resources["gpus"]), int(resources["nodes"])
        devices = [int(d) for d in req.get("gpu_devices") or []]
        self.set_state(common.QUEUED)

        per_node = self._wait_for_gpus(devices, gpus, nodes)
        if per_node is None:
            return
        cancel = self.cancel_reason()
        if cancel is not None:
            self.set_state(common.CANCELLED, cancel, ended_at=time.time())
            return

        port = _free_port()
        self.set_state(common.STARTING, master_port=port, gpu_devices=[list(d) for d in per_node])
        node_records: list[dict[str, Any]] = []
        for rank in range(nodes):
            try:
                proc = self._spawn(rank, nodes, port, per_node[rank])
            except OSError as err:
                self._stop_nodes(grace=0.0)
                self.note(f"could not start node {rank}: {err}")
                self.set_state(
                    common.FAILED, f"could not start node {rank}: {err}", exit_code=127, ended_at=time.time()
                )
                return
            node_records.append({"rank": rank, "pid": proc.pid, "pid_start": common.process_start_time(proc.pid)})
            # recorded at once: if this supervisor dies now, poll() still finds the processes to kill
            self.set_state(common.STARTING, nodes=node_records)
        started = time.time()
        self.set_state(common.RUNNING, started_at=started, nodes=node_records)
        self.note(f"{nodes} node(s) started, pids {', '.join(str(p.pid) for p in self.procs)}, MASTER_PORT={port}")

        state, reason, exit_code = self._watch(started)
        if state != common.SUCCEEDED:
            self.set_state(common.STOPPING, reason)
            self.note(f"stopping: {reason}; SIGTERM to every node, SIGKILL after {self.grace:g}s")
        self._stop_nodes(grace=self.grace if state != common.SUCCEEDED else 0.0)
        for pump in self.pumps:
            pump.join(_PUMP_JOIN_S)
        codes = [_exit_code(p.returncode) if p.returncode is not None else None for p in self.procs]
        for record, code in zip(node_records, codes, strict=True):
            record["exit_code"] = code
        if exit_code is None:
            exit_code = next((c for c in codes if c), None)
        self.note(f"job ended {state.upper()}" + (f": {reason}" if reason else ""))
        self.set_state(state, reason, exit_code=exit_code, exit_codes=codes, nodes=node_records, ended_at=time.time())

    @property
    def grace(self) -> float:
        return float(self.request.get("grace_period", 10.0))

    def _wait_for_gpus(self, devices: list[int], gpus: float, nodes: int) -> tuple[tuple[int, ...], ...] | None:
        """Block until the job holds its GPUs; ``None`` when it ended instead (cancelled, never fits)."""
        if not devices:
            return tuple(() for _ in range(nodes))  # CPU-only machine
        impossible = never_fits(devices, gpus, nodes)
        if impossible:
            self.set_state(common.FAILED, impossible, ended_at=time.time())
            return None
        while True:
            cancel = self.cancel_reason()
            if cancel is not None:
                self.set_state(common.CANCELLED, cancel, ended_at=time.time())
                return None
            result = allocate(
                self.state_dir,
                self.job_id,
                owner_pid=self.pid,
                owner_start=self.pid_start,
                devices=devices,
                gpus=gpus,
                nodes=nodes,
            )
            if isinstance(result, Allocation):
                self.allocated = True
                return result.per_node
            if self.status.get("state") != common.WAITING_FOR_GPUS or self.status.get("reason") != result:
                self.set_state(common.WAITING_FOR_GPUS, result)
            deadline = time.monotonic() + _GPU_RETRY_S
            while time.monotonic() < deadline and self.cancel_reason() is None:
                time.sleep(_TICK_S)

    def _spawn(self, rank: int, nodes: int, port: int, devices: tuple[int, ...]) -> subprocess.Popen[bytes]:
        req = self.request
        # the worker's allow-listed environment, then the job's env, then the per-node contract we own
        env: dict[str, str] = dict(req.get("base_env") or {})
        env.update(req.get("env") or {})
        env.update(
            NNODES=str(nodes),
            NODE_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            CUDA_VISIBLE_DEVICES=format_devices(devices),
            GPU_PROVIDER_OUTPUT_FILE=str(self.job_dir / common.OUTPUT_FILE),
            PYTHONUNBUFFERED="1",
        )
        proc = subprocess.Popen(
            list(req["command"]),
            env=env,
            cwd=req.get("cwd") or None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
            # own session = own process group: stopping a node stops everything the command started
            start_new_session=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        pump = threading.Thread(target=self._pump, args=(rank, proc.stdout), name=f"pump-{rank}", daemon=True)
        pump.start()
        self.pumps.append(pump)
        return proc

    def _pump(self, rank: int, stream: IO[bytes]) -> None:
        prefix = f"[node {rank}] ".encode()
        try:
            for line in iter(stream.readline, b""):
                self._write_log(prefix + (line if line.endswith(b"\n") else line + b"\n"))
        finally:
            stream.close()

    def _watch(self, started: float) -> tuple[str, str, int | None]:
        """Wait for the job's end; the terminal state, its reason, and the exit code it is known by."""
        max_runtime = self.request.get("max_runtime_s")
        preempt_after = self.request.get("preempt_after_s")
        while True:
            codes = [p.poll() for p in self.procs]
            failed = next(((rank, c) for rank, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                rank, code = failed
                assert code is not None
                return common.FAILED, _describe_exit(rank, code), _exit_code(code)
            if all(c == 0 for c in codes):
                return common.SUCCEEDED, "", 0
            cancel = self.cancel_reason()
            if cancel is not None:
                return common.CANCELLED, cancel, None
            elapsed = time.time() - started
            if max_runtime is not None and elapsed >= float(max_runtime):
                return common.FAILED, f"exceeded max_runtime of {float(max_runtime):g}s", None
            if preempt_after is not None and elapsed >= float(preempt_after):
                return (
                    common.PREEMPTED,
                    f"simulated spot interruption {float(preempt_after):.1f}s after start "
                    "(LocalBackend simulate_preemptions)",
                    None,
                )
            time.sleep(_TICK_S)

    def _stop_nodes(self, grace: float) -> None:
        """SIGTERM every node's process group, wait up to ``grace`` seconds, then SIGKILL the groups.

        The final SIGKILL goes to every group, also of nodes that already exited, so no child the
        command left behind outlives the job.
        """
        records = [{"pid": p.pid, "pid_start": None} for p in self.procs]
        if grace > 0:
            common.kill_groups(records, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(_TICK_S)
        common.kill_groups(records, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.note(f"node process {proc.pid} did not exit after SIGKILL")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} <job_dir>", file=sys.stderr)
        return 2
    supervisor = Supervisor(Path(argv[1]))
    signal.signal(signal.SIGTERM, supervisor.on_sigterm)
    signal.signal(signal.SIGINT, supervisor.on_sigterm)
    # SIGHUP is left alone: the supervisor leads a new session without a terminal, so none comes from
    # the worker, and an ignored signal would be inherited by the node processes.
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
