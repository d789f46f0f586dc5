"""The per-job supervisor of the local backend: ``python -m gpu_provider.backends.local.supervisor <job_dir>``.

``LocalBackend.submit`` starts one supervisor per job in a new session, so the job outlives the
Airflow worker that submitted it. The supervisor waits for GPUs, starts one process per node (each
in its own session and process group, so the command's children can be stopped with it; as
``run_as_user`` when the request names one), copies their output into ``job.log``, enforces the max
runtime and simulated spot interruptions, and records every state change in ``status.json``.
SIGTERM (sent by ``LocalBackend.cancel``) stops the job as cancelled. The on-disk layout is
described in :mod:`gpu_provider.backends.local.common`.

The job's environment values arrive on stdin (one JSON object, read before anything else) and
stay in this process's memory: they are never written to disk.

Output is copied as bytes in bounded pieces, never line by line: a job that prints one endless line
costs the supervisor at most a few hundred KiB, and every byte it wrote lands in ``job.log``. If
``job.log`` or ``status.json`` cannot be written (disk full), the job is stopped and ends
``FAILED`` with that reason: the supervisor never reports success for a job whose log or state it
lost. When even the final state cannot be written, the reason goes into ``fatal.json``, written in
place (it was preallocated at submit), where ``LocalBackend.poll`` finds it.

Standard library only, and no Airflow: it starts fast and stays small.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from gpu_provider.backends.local import common
from gpu_provider.backends.local.gpus import Allocation, allocate, format_devices, never_fits, release

# gpu_provider.runtime (fault_in_line, end_of_log_line) is imported where it is used, after the nodes have
# started: its package imports the checkpoint code, which would otherwise delay every job's start

#: how often the supervisor looks at its node processes (and at cancel requests)
_TICK_S = 0.05
#: how often a job waiting for GPUs retries the allocation
_GPU_RETRY_S = 0.5
#: how long to wait for the log pumps after the nodes are gone (a detached grandchild may hold a pipe)
_PUMP_JOIN_S = 2.0
#: bytes read from a node's pipe at a time
_READ_BYTES = 64 * 1024
#: bytes of a line without newline held back (to keep lines of concurrent nodes apart) before they are written
_HOLD_BYTES = 64 * 1024
#: the most bytes of environment accepted on stdin
_MAX_SECRETS_BYTES = 64 * 1024 * 1024


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


class LogSink:
    """``job.log``, written by several node pumps and the supervisor itself.

    Each node's bytes are written as they come, with ``[node <rank>] `` at the start of every line.
    A line still open (no newline yet) when another node writes is ended with a newline first, and
    continues later on a new prefixed line: the file stays readable line by line, and no byte is
    lost. The first write error is kept (:attr:`error`); later writes are dropped.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._lock = threading.Lock()
        self._open: bytes | None = None  # the prefix of the line left open at the end of the file
        self.error: OSError | None = None

    def write(self, prefix: bytes, data: bytes) -> None:
        """Write ``data`` (any bytes, maybe part of a line) as the output of the source ``prefix``."""
        if not data:
            return
        body, tail = (data[:-1], b"\n") if data.endswith(b"\n") else (data, b"")
        with self._lock:
            if self.error is not None:
                return
            out = bytearray()
            if self._open is not None and self._open != prefix:
                out += b"\n"
                self._open = None
            if self._open is None:
                out += prefix
            out += body.replace(b"\n", b"\n" + prefix)
            out += tail
            try:
                common._write_all(self._fd, bytes(out))
            except OSError as err:
                self.error = err
                return
            self._open = None if tail else prefix

    def close(self) -> None:
        with self._lock:
            if self._open is not None and self.error is None:
                with contextlib.suppress(OSError):
                    os.write(self._fd, b"\n")
            self._open = None
        os.close(self._fd)


class StateWriteError(Exception):
    """status.json could not be written: the job's state would be lost, so the job is stopped."""


