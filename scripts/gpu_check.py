"""One short check that needs a real NVIDIA GPU (run it on a machine that has one).

It needs only Python and this repository (no Airflow, no virtualenv):
``PYTHONPATH=. python3 scripts/gpu_check.py``. It checks that the local backend

1. detects the GPUs with ``nvidia-smi``;
2. gives two concurrent 1-GPU jobs disjoint ``CUDA_VISIBLE_DEVICES`` (when there are two GPUs or
   more; with one GPU the second job must wait until the first is done);
3. runs a PyTorch job really on CUDA (when ``torch`` is importable), as the job sees it.

It prints what it saw and exits non-zero if a check fails.
"""

from __future__ import annotations

import sys
import tempfile
import time

from gpu_provider.backends.base import JobHandle, JobIdentity, JobRequest, JobState, JobStatus, TaskKey
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.local.gpus import detect_gpus
from gpu_provider.job import GpuResources

PROBE = """
import os, time
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
time.sleep(2)
try:
    import torch
except ImportError:
    print("torch: not installed", flush=True)
else:
    ok = torch.cuda.is_available()
    print(f"torch {torch.__version__} cuda available: {ok}", flush=True)
    if ok:
        x = torch.randn(2048, 2048, device="cuda")
        y = (x @ x).sum().item()
        torch.cuda.synchronize()
        print(f"torch device: {torch.cuda.get_device_name(0)}; matmul checksum {y:.3f}", flush=True)
"""


def status_of(backend: LocalBackend, handle: JobHandle) -> JobStatus:
    entry = backend.poll([handle])[handle.job_id]
    if not isinstance(entry, JobStatus):
        raise SystemExit(f"cannot read the status of {handle.job_id}: {entry}")
    return entry


def log_lines(backend: LocalBackend, handle: JobHandle) -> list[str]:
    """The job's whole log, read in chunks until the backend says there is no more."""
    lines: list[str] = []
    cursor = None
    while True:
        chunk = backend.logs(handle, cursor)
        lines.extend(chunk.lines)
        cursor = chunk.cursor
        if not chunk.more:
            return lines


def main() -> int:
    devices, problem = detect_gpus("nvidia-smi")
    print(f"nvidia-smi devices: {devices} {problem or ''}")
    if not devices:
        return 1
    backend = LocalBackend(state_dir=tempfile.mkdtemp(prefix="gpu-check-"), grace_period=2)
    handles = []
    for i in range(2):
        identity = JobIdentity(TaskKey("gpu_check", f"probe{i}", "run"), try_number=1, attempt=1, capacity="on-demand")
        request = JobRequest(identity, (sys.executable, "-c", PROBE), {}, GpuResources(gpus=1), "on-demand")
        handles.append(backend.submit(request))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if all(status_of(backend, h).state.terminal for h in handles):
            break
        time.sleep(0.5)
    seen = []
    for handle in handles:
        status = status_of(backend, handle)
        print(f"{handle.job_id}: {status.state.value} {status.reason}")
        for line in log_lines(backend, handle):
            print("   ", line)
            if "CUDA_VISIBLE_DEVICES=" in line:
                seen.append(line.split("CUDA_VISIBLE_DEVICES=", 1)[1])
    failures = []
    if any(status_of(backend, h).state is not JobState.SUCCEEDED for h in handles):
        failures.append("a probe job did not succeed")
    if len(devices) >= 2 and len(set(seen)) != 2:
        failures.append(f"two 1-GPU jobs did not get disjoint devices: {seen}")
    print("FAILED: " + "; ".join(failures) if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
