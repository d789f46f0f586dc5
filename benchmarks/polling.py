"""Figure 2, polling at scale: N tasks waiting in one triggerer, ours vs the anchor operators' triggers.

For each backend (AWS Batch, SageMaker, Kubernetes), this script starts the emulator in its own
process (``gpu_provider/testing/emulators/``: moto server for AWS, the fake API server for Kubernetes), submits N jobs
that stay waiting (Batch queue held at RUNNABLE, SageMaker capacity held, Kubernetes spot nodes
short: pods ``Pending``), and then runs, one after the other (ours first, then the anchor, for each
N), a triggerer process in which N triggers watch those same N jobs in one asyncio event loop, as
Airflow's triggerer runs them:

- **ours**: N ``GpuJobTrigger`` (what ``GpuJobOperator(deferrable=True)`` defers to), sharing one
  poller per backend;
- **anchor**: N ``BatchJobTrigger`` (``BatchOperator(deferrable=True)``), N ``SageMakerTrigger``
  (``SageMakerTrainingOperator(deferrable=True)``), or N ``KubernetesPodTrigger``
  (``KubernetesPodOperator(deferrable=True)``; its defaults, except ``startup_check_interval`` =
  the poll interval and start/schedule timeouts long enough not to fire).

The sides run one after the other, not at once: watching at the same time (tried on 2026-12-04, each
side's requests told apart at the emulator by its access key), the 1,000-job anchor's flood saturated the
shared Batch emulator and starved ours' requests (ours 4 calls/min, 2 answered, against 60 alone), a
figure that would flatter ours.

The triggers run in a plain process with ``asyncio`` (``trigger.run()`` of each, gathered), not under
``airflow triggerer``: the same event loop work without the triggerer's database round trips. The
amazon triggers need aiobotocore, which cannot install next to the project's pinned botocore 1.44:
their process runs with ``benchmarks/_anchor_env.py``'s overlay (aiobotocore 3.10.0 with the botocore
and boto3 1.43.117 it accepts, installed from PyPI under /tmp at bench time, first on ``PYTHONPATH``);
everything else comes from the same virtualenv.

After a warm-up (every job asked about once, or two ticks of ours; cut at ``--warmup-max``), it
measures for a window: API calls per minute counted at the emulator and at the triggerer's clients, the
triggerer's CPU seconds per minute, and its peak RSS. Both sides use the same poll interval.

API calls are counted twice: at the emulator (every request it received from the triggerer process)
and at the triggerer's own clients (every HTTP request its botocore / aiobotocore / kubernetes /
kubernetes_asyncio clients sent, retries included, read at both ends of the window): when the
emulator cannot keep up, the first is what it served, the second what the triggerer sent.

Usage: ``python benchmarks/polling.py [--quick] [--backends batch sagemaker kubernetes] [--jobs 100 1000]
[--interval S] [--window S] [--warmup-max S]`` (``make bench`` runs ``--quick``: 100 jobs, 2 s interval,
8 s window). The full mode (100 and 1,000 jobs on every backend, 10 s interval, 30 s window) runs the
backends one after another; each backend's part is sized for under 10 minutes on 2 cores
(``--backends X`` runs one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._anchor_env import anchor_pythonpath, aws_env, kubernetes_env, kubernetes_pod_trigger  # noqa: E402

ANCHORS = {
    "batch": "BatchJobTrigger",
    "sagemaker": "SageMakerTrigger",
    "kubernetes": "KubernetesPodTrigger",
}


# ------------------------------------------------------------------------------------------ the triggerer


def _ours(backend: dict[str, Any], handles: list[dict[str, Any]], interval: float) -> list[Any]:
    from gpu_provider.triggers.gpu_job import GpuJobTrigger

    return [GpuJobTrigger(backend=backend, handle=h, poll_interval=interval, stream_logs=False) for h in handles]


def _anchor(kind: str, handles: list[dict[str, Any]], interval: float) -> list[Any]:
    if kind == "batch":
        from airflow.providers.amazon.aws.triggers.batch import BatchJobTrigger

        return [
            BatchJobTrigger(job_id=h["job_id"], waiter_delay=int(interval), waiter_max_attempts=10**6) for h in handles
        ]
    if kind == "sagemaker":
        from airflow.providers.amazon.aws.triggers.sagemaker import SageMakerTrigger

        return [
            SageMakerTrigger(
                job_name=h["job_id"], job_type="training", waiter_delay=int(interval), waiter_max_attempts=10**6
            )
            for h in handles
        ]
    return [kubernetes_pod_trigger(h["name"], h["extra"].get("namespace", "default"), interval) for h in handles]


_CLIENT = {"sent": 0, "answered": 0}
_CLIENT_LOCK = threading.Lock()


def _bump(what: str) -> None:
    with _CLIENT_LOCK:
        _CLIENT[what] += 1


def count_at_client(kind: str, side: str) -> None:
    """Count every HTTP request this process's API clients send (retries included) and get an answer to.

    Wraps the one method each client library sends a request through: botocore's and aiobotocore's
    ``Endpoint._send`` (ours, the amazon triggers), the ``kubernetes`` and ``kubernetes_asyncio``
    REST clients' ``request`` (ours, ``KubernetesPodTrigger``; a watch counts once, when it opens). Only the
    libraries the side imports anyway are wrapped (no extra modules in its RSS).
    ``SIGUSR1`` prints ``client-calls SEQ SENT ANSWERED``: the parent reads it at both ends of its window.
    """
    import importlib

    def wrap_sync(cls: Any, name: str) -> None:
        original = getattr(cls, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            _bump("sent")
            try:
                return original(*args, **kwargs)
            finally:
                _bump("answered")

        setattr(cls, name, counted)

    def wrap_async(cls: Any, name: str) -> None:
        original = getattr(cls, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            _bump("sent")
            try:
                return await original(*args, **kwargs)
            finally:
                _bump("answered")

        setattr(cls, name, counted)

    sync, asynchronous = (
        (("botocore.endpoint", "Endpoint", "_send"), ("aiobotocore.endpoint", "AioEndpoint", "_send"))
        if kind in ("batch", "sagemaker")
        else (
            ("kubernetes.client.rest", "RESTClientObject", "request"),
            ("kubernetes_asyncio.client.rest", "RESTClientObject", "request"),
        )
    )
    wrap_sync(getattr(importlib.import_module(sync[0]), sync[1]), sync[2])  # ours, and what the anchors build on
    if side == "anchor":
        wrap_async(getattr(importlib.import_module(asynchronous[0]), asynchronous[1]), asynchronous[2])

    seq = [0]

    def report(signum: int, frame: Any) -> None:
        seq[0] += 1
        with _CLIENT_LOCK:
            sent, answered = _CLIENT["sent"], _CLIENT["answered"]
        print(f"client-calls {seq[0]} {sent} {answered}", flush=True)

    signal.signal(signal.SIGUSR1, report)


def triggerer(args: argparse.Namespace) -> int:
    """The child: N triggers in one event loop until killed; prints each event that fires (none should)."""
    count_at_client(args.kind, args.side)
    spec = json.loads(Path(args.child_input).read_text())
    make = _ours if args.side == "ours" else None
    triggers = (
        make(spec["backend"], spec["handles"], args.interval)
        if make
        else _anchor(args.kind, spec["handles"], args.interval)
    )

    async def watch(trigger: Any) -> None:
        async for event in trigger.run():
            print("event:", json.dumps(event.payload, default=str)[:3000], flush=True)
            return

    async def run_all() -> None:
        await asyncio.gather(*(watch(t) for t in triggers))

    print("ready", flush=True)
    asyncio.run(run_all())
    return 0


# ------------------------------------------------------------------------------------------ the emulators


@dataclass
class World:
    kind: str
    env: dict[str, str]  # the triggerer's connection environment
    backend: Any  # ours
    requests: Callable[[], list[dict[str, Any]]]
    ids_in: Callable[[dict[str, Any]], list[str]]  # the job ids a request names
    submit: Callable[[int], dict[str, Any]]  # the i-th waiting job's handle


def _identity(i: int) -> Any:
    from gpu_provider.backends.base import JobIdentity, TaskKey

    return JobIdentity(TaskKey("bench", f"t{i}", "run"), try_number=1, attempt=1, capacity="spot")


@contextmanager
def world(kind: str, root: Path) -> Iterator[World]:
    from gpu_provider.backends.base import JobRequest
    from gpu_provider.job import GpuResources

    if kind == "batch":
        from gpu_provider.testing.emulators.aws_batch import BatchEmulator

        with BatchEmulator(job_cwd=REPO) as emulator:
            setup = emulator.create_environment(fair_share=False)
            env = aws_env(emulator.endpoint_url, emulator.region)
            os.environ.update(env)
            from gpu_provider.backends.batch import BatchBackend

            backend = BatchBackend(spot_queue=setup.spot_queue, on_demand_queue=setup.on_demand_queue)
            emulator.hold(setup.spot_queue)

            def submit(i: int) -> dict[str, Any]:
                request = JobRequest(_identity(i), ("true",), {}, GpuResources(), "spot", image="x")
                return backend.submit(request).to_dict()  # type: ignore[no-any-return]

            yield World(
                kind,
                env,
                backend,
                emulator.requests,
                lambda r: list(r["body"].get("jobs") or []) if r["action"] == "DescribeJobs" else [],
                submit,
            )
            emulator.release(setup.spot_queue)
    elif kind == "sagemaker":
        from gpu_provider.testing.emulators.aws_sagemaker import ROLE_ARN, SageMakerEmulator

        with SageMakerEmulator(job_root=root, job_cwd=REPO) as emulator:
            env = aws_env(emulator.endpoint_url, emulator.region)
            os.environ.update(env)
            from gpu_provider.backends.sagemaker import SageMakerBackend

            backend = SageMakerBackend(role_arn=ROLE_ARN, output_path="s3://bench-models/out")
            emulator.hold("spot")

            def submit(i: int) -> dict[str, Any]:
                request = JobRequest(
                    _identity(i), ("true",), {}, GpuResources(), "spot", image="x", capacity_wait_s=3600
                )
                return backend.submit(request).to_dict()  # type: ignore[no-any-return]

            def named(r: dict[str, Any]) -> list[str]:
                name = r["body"].get("TrainingJobName") if isinstance(r["body"], dict) else None
                return [name] if r["action"] == "DescribeTrainingJob" and name else []

            yield World(kind, env, backend, emulator.requests, named, submit)
            emulator.stop_all("benchmark done")
    else:
        from gpu_provider.testing.emulators.kubernetes import KubernetesEmulator

        with KubernetesEmulator(job_cwd=REPO) as emulator:
            env = kubernetes_env(emulator.kubeconfig(root / "kubeconfig"))
            os.environ.update(env)
            from gpu_provider.backends.kubernetes import KubernetesBackend

            backend = KubernetesBackend()
            emulator.set_shortage("spot")

            def submit(i: int) -> dict[str, Any]:
                request = JobRequest(_identity(i), ("true",), {}, GpuResources(), "spot", image="x")
                return backend.submit(request).to_dict()  # type: ignore[no-any-return]

            def named(r: dict[str, Any]) -> list[str]:
                if r["action"] != "get pods":
                    return []
                return [str(r["body"]["path"]).rstrip("/").rsplit("/", 1)[-1]]

            yield World(kind, env, backend, emulator.requests, named, submit)
            emulator.reset()


# ------------------------------------------------------------------------------------------ measuring


@dataclass
class Result:
    calls_per_min: float  # counted at the emulator
    client_sent_per_min: float  # counted at the triggerer's clients
    client_answered_per_min: float
    cpu_s_per_min: float
    peak_rss_mb: float
    warmup_s: float
    actions: dict[str, int]
    events: int


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _client_calls(proc: subprocess.Popen[bytes], out: Path, seq: int) -> tuple[int, int]:
    """Ask the triggerer for its client-side counts (``SIGUSR1``) and read its answer from its log."""
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "client-calls" and parts[1] == str(seq):
                return int(parts[2]), int(parts[3])
        time.sleep(0.05)
    raise RuntimeError(f"the triggerer did not report its client-side count {seq}: {out.read_text()[-2000:]}")


def measure_side(
    w: World, side: str, handles: list[dict[str, Any]], interval: float, window: float, warmup_max: float, root: Path
) -> Result:
    """Start a triggerer for ``side`` on ``handles``; after its warm-up, count one window."""
    spec_file = root / f"{w.kind}-{side}-{len(handles)}.json"
    spec_file.write_text(json.dumps({"backend": w.backend.spec(), "handles": handles}))
    env = dict(os.environ, **w.env)
    path = [str(REPO)]
    if side == "anchor" and w.kind in ("batch", "sagemaker"):
        path.insert(0, anchor_pythonpath())
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"
    out = root / f"{w.kind}-{side}-{len(handles)}.log"
    cmd = [sys.executable, __file__, "--child", w.kind, "--side", side, "--interval", str(interval)]
    cmd += ["--child-input", str(spec_file)]
    before = len(w.requests())
    started = time.monotonic()
    with out.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wanted = {h["job_id"] if w.kind != "kubernetes" else h["name"] for h in handles}
        deadline = started + warmup_max
        while True:  # warm-up: every job asked about once (ours: two ticks after that)
            time.sleep(min(0.5, interval / 4))
            if proc.poll() is not None:
                raise RuntimeError(f"{side} triggerer exited {proc.returncode}: {out.read_text()[-3000:]}")
            new = w.requests()[before:]
            seen = {i for r in new for i in w.ids_in(r)}
            ticks_ok = side == "anchor" or len(new) >= 2
            if (wanted <= seen or (side == "ours" and w.kind == "kubernetes" and len(new) >= 2)) and ticks_ok:
                break
            if time.monotonic() > deadline:  # measure what it does anyway, and say so
                print(f"  warm-up cut: the {side} triggerer asked about {len(seen)} of {len(handles)} jobs", flush=True)
                break
        warmup = time.monotonic() - started
        time.sleep(interval)
        mark = len(w.requests())
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        sent0, answered0 = _client_calls(proc, out, 1)
        time.sleep(window)
        sent1, answered1 = _client_calls(proc, out, 2)
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        window_requests = w.requests()[mark:]
        rss = _peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    actions: dict[str, int] = {}
    for r in window_requests:
        actions[r["action"]] = actions.get(r["action"], 0) + 1
    fired = [line for line in out.read_text().splitlines() if line.startswith("event:")]
    events = len(fired)
    if fired:  # none should fire: say what the first one was
        print(f"  {w.kind} {len(handles)} {side}: {events} triggers fired, the first: {fired[0][:3000]}", flush=True)
    minutes = (t1 - t0) / 60
    return Result(
        len(window_requests) / minutes,
        (sent1 - sent0) / minutes,
        (answered1 - answered0) / minutes,
        (cpu1 - cpu0) / minutes,
        rss,
        warmup,
        actions,
        events,
    )


def _ratio(a: float, o: float) -> str:
    return f"{a / o:.0f}x" if o else "inf"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", nargs="+", default=["batch", "sagemaker", "kubernetes"])
    parser.add_argument("--jobs", type=int, nargs="+", default=None)
    parser.add_argument("--interval", type=float, default=None, help="poll interval of both sides (s)")
    parser.add_argument("--window", type=float, default=None, help="measured window per side (s)")
    parser.add_argument(
        "--warmup-max", type=float, default=None, help="cut a warm-up after this (s; default 150, --quick 60)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--side", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--child-input", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.kind = args.child
        return triggerer(args)
    for name in ("gpu_provider", "botocore"):  # each job's state changes and submission
        logging.getLogger(name).setLevel(logging.WARNING)
    jobs = args.jobs or ([100] if args.quick else [100, 1000])
    interval = args.interval or (2.0 if args.quick else 10.0)
    window = args.window or (8.0 if args.quick else 30.0)
    warmup_max = args.warmup_max or (60.0 if args.quick else 150.0)
    if "batch" in args.backends or "sagemaker" in args.backends:
        anchor_pythonpath()  # build the aiobotocore overlay before any timing
    rows = []
    took: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-poll-") as tmp:
        for kind in args.backends:
            t0 = time.monotonic()
            root = Path(tmp, kind)
            root.mkdir()
            with world(kind, root) as w:
                handles: list[dict[str, Any]] = []
                for n in sorted(jobs):
                    t1 = time.monotonic()
                    while len(handles) < n:
                        handles.append(w.submit(len(handles)))
                    print(f"  {kind}: {n} jobs waiting ({time.monotonic() - t1:.0f} s to submit)", flush=True)
                    for side in ("ours", "anchor"):
                        r = measure_side(w, side, handles[:n], interval, window, warmup_max, root)
                        rows.append((kind, n, side, r))
                        print(
                            f"  {kind} {n} {side}: {r.calls_per_min:.0f} calls/min at the emulator, "
                            f"{r.client_sent_per_min:.0f} sent and {r.client_answered_per_min:.0f} answered at its "
                            f"clients, {r.cpu_s_per_min:.2f} CPU s/min, {r.peak_rss_mb:.0f} MB peak RSS, warm-up "
                            f"{r.warmup_s:.0f} s, {r.actions}, {r.events} events",
                            flush=True,
                        )
            took[kind] = time.monotonic() - t0
            print(f"  {kind}: {took[kind]:.0f} s", flush=True)
    elapsed = time.monotonic() - started
    print(
        f"Figure 2, polling at scale: poll interval {interval:g} s on both sides, window {window:g} s per side, "
        f"{elapsed:.0f} s in all ({', '.join(f'{k} {v:.0f} s' for k, v in took.items())}), "
        f"Python {sys.version.split()[0]}"
    )
    print(
        "| backend | waiting | ours calls/min (emulator / client) | anchor calls/min (emulator / client) "
        "| anchor/ours (emulator / client) | ours CPU s/min | anchor CPU s/min | ours peak RSS MB "
        "| anchor peak RSS MB | anchor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    by = {(k, n, s): r for k, n, s, r in rows}
    for kind in args.backends:
        for n in sorted(jobs):
            o, a = by[(kind, n, "ours")], by[(kind, n, "anchor")]
            print(
                f"| {kind} | {n} | {o.calls_per_min:.0f} / {o.client_sent_per_min:.0f} | "
                f"{a.calls_per_min:.0f} / {a.client_sent_per_min:.0f} | "
                f"{_ratio(a.calls_per_min, o.calls_per_min)} / "
                f"{_ratio(a.client_sent_per_min, o.client_sent_per_min)} | "
                f"{o.cpu_s_per_min:.2f} | {a.cpu_s_per_min:.2f} | {o.peak_rss_mb:.0f} | {a.peak_rss_mb:.0f} | "
                f"{ANCHORS[kind]} |"
            )
    ideal = {n: n * 60 / interval for n in jobs}
    print(f"one call per job per interval would be: {', '.join(f'{v:.0f}/min at {n}' for n, v in ideal.items())}")
    if "batch" in args.backends and 1000 in jobs:
        o, a = by[("batch", 1000, "ours")], by[("batch", 1000, "anchor")]
        for where, ours, anchor in (
            ("the emulator", o.calls_per_min, a.calls_per_min),
            ("the clients (sent)", o.client_sent_per_min, a.client_sent_per_min),
        ):
            verdict = "met" if ours * 50 <= anchor else "missed"
            print(
                f"target: 1,000 Batch jobs at most 1/50 of the anchor's calls/min, counted at {where}: "
                f"1/{anchor / ours if ours else float('inf'):.0f} -> {verdict}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