class Supervisor:
    """Runs one job described by ``<job_dir>/request.json`` to a terminal state.

    :param job_dir: the job's directory, created by ``LocalBackend.submit``
    :param secrets: ``{"env": ..., "base_env": ...}`` received on stdin: the job's environment values
    """

    def __init__(self, job_dir: Path, secrets: dict[str, Any], *, pid_start: int | None = None) -> None:
        self.job_dir = job_dir
        request = common.read_json(job_dir / common.REQUEST_FILE)
        if request is None:
            raise RuntimeError(f"{job_dir / common.REQUEST_FILE} is missing or not valid JSON")
        self.request: dict[str, Any] = request
        self.env: dict[str, str] = {str(k): str(v) for k, v in (secrets.get("env") or {}).items()}
        self.base_env: dict[str, str] = {str(k): str(v) for k, v in (secrets.get("base_env") or {}).items()}
        self.job_id = str(request["job_id"])
        self.state_dir = Path(request["state_dir"])
        self.pid = os.getpid()
        self.pid_start = pid_start or common.process_start_time(self.pid)
        self.status: dict[str, Any] = common.read_json(job_dir / common.STATUS_FILE) or {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pumps: list[threading.Thread] = []
        self.allocated = False
        self.sigterm = False
        #: the first GPU hardware fault a node's output reported: (rank, kind)
        self.fault: tuple[int, str] | None = None
        self.log = LogSink(job_dir / common.LOG_FILE)

    # --- bookkeeping ---------------------------------------------------------------------------

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: only set a flag; the main loop turns it into a cancel."""
        self.sigterm = True

    def set_state(self, state: str, reason: str = "", **fields: Any) -> None:
        if state in common.TERMINAL_STATES and self.allocated:
            # GPUs go back before the final state is visible: whoever sees the end may reuse them at once.
            # If the ledger cannot be written, the entry goes once this process is gone (allocate drops it).
            with contextlib.suppress(OSError):
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
        path = self.job_dir / common.STATUS_FILE
        try:
            common.write_json_atomic(path, self.status)
        except OSError as err:
            raise StateWriteError(f"could not record the job's state ({state}) in {path}: {err}") from err

    def note(self, message: str) -> None:
        """A line of the supervisor's own in the job log (what happened to the job, and why)."""
        self.log.write(b"[local] ", message.encode() + b"\n")

    def cancel_reason(self) -> str | None:
        """Why the job is to be cancelled, or ``None``. cancel.json is checked too, not only the
        signal: a SIGTERM that arrived before the handler was installed would otherwise be lost."""
        info = common.read_json(self.job_dir / common.CANCEL_FILE)
        if info is not None:
            return str(info.get("reason") or "cancelled")
        if self.sigterm:
            return "local supervisor received SIGTERM"
        return None

    def log_failure(self) -> str | None:
        """Why the job's log can no longer be trusted (a write to ``job.log`` failed), or ``None``."""
        if self.log.error is None:
            return None
        return f"could not write the job's log {self.job_dir / common.LOG_FILE}: {self.log.error}"

    # --- the job -------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._run()
            return 0
        except BaseException as err:
            error = str(err) if isinstance(err, StateWriteError) else f"{type(err).__name__}: {err}"
            # a lost log is usually the first thing a full disk breaks: name it first
            reason = "; ".join(r for r in (self.log_failure(), f"local supervisor error: {error}") if r)
            # fatal.json first: it needs no disk space, while status.json (and stderr) may not be writable
            with contextlib.suppress(OSError):
                common.overwrite_in_place(self.job_dir / common.FATAL_FILE, {"reason": reason, "at": time.time()})
            self._stop_nodes(grace=0.0)
            with contextlib.suppress(Exception):
                self.set_state(common.FAILED, reason, ended_at=time.time())
            with contextlib.suppress(Exception):
                traceback.print_exc()
                sys.stderr.flush()
            return 1
        finally:
            if self.allocated:
                with contextlib.suppress(OSError):
                    release(self.state_dir, self.job_id)
            common.remove_work_dir(self.request.get("work_dir"))
            self.log.close()

    def _run(self) -> None:
        req = self.request
        resources = req["resources"]
        gpus, nodes = float(resources["gpus"]), int(resources["nodes"])
        devices = [int(d) for d in req.get("gpu_devices") or []]
        # status.json says QUEUED since the submit; the next write is the first one with news in it (waiting for
        # GPUs, or the nodes started): a launch writes nothing before the job's processes start
        self.status.setdefault("queued_since", req.get("submitted_at"))

        per_node = self._wait_for_gpus(devices, gpus, nodes)
        if per_node is None:
            return
        cancel = self.cancel_reason()
        if cancel is not None:
            self.set_state(common.CANCELLED, cancel, ended_at=time.time())
            return

        port = _free_port()
        self.status.update(master_port=port, gpu_devices=[list(d) for d in per_node])
        node_records: list[dict[str, Any]] = []
        for rank in range(nodes):
            try:
                proc = self._spawn(rank, nodes, port, per_node[rank])
            except OSError as err:
                self._start_pumps()  # what the nodes started before it printed
                self._stop_nodes(grace=0.0)
                self.note(f"could not start node {rank}: {err}")
                self.set_state(
                    common.FAILED, f"could not start node {rank}: {err}", exit_code=127, ended_at=time.time()
                )
                return
            node_records.append({"rank": rank, "pid": proc.pid, "pid_start": common.process_start_time(proc.pid)})
            # recorded at once: if this supervisor dies now, poll() still finds the processes to kill (the last
            # node's record is the RUNNING write below)
            if rank < nodes - 1:
                self.set_state(common.STARTING, nodes=node_records)
        started = time.time()
        self.set_state(common.RUNNING, started_at=started, nodes=node_records)
        self.note(f"{nodes} node(s) started, pids {', '.join(str(p.pid) for p in self.procs)}, MASTER_PORT={port}")
        self._start_pumps()  # after that line: a job that prints and ends at once cannot put its output before it

        state, reason, exit_code = self._watch(started)
        if state != common.SUCCEEDED:
            self._drain_ended()  # an ended node's last lines come before the supervisor's words about its end
            self.set_state(common.STOPPING, reason)
            self.note(f"stopping: {reason}; SIGTERM to every node, SIGKILL after {self.grace:g}s")
        self._stop_nodes(grace=self.grace if state != common.SUCCEEDED else 0.0)
        for pump in self.pumps:
            pump.join(_PUMP_JOIN_S)
        self._mark_ends(nodes)
        try:
            self.collect_output()
        except OSError as err:
            if state == common.SUCCEEDED:
                state, reason = common.FAILED, f"could not record the job's output URI: {err}"
        lost = self.log_failure()
        if lost is not None and state == common.SUCCEEDED:
            # the job's own work may be fine, but part of what it printed is gone: say so, never SUCCEEDED
            state, reason = common.FAILED, lost
        codes = [_exit_code(p.returncode) if p.returncode is not None else None for p in self.procs]
        for record, code in zip(node_records, codes, strict=True):
            record["exit_code"] = code
        if exit_code is None:
            exit_code = next((c for c in codes if c), None)
        fault: dict[str, Any] = {}
        if state == common.FAILED and self.fault is not None:
            # a GPU hardware fault in a node's output: the node's failure, not the job's (names.NODE_FAULT)
            fault = {"fault": self.fault[1], "fault_node": self.fault[0]}
            reason = f"{reason}; node {self.fault[0]} reported a GPU hardware fault ({self.fault[1]})"
        self.note(f"job ended {state.upper()}" + (f": {reason}" if reason else ""))
        self.set_state(
            state, reason, exit_code=exit_code, exit_codes=codes, nodes=node_records, ended_at=time.time(), **fault
        )

    def _mark_ends(self, nodes: int) -> None:
        """Each node's end-of-log marker, after all its output: the task stops reading the log at once."""
        from gpu_provider.runtime.output import end_of_log_line

        for rank, proc in enumerate(self.procs):
            if proc.returncode is not None:
                line = end_of_log_line(rank, nodes, _exit_code(proc.returncode))
                self.log.write(b"[local] ", line.encode() + b"\n")  # the supervisor's line: it names the node

    @property
    def output_file(self) -> Path:
        """Where the job writes its output URI: the job's folder, or with ``run_as_user`` its work folder."""
        work_dir = self.request.get("work_dir")
        return Path(work_dir) / common.OUTPUT_FILE if work_dir else self.job_dir / common.OUTPUT_FILE

    def collect_output(self) -> None:
        """Copy the output URI a ``run_as_user`` job wrote in its work folder into the job's folder, and
        remove the work folder. Only a regular file of the job's user is read (no link it planted)."""
        work_dir = self.request.get("work_dir")
        run_as = self.request.get("run_as") or {}
        if not work_dir:
            return
        text = common.read_small_text(self.output_file, owner=int(run_as["uid"]) if run_as else None)
        if text and text.strip():
            common.write_text_atomic(self.job_dir / common.OUTPUT_FILE, text.strip())
        common.remove_work_dir(work_dir)

    @property
    def grace(self) -> float:
        return float(self.request.get("grace_period", 10.0))

    def _wait_for_gpus(self, devices: list[int], gpus: float, nodes: int) -> tuple[tuple[int, ...], ...] | None:
        """Block until the job holds its GPUs; ``None`` when it ended instead (cancelled, never fits)."""
        model = self.request.get("gpu_model")
        if model is not None:
            # instance fallback: ``devices`` are this machine's GPUs of the chosen model; too few of them is
            # capacity that does not come (the attempt waits, and its capacity wait gives the type up)
            missing = never_fits(devices, gpus, nodes) if devices else f"this machine has no {model} GPU"
            if missing:
                reason = f"waiting for GPUs: {model} for instance type {self.request.get('instance_type')}: {missing}"
                self.set_state(common.WAITING_FOR_GPUS, reason)
                while self.cancel_reason() is None:
                    time.sleep(_TICK_S)
                self.set_state(common.CANCELLED, self.cancel_reason() or "", ended_at=time.time())
                return None
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
        run_as: dict[str, Any] = req.get("run_as") or {}
        # the worker's allow-listed environment, then the job's env, then the per-node contract we own
        env: dict[str, str] = dict(self.base_env)
        if run_as:
            env.update(HOME=str(run_as["home"]), USER=str(run_as["user"]), LOGNAME=str(run_as["user"]))
        env.update(self.env)
        env.update(
            NNODES=str(nodes),
            NODE_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            CUDA_VISIBLE_DEVICES=format_devices(devices),
            GPU_PROVIDER_OUTPUT_FILE=str(self.output_file),
            PYTHONUNBUFFERED="1",
        )
        identity: dict[str, Any] = {}
        if run_as:
            # like Airflow's impersonation: the user's uid, primary group and supplementary groups
            identity = {"user": int(run_as["uid"]), "group": int(run_as["gid"]), "extra_groups": list(run_as["groups"])}
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
            **identity,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        # started by _start_pumps once the supervisor has said the nodes started (the pipe holds the output)
        self.pumps.append(
            threading.Thread(target=self._pump, args=(rank, proc.stdout), name=f"pump-{rank}", daemon=True)
        )
        return proc

    def _start_pumps(self) -> None:
        """Start copying the output of every node started so far into the log (each pump once)."""
        for pump in self.pumps:
            if pump.ident is None:
                pump.start()

    def _drain_ended(self) -> None:
        """Wait (at most :data:`_PUMP_JOIN_S` in all) until every node that has exited has its output copied:
        its pipe ends with it, unless a process it left behind holds it open."""
        deadline = time.monotonic() + _PUMP_JOIN_S
        for proc, pump in zip(self.procs, self.pumps, strict=False):
            if proc.returncode is not None:
                pump.join(max(0.0, deadline - time.monotonic()))

    def _pump(self, rank: int, stream: Any) -> None:
        """Copy one node's output into the log in bounded pieces (at most about 128 KiB held)."""
        prefix = f"[node {rank}] ".encode()
        fd = stream.fileno()
        held = bytearray()
        try:
            while True:
                data = os.read(fd, _READ_BYTES)
                if not data:
                    break
                held += data
                end = held.rfind(b"\n")
                if end >= 0:
                    self.log.write(prefix, bytes(held[: end + 1]))  # first: the fault check imports on first use
                    self._look_for_faults(rank, held[: end + 1])
                    del held[: end + 1]
                if len(held) >= _HOLD_BYTES:  # a long line: write what is there, the line stays open
                    self.log.write(prefix, bytes(held))
                    held.clear()
            if held:
                self.log.write(prefix, bytes(held) + b"\n")
        except OSError as err:
            self.note(f"reading the output of node {rank} failed: {err}")
        finally:
            stream.close()

    def _look_for_faults(self, rank: int, lines: bytes | bytearray) -> None:
        """Remember the first GPU hardware fault a node's output reports (``gpu_provider.runtime.faults``)."""
        if self.fault is not None:
            return
        from gpu_provider.runtime.faults import fault_in_line

        kind = fault_in_line(bytes(lines).decode("utf-8", "replace"), nodes=int(self.request["resources"]["nodes"]))
        if kind is not None:
            self.fault = (rank, kind)

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
            lost = self.log_failure()
            if lost is not None:
                return common.FAILED, lost, None
            cancel = self.cancel_reason()
            if cancel is not None:
                return common.CANCELLED, cancel, None
            preempt = common.read_json(self.job_dir / common.PREEMPT_FILE)
            if preempt is not None:
                return common.PREEMPTED, str(preempt.get("reason") or "simulated spot interruption"), None
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


def read_secrets() -> dict[str, Any]:
    """The job's environment values, sent by ``LocalBackend.submit`` as one JSON object on stdin.

    stdin is then pointed at ``/dev/null``: nothing the supervisor starts can read the pipe.
    """
    raw = sys.stdin.buffer.read(_MAX_SECRETS_BYTES + 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if len(raw) > _MAX_SECRETS_BYTES:
        raise RuntimeError(f"the job's environment on stdin is larger than {_MAX_SECRETS_BYTES} bytes")
    data = json.loads(raw or b"{}")
    if not isinstance(data, dict):
        raise RuntimeError("the job's environment on stdin is not a JSON object")
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} <job_dir>", file=sys.stderr)
        return 2
    return run_job(Path(argv[1]), read_secrets)


def run_job(job_dir: Path, secrets: Callable[[], dict[str, Any]], *, pid_start: int | None = None) -> int:
    """Supervise the job of ``job_dir`` to its end; ``secrets()`` gives the job's environment values.

    What the spawned supervisor (``main``) and one forked by the fork server both run (``pid_start``: this
    process's start time, when read already).
    """
    try:
        supervisor = Supervisor(job_dir, secrets(), pid_start=pid_start)
    except Exception as err:
        reason = f"local supervisor error: could not start: {type(err).__name__}: {err}"
        with contextlib.suppress(OSError):
            common.overwrite_in_place(job_dir / common.FATAL_FILE, {"reason": reason, "at": time.time()})
        with contextlib.suppress(Exception):
            print(reason, file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGTERM, supervisor.on_sigterm)
    signal.signal(signal.SIGINT, supervisor.on_sigterm)
    # SIGHUP is left alone: the supervisor leads a new session without a terminal, so none comes from
    # the worker, and an ignored signal would be inherited by the node processes.
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
