"""GPU discovery and allocation for the local backend.

Every job supervisor of one state directory allocates from the same ledger
(``gpu-allocations.json``), read and written under an exclusive ``flock`` on
``gpu-allocations.lock``. Whole-GPU jobs get devices nobody else holds; fractional jobs share a
device while the shares on it add up to at most 1. A ledger entry whose supervisor no longer runs
is dropped by the next allocation, so a crashed supervisor cannot hold GPUs forever.

Standard library only (the supervisor imports it).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_provider.backends.local.common import ALLOC_FILE, ALLOC_LOCK_FILE, is_alive, read_json, write_json_atomic

#: slack for float sums of fractional shares (0.1 + 0.2 + 0.7 must fit on one device)
_EPS = 1e-9


def detect_gpus(nvidia_smi: str, *, timeout: float = 10.0) -> tuple[list[int], str | None]:
    """Ask ``nvidia-smi`` for the device indices of this machine.

    It runs with a minimal environment (``PATH`` and ``LC_ALL=C``), never the worker's: the
    worker's environment holds Airflow connections and cloud credentials.

    :param nvidia_smi: the binary (a name on PATH or a path)
    :param timeout: seconds before a hanging nvidia-smi counts as "no GPU"
    :return: the indices, and ``None`` or a short description of why none were found
    """
    proc, failed = _query(nvidia_smi, "index", timeout)
    if proc is None:
        return [], failed
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        return [], f"{nvidia_smi} exited with code {proc.returncode}" + (f": {detail[-1]}" if detail else "")
    indices: list[int] = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            indices.append(int(line))
        except ValueError:
            return [], f"{nvidia_smi} printed {line!r}, not a device index"
    if not indices:
        return [], f"{nvidia_smi} listed no devices"
    return sorted(set(indices)), None


#: how long one ``nvidia-smi`` reading serves the later launches of a state directory on this host (seconds)
DETECTION_MAX_AGE_S = 60.0


def detected_gpus(
    nvidia_smi: str, state_dir: Path, *, max_age_s: float = DETECTION_MAX_AGE_S
) -> tuple[list[int], str | None]:
    """:func:`detect_gpus`, its reading kept for ``max_age_s`` in ``<state_dir>/gpus-<host>.json`` (0600).

    ``nvidia-smi`` starts the NVIDIA management library on every call: on a GPU machine that is tens of ms
    (more without persistence mode), paid before each job's process could start. Every task process of
    the host reads the kept answer instead, while it is younger than ``max_age_s``, was read with the same
    binary (path, inode, size and mtime: a driver upgrade reads again) and on this host. A reading that
    old is what a job started that long ago used, and a device that fails meanwhile fails its job as it
    would fail a running one (a node fault). Kept: a reading that found devices, or that found no binary
    (installing one changes its identity). Not kept: a binary that failed (timed out, exited non-zero,
    printed no index), so one bad answer does not leave the host without GPUs for ``max_age_s``. When the
    file cannot be written, the next launch asks again.
    """
    binary = _binary_identity(nvidia_smi)
    host = socket.gethostname()
    path = state_dir / f"gpus-{host}.json"
    now = time.time()
    kept = read_json(path)
    if (
        kept is not None
        and kept.get("nvidia_smi") == nvidia_smi
        and kept.get("binary") == binary
        and kept.get("host") == host
        and isinstance(kept.get("at"), (int, float))
        and 0 <= now - kept["at"] < max_age_s
        and isinstance(kept.get("devices"), list)
    ):
        return [int(d) for d in kept["devices"]], kept.get("problem")
    devices, problem = detect_gpus(nvidia_smi)
    if problem is not None and binary is not None:
        return devices, problem  # a binary that failed (a timeout under load, a driver hiccup): asked again next time
    reading = {"nvidia_smi": nvidia_smi, "binary": binary, "host": host, "at": now, "devices": devices}
    with contextlib.suppress(OSError):
        write_json_atomic(path, {**reading, "problem": problem})
    return devices, problem


def _binary_identity(nvidia_smi: str) -> list[Any] | None:
    """The binary ``nvidia_smi`` names now (found on ``PATH`` as :func:`detect_gpus` runs it), as
    ``[path, inode, size, mtime_ns]``; ``None`` when there is none."""
    found = shutil.which(nvidia_smi, path=minimal_env().get("PATH"))
    if found is None:
        return None
    try:
        info = os.stat(found)
    except OSError:
        return None
    return [os.path.realpath(found), info.st_ino, info.st_size, info.st_mtime_ns]


#: the GPU models :func:`gpu_model` recognises in an ``nvidia-smi`` name (``resources.gpu_type`` spellings)
NVIDIA_MODELS = ("t4", "a10g", "l4", "l40s", "v100", "a100", "a100-80gb", "h100", "h200", "b200")


def gpu_model(name: str) -> str | None:
    """The model of an ``nvidia-smi`` name: ``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA L40S`` -> ``l40s``,
    ``NVIDIA A100-SXM4-80GB`` -> ``a100-80gb``, ``Tesla T4`` -> ``t4`` (a whole word of the name, so ``l4``
    never matches ``L40S``); ``None``: unknown."""
    words = "".join(c if c.isalnum() else " " for c in name.lower()).split()
    model = next((w for w in words if w in NVIDIA_MODELS), None)
    return "a100-80gb" if model == "a100" and "80gb" in words else model


def detect_gpu_models(nvidia_smi: str, *, timeout: float = 10.0) -> tuple[dict[int, str | None], str | None]:
    """Ask ``nvidia-smi`` for the model of each device (``--query-gpu=index,name``), with the minimal
    environment of :func:`detect_gpus`. Returns ``{index: model}`` and ``None`` or why none were found."""
    proc, failed = _query(nvidia_smi, "index,name", timeout)
    if proc is None:
        return {}, failed
    if proc.returncode != 0:
        return {}, f"{nvidia_smi} exited with code {proc.returncode}"
    models: dict[int, str | None] = {}
    for line in proc.stdout.splitlines():
        index, _, name = line.partition(",")
        try:
            models[int(index.strip())] = gpu_model(name)
        except ValueError:
            return {}, f"{nvidia_smi} printed {line.strip()!r}, not 'index, name'"
    return models, None if models else f"{nvidia_smi} listed no devices"


def _query(nvidia_smi: str, fields: str, timeout: float) -> tuple[subprocess.CompletedProcess[str] | None, str | None]:
    """Run ``nvidia-smi --query-gpu=<fields>`` (CSV, no header) with :func:`minimal_env`, never templated
    input; ``(None, why)`` when it cannot run or hangs past ``timeout``."""
    try:
        proc = subprocess.run(
            [nvidia_smi, f"--query-gpu={fields}", "--format=csv,noheader"],
            env=minimal_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{nvidia_smi}: {err}"
    return proc, None


def minimal_env() -> dict[str, str]:
    """The environment ``nvidia-smi`` runs with: ``PATH`` (to find it by name) and the C locale."""
    return {"PATH": os.environ.get("PATH") or os.defpath, "LC_ALL": "C"}


@dataclass(frozen=True)
class Allocation:
    """Devices granted to one job.

    :param per_node: device indices for each node rank (``CUDA_VISIBLE_DEVICES`` of that node)
    :param shares: the share of each device the job holds (1.0 for whole GPUs)
    """

    per_node: tuple[tuple[int, ...], ...]
    shares: dict[int, float]


def never_fits(devices: Sequence[int], gpus: float, nodes: int) -> str | None:
    """Why a request can never run on ``devices`` (``None`` when it can, once they are free)."""
    if not devices:
        return None  # CPU-only machine: GPU requests are not enforced (see LocalBackend docs)
    if gpus < 1:
        return None
    need = int(gpus) * nodes
    if need > len(devices):
        return (
            f"the job asks for {need} GPU(s) ({int(gpus)} per node x {nodes} node(s)) but this machine has "
            f"{len(devices)} (devices {','.join(map(str, devices))}); the local backend can never run it. "
            "Ask for fewer GPUs, or use a cloud backend."
        )
    return None


@contextlib.contextmanager
def _ledger(state_dir: Path) -> Iterator[dict[str, Any]]:
    """The allocations ledger, locked; changes made to the yielded dict are written back."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(state_dir / ALLOC_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        ledger = read_json(state_dir / ALLOC_FILE) or {}
        before = dict(ledger)
        yield ledger
        if ledger != before:
            write_json_atomic(state_dir / ALLOC_FILE, ledger)
    finally:
        os.close(fd)  # closing drops the flock


