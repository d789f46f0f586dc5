"""Figure 2, polling at scale: N tasks waiting in one triggerer, ours vs the anchor operators' triggers.

For each backend (AWS Batch, SageMaker, Kubernetes), this script starts the emulator in its own
process (``gpu_provider/testing/emulators/``: moto server for AWS, the fake API server for Kubernetes), submits N jobs
that stay waiting (Batch queue held at RUNNABLE, SageMaker capacity held, Kubernetes spot nodes
short: pods ``Pending``), and then runs triggerer processes in which N triggers watch the first N of
those jobs in one asyncio event loop, as Airflow's triggerer runs them:

- **ours**: N ``GpuJobTrigger`` (what ``GpuJobOperator(deferrable=True)`` defers to), sharing one
  poller per backend, with the event sources off (polling every interval);
- **ours, events on** (issue 29, ``docs/how-to/events.md``; at the largest N unless ``--events-jobs``
  says): the same triggers, the poller also listening to the service (Batch and SageMaker: the
  EventBridge rule of ``gpu-provider events render`` delivering state changes to an SQS queue the poller
  long-polls, ``WaitTimeSeconds`` 20; Kubernetes: one pod watch per namespace), its regular poll slowed to
  the backstop (``[gpu_provider] event_backstop_interval``, 60 s; ``--quick``: 4 intervals, with 4 s long
  polls). Its calls are the backstop polls plus the queue's long polls (or the watch's requests). The
  queue is purged before its group starts (the submissions' events are not what waiting costs: no
  waiting job changes, so no event comes). Its window is one backstop period (at least ``--window``),
  opening half a period after one of its polls: it holds exactly one backstop poll;
- **anchor**: N ``BatchJobTrigger`` (``BatchOperator(deferrable=True)``), N ``SageMakerTrigger``
  (``SageMakerTrainingOperator(deferrable=True)``), or N ``KubernetesPodTrigger``
  (``KubernetesPodOperator(deferrable=True)``; its defaults, except ``startup_check_interval`` =
  the poll interval and start/schedule timeouts long enough not to fire).

At each N (100, then 1,000: the service then holds exactly N waiting jobs, as ours' list calls would
see in production), **ours and the anchor watch at once**, each triggerer process with its own client
identity (its AWS access key id, its Kubernetes bearer token), which the emulator records with every
request, so each side's calls are counted apart; CPU and RSS are read per process. Watching at once is
fair only while the emulator keeps up with both: the script says so when a side's clients got fewer
answers than they sent requests in its window (for a CPU-bound triggerer, its own event loop is slow to
read its answers, too). (Before the emulators' held jobs stopped polling, on
2026-12-05, the shared Batch emulator could not keep up with the 1,000-job anchor and starved ours'
requests: ours 4 calls/min against 60 alone; the sides then ran one after the other.)

The triggers run in a plain process with ``asyncio`` (``trigger.run()`` of each, gathered), not under
``airflow triggerer``: the same event loop work without the triggerer's database round trips. The
amazon triggers need aiobotocore, which cannot install next to the project's pinned botocore 1.44:
their process runs with ``benchmarks/_anchor_env.py``'s overlay (aiobotocore 3.10.0 with the botocore
and boto3 1.43.117 it accepts, installed from PyPI under /tmp at bench time, first on ``PYTHONPATH``);
everything else comes from the same virtualenv.

Each triggerer first warms up, until every job has been asked about once (ours: and two requests), or
until the cut at ``--warmup-max`` (default 90 s; ``--quick`` 60 s), which says how many jobs it had asked
about and how much of a core it was using (a triggerer at 100% of a core cannot ask faster however
long it is given: the Kubernetes anchor, from 100 pods). Its window then opens half an interval
after its next request, so that a window of whole intervals holds whole ticks of a poller (ours: exactly
three in 30 s, not two or four by chance); both sides use the same poll interval. In its window: API calls
per minute counted at the emulator and at the triggerer's clients, the triggerer's CPU seconds per
minute, and its peak RSS. Every process of a group runs until the group's last window closes.

API calls are counted twice: at the emulator (every request it received from the triggerer process)
and at the triggerer's own clients (every HTTP request its botocore / aiobotocore / kubernetes /
kubernetes_asyncio clients sent, retries included, read at both ends of the window): when the
emulator cannot keep up, the first is what it served, the second what the triggerer sent.

Usage: ``python benchmarks/polling.py [--quick] [--backends batch sagemaker kubernetes] [--jobs 100 1000]
[--events-jobs N ...] [--interval S] [--window S] [--warmup-max S] [--backstop S]`` (``make bench`` runs
``--quick``: 100 jobs, 2 s interval, 8 s window, events on with an 8 s backstop, about a minute). The full
mode (100 and 1,000 jobs on every backend, 10 s interval, 30 s window, events on at 1,000 with the 60 s
backstop and a 60 s window) runs the backends one after another; ``--backends X`` runs one.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._anchor_env import anchor_pythonpath, aws_env, kubernetes_env, kubernetes_pod_trigger  # noqa: E402
from benchmarks._events import EVENTS_OFF, events_on, wire_aws_events  # noqa: E402

ANCHORS = {
    "batch": "BatchJobTrigger",
    "sagemaker": "SageMakerTrigger",
    "kubernetes": "KubernetesPodTrigger",
}
#: the side of ours with its backend's event source on (``ours`` polls only)
EVENTS_SIDE = "ours-events"


def is_poll(action: str) -> bool:
    """Whether a request is a status poll (not an event queue's read, not a watch)."""
    return not action.startswith(("sqs:", "watch "))


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
    make = _ours if args.side in ("ours", EVENTS_SIDE) else None
    triggers = (
        make(spec["backend"], spec["handles"], args.interval)
        if make
        else _anchor(args.kind, spec["handles"], args.interval)
    )

    async def watch(trigger: Any) -> None:
        async for event in trigger.run():
            payload = dict(event.payload)
            if isinstance(payload.get("stack_trace"), str):  # its end names the exception
                payload["stack_trace"] = "..." + payload["stack_trace"][-1500:]
            print("event:", json.dumps(payload, default=str)[:3000], flush=True)
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
    env_for: Callable[[str], dict[str, str]]  # a triggerer's connection environment, with its client identity
    backend: Any  # ours
    requests: Callable[..., list[dict[str, Any]]]  # the emulator's request log (``since=``: only the newer)
    ids_in: Callable[[dict[str, Any]], list[str]]  # the job ids a request names
    submit: Callable[[int], dict[str, Any]]  # the i-th waiting job's handle
    events_env: dict[str, str]  # what turns our event source on
    purge: Callable[[], None] = lambda: None  # empty the event queue (AWS)


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

            url = wire_aws_events(emulator.client, "batch", "bench-batch-events")
            yield World(
                kind,
                lambda client: dict(env, AWS_ACCESS_KEY_ID=client),
                backend,
                emulator.requests,
                lambda r: list(r["body"].get("jobs") or []) if r["action"] == "DescribeJobs" else [],
                submit,
                events_on("batch", url),
                lambda: emulator.client("sqs").purge_queue(QueueUrl=url),
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

            url = wire_aws_events(emulator.client, "sagemaker", "bench-sagemaker-events")
            yield World(
                kind,
                lambda client: dict(env, AWS_ACCESS_KEY_ID=client),
                backend,
                emulator.requests,
                named,
                submit,
                events_on("sagemaker", url),
                lambda: emulator.client("sqs").purge_queue(QueueUrl=url),
            )
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

            def env_for(client: str) -> dict[str, str]:
                return kubernetes_env(emulator.kubeconfig(root / f"kubeconfig-{client}", token=client))

            yield World(kind, env_for, backend, emulator.requests, named, submit, events_on("kubernetes"))
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
    warmup_end: str  # what ended the warm-up
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


@dataclass
class Run:
    """One triggerer process of a group: ``side`` watching the first ``n`` jobs, as client ``client``."""

    side: str
    n: int
    proc: subprocess.Popen[bytes]
    out: Path
    started: float
    wanted: set[str]
    client: str = ""
    period: float = 0.0  # seconds between its regular polls (the interval; events on: the backstop)
    window: float = 0.0  # its measured window
    state: str = "warming"  # -> aligning -> measuring -> done
    seen: set[str] = field(default_factory=set)
    calls: list[tuple[float, str]] = field(default_factory=list)  # (wall time, action) of its requests at the emulator
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, CPU s) while warming
    warmup: float = 0.0
    warmup_end: str = ""
    after: float = 0.0  # wall time its warm-up ended
    t0: float = 0.0  # its window, monotonic
    wall0: float = 0.0  # and wall
    cpu0: float = 0.0
    client0: tuple[int, int] = (0, 0)
    result: Result | None = None


def _start(
    w: World, side: str, n: int, handles: list[dict[str, Any]], interval: float, root: Path, tuning: dict[str, str]
) -> Run:
    client = f"{side}-{n}"
    spec_file = root / f"{w.kind}-{client}.json"
    spec_file.write_text(json.dumps({"backend": w.backend.spec(), "handles": handles[:n]}))
    env = dict(os.environ, **w.env_for(client))
    if side == "ours":
        env.update(EVENTS_OFF)
    elif side == EVENTS_SIDE:
        env.update(w.events_env, **tuning)
    path = [str(REPO)]
    if side == "anchor" and w.kind in ("batch", "sagemaker"):
        path.insert(0, anchor_pythonpath())
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"
    out = root / f"{w.kind}-{client}.log"
    cmd = [sys.executable, __file__, "--child", w.kind, "--side", side, "--interval", str(interval)]
    cmd += ["--child-input", str(spec_file)]
    with out.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    wanted = {h["job_id"] if w.kind != "kubernetes" else h["name"] for h in handles[:n]}
    return Run(side, n, proc, out, time.monotonic(), wanted, client)


def _core_share(run: Run, now: float, span: float = 10.0) -> float:
    """The share of one core ``run``'s process used over the last ``span`` seconds of its warm-up."""
    past = [(t, c) for t, c in run.cpu if t <= now - span] or run.cpu[:1]
    (t_then, cpu_then), (t_now, cpu_now) = past[-1], run.cpu[-1]
    return (cpu_now - cpu_then) / (t_now - t_then) if t_now > t_then else 0.0


def _step(w: World, run: Run, interval: float, window: float, warmup_max: float) -> None:
    """Move ``run`` on: warm-up, then alignment, then its window."""
    now = time.monotonic()
    if run.state == "warming":
        run.cpu.append((now, _cpu_seconds(run.proc.pid)))
        lists = run.side != "anchor" and w.kind == "kubernetes"  # one list of pods per tick names none
        every = run.wanted <= run.seen or lists
        if every and (run.side == "anchor" or sum(is_poll(a) for _, a in run.calls) >= 2):  # ours: two polls, too
            run.warmup_end = "every job asked about"
        elif now - run.started > warmup_max:  # measure what it does anyway, and say how far it had got
            run.warmup_end = (
                f"cut at {warmup_max:g} s: {len(run.seen)} of {run.n} jobs asked about, "
                f"{_core_share(run, now):.0%} of a core over its last 10 s"
            )
        else:
            return
        run.warmup, run.after, run.state = now - run.started, time.time(), "aligning"
    if run.state == "aligning":  # the window opens half an interval after its next request: whole ticks
        if run.side == EVENTS_SIDE:  # half a backstop period after one of its polls (its long polls run anyway)
            nxt = next((t for t, a in run.calls if is_poll(a) and t + run.period / 2 >= run.after), None)
        else:
            nxt = next((t for t, _ in run.calls if t > run.after), None)
        if nxt is None or time.time() < nxt + run.period / 2:
            return
        run.t0, run.wall0, run.cpu0 = now, time.time(), _cpu_seconds(run.proc.pid)
        run.client0 = _client_calls(run.proc, run.out, 1)
        run.state = "measuring"
        return
    if run.state == "measuring" and now - run.t0 >= run.window:
        sent, answered = _client_calls(run.proc, run.out, 2)
        cpu, t1, wall1 = _cpu_seconds(run.proc.pid), time.monotonic(), time.time()
        minutes = (t1 - run.t0) / 60
        inside = [a for t, a in run.calls if run.wall0 <= t < wall1]
        counted: dict[str, int] = {}
        for action in inside:
            counted[action] = counted.get(action, 0) + 1
        calls = len(inside)
        run.result = Result(
            calls * 60 / (wall1 - run.wall0),
            (sent - run.client0[0]) / minutes,
            (answered - run.client0[1]) / minutes,
            (cpu - run.cpu0) / minutes,
            _peak_rss_mb(run.proc.pid),
            run.warmup,
            run.warmup_end,
            counted,
            0,
        )
        run.state = "done"


def measure_group(
    w: World,
    runs: list[tuple[str, int]],
    handles: list[dict[str, Any]],
    interval: float,
    window: float,
    warmup_max: float,
    root: Path,
    backstop: float = 0.0,
    tuning: dict[str, str] | None = None,
) -> dict[tuple[str, int], Result]:
    """Start a triggerer for each ``(side, n)`` at once, each with its own client identity (the emulator
    records who sent each request); each one's window opens when it has warmed up, and every process
    runs until the last window closes."""
    mark = len(w.requests())
    group: list[Run] = []
    by_client: dict[str, Run] = {}
    try:
        for side, n in runs:
            run = _start(w, side, n, handles, interval, root, tuning or {})
            run.period = max(interval, backstop) if side == EVENTS_SIDE else interval
            run.window = max(window, run.period)
            group.append(run)
            by_client[run.client] = run
        while any(run.state != "done" for run in group):
            time.sleep(min(0.25, interval / 8))
            for run in group:
                if run.proc.poll() is not None:
                    raise RuntimeError(
                        f"{run.client} triggerer exited {run.proc.returncode}: {run.out.read_text()[-3000:]}"
                    )
            new = w.requests(since=mark)
            mark += len(new)
            for r in new:
                run = by_client.get(r.get("client") or "")
                if run is None:
                    print(f"  a request from no triggerer of the group: {r['action']} ({r.get('client')})")
                    continue
                run.calls.append((r["time"], r["action"]))
                if run.state == "warming":
                    run.seen.update(w.ids_in(r))
            for run in group:
                _step(w, run, interval, window, warmup_max)
    finally:
        for run in group:
            run.proc.terminate()
        for run in group:
            try:
                run.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait()
    results = {}
    for run in group:
        assert run.result is not None
        fired = [line for line in run.out.read_text().splitlines() if line.startswith("event:")]
        if fired:  # none should fire: say what the first one was
            print(f"  {w.kind} {run.client}: {len(fired)} triggers fired, the first: {fired[0][:3000]}", flush=True)
        result = results[(run.side, run.n)] = dataclasses.replace(run.result, events=len(fired))
        if result.client_answered_per_min < 0.98 * result.client_sent_per_min:  # requests left waiting
            print(
                f"  {w.kind} {run.client}: answers lagged its requests ({result.client_sent_per_min:.0f}/min sent, "
                f"{result.client_answered_per_min:.0f} answered in its window): the emulator, or its own event loop "
                f"({result.cpu_s_per_min:.1f} CPU s/min), did not keep up",
                flush=True,
            )
    return results


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
        "--warmup-max", type=float, default=None, help="cut a warm-up after this (s; default 90, --quick 60)"
    )
    parser.add_argument(
        "--events-jobs",
        type=int,
        nargs="*",
        default=None,
        help="N at which ours also runs with events on (default: the largest)",
    )
    parser.add_argument(
        "--backstop",
        type=float,
        default=None,
        help="events on: the backstop poll (s; default the product's 60, --quick 4 intervals)",
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
    warmup_max = args.warmup_max or (60.0 if args.quick else 90.0)
    events_jobs = set(args.events_jobs if args.events_jobs is not None else [max(jobs)])
    tuning: dict[str, str] = {}  # events on: the product's defaults, but for --quick or --backstop
    if args.backstop or args.quick:
        tuning["AIRFLOW__GPU_PROVIDER__EVENT_BACKSTOP_INTERVAL"] = f"{args.backstop or 4 * interval:g}"
    if args.quick:
        tuning["AIRFLOW__GPU_PROVIDER__AWS_EVENTS_WAIT_SECONDS"] = f"{max(1, min(20, round(2 * interval)))}"
    from gpu_provider.triggers.gpu_job import event_backstop_interval

    os.environ.update(tuning)
    backstop = event_backstop_interval()  # what the events-on triggerer will use
    for key in tuning:
        del os.environ[key]
    if "batch" in args.backends or "sagemaker" in args.backends:
        anchor_pythonpath()  # build the aiobotocore overlay before any timing
    rows = []
    loads: dict[tuple[str, int], float] = {}
    took: dict[str, float] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-poll-") as tmp:
        for kind in args.backends:
            t0 = time.monotonic()
            root = Path(tmp, kind)
            root.mkdir()
            with world(kind, root) as w:
                handles: list[dict[str, Any]] = []
                for n in sorted(jobs):  # as many jobs waiting in the service as the row says
                    t1 = time.monotonic()
                    handles += [w.submit(i) for i in range(len(handles), n)]
                    load = os.getloadavg()[0]
                    loads[(kind, n)] = load
                    print(
                        f"  {kind}: {n} jobs waiting ({time.monotonic() - t1:.0f} s to submit), load average "
                        f"{load:.2f} (1 min)",
                        flush=True,
                    )
                    group = [("ours", n), ("anchor", n)]
                    if n in events_jobs:
                        w.purge()
                        group.append((EVENTS_SIDE, n))
                    measured = measure_group(
                        w, group, handles, interval, window, warmup_max, root, backstop=backstop, tuning=tuning
                    )
                    for (side, _), r in measured.items():
                        rows.append((kind, n, side, r))
                        print(
                            f"  {kind} {n} {side}: {r.calls_per_min:.0f} calls/min at the emulator, "
                            f"{r.client_sent_per_min:.0f} sent and {r.client_answered_per_min:.0f} answered at its "
                            f"clients, {r.cpu_s_per_min:.2f} CPU s/min, {r.peak_rss_mb:.0f} MB peak RSS, warm-up "
                            f"{r.warmup_s:.0f} s ({r.warmup_end}), {r.actions}, {r.events} events",
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
    events_rows = [(k, n) for k in args.backends for n in sorted(jobs) if (k, n, EVENTS_SIDE) in by]
    if events_rows:
        print(
            f"Events on (ours with the event source on, in the same run, at once with the two above; backstop poll "
            f"every {backstop:g} s; its window {max(window, backstop):g} s):"
        )
        print(
            "| backend | waiting | load (1 min) | ours events on calls/min (emulator / client) | its calls by kind "
            "| ours events off (emulator / client) | anchor (emulator / client) | anchor / events on (emulator) "
            "| events on CPU s/min | events on peak RSS MB |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for kind, n in events_rows:
            e, o, a = by[(kind, n, EVENTS_SIDE)], by[(kind, n, "ours")], by[(kind, n, "anchor")]
            kinds = ", ".join(
                f"{action} {count * 60 / max(window, backstop):.0f}" for action, count in sorted(e.actions.items())
            )
            print(
                f"| {kind} | {n} | {loads[(kind, n)]:.2f} | {e.calls_per_min:.0f} / {e.client_sent_per_min:.0f} | "
                f"{kinds} | {o.calls_per_min:.0f} / {o.client_sent_per_min:.0f} | "
                f"{a.calls_per_min:.0f} / {a.client_sent_per_min:.0f} | {_ratio(a.calls_per_min, e.calls_per_min)} | "
                f"{e.cpu_s_per_min:.2f} | {e.peak_rss_mb:.0f} |"
            )
        for kind, n in events_rows:
            e, o = by[(kind, n, EVENTS_SIDE)], by[(kind, n, "ours")]
            worst = max(e.calls_per_min, e.client_sent_per_min)
            off = max(o.calls_per_min, o.client_sent_per_min)
            print(
                f"target ({kind}, {n} waiting): events on no more calls/min than events off: {worst:.0f} vs "
                f"{off:.0f} (the larger of emulator and client counts) -> {'met' if worst <= off else 'missed'}"
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