def _usage(ledger: dict[str, Any]) -> dict[int, float]:
    used: dict[int, float] = {}
    for entry in ledger.values():
        for dev, share in (entry.get("devices") or {}).items():
            used[int(dev)] = used.get(int(dev), 0.0) + float(share)
    return used


def allocate(
    state_dir: Path,
    job_id: str,
    *,
    owner_pid: int,
    owner_start: int | None,
    devices: Sequence[int],
    gpus: float,
    nodes: int,
) -> Allocation | str:
    """Try to take GPUs for a job now.

    :param state_dir: the backend's state directory (holds the ledger)
    :param job_id: the ledger key; a previous entry of the same job is replaced
    :param owner_pid: the supervisor's pid: the entry is dropped once this process is gone
    :param owner_start: the supervisor's start time token (guards against pid reuse)
    :param devices: device indices this machine has
    :param gpus: GPUs per node (a fraction below 1 for a shared device)
    :param nodes: number of nodes
    :return: the allocation, or a human reason why the job has to wait
    """
    with _ledger(state_dir) as ledger:
        for key in list(ledger):
            entry = ledger[key]
            if key == job_id or not is_alive(entry.get("pid"), entry.get("pid_start")):
                del ledger[key]
        used = _usage(ledger)
        free = [d for d in devices if used.get(d, 0.0) <= _EPS]
        busy = f"{len(devices) - len(free)} of {len(devices)} busy"
        if gpus >= 1:
            per_node_count = int(gpus)
            need = per_node_count * nodes
            if len(free) < need:
                return f"waiting for GPUs: {busy}, {need} needed"
            taken = free[:need]
            per_node = tuple(tuple(taken[r * per_node_count : (r + 1) * per_node_count]) for r in range(nodes))
            shares = {d: 1.0 for d in taken}
        else:
            fits = [d for d in devices if used.get(d, 0.0) + gpus <= 1.0 + _EPS]
            if not fits:
                return f"waiting for GPUs: {busy}, none has a {gpus:g} share left"
            # best fit: fill partly used devices first so whole devices stay free for whole-GPU jobs
            best = max(fits, key=lambda d: (used.get(d, 0.0), -d))
            per_node = ((best,),)
            shares = {best: float(gpus)}
        ledger[job_id] = {
            "pid": owner_pid,
            "pid_start": owner_start,
            "devices": {str(d): s for d, s in shares.items()},
        }
        return Allocation(per_node=per_node, shares=shares)


def release(state_dir: Path, job_id: str) -> None:
    """Give a job's GPUs back (no error when it holds none)."""
    with _ledger(state_dir) as ledger:
        ledger.pop(job_id, None)


def format_devices(devices: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` value for a device list (empty string: no GPU)."""
    return ",".join(str(d) for d in devices)


def gpu_seconds(gpus: float, nodes: int, seconds: float) -> float:
    """GPU-seconds held by ``nodes`` x ``gpus`` for ``seconds`` (never negative)."""
    return max(0.0, gpus * nodes * seconds) if math.isfinite(seconds) else 0.0
