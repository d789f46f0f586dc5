"""Check a job program's side of the contract, and a DAG's checkpoint URIs, before a cloud does.

``python -m gpu_provider.testing.check [options] -- <program...>`` runs the program three times under the
local backend, as the provider would across interruptions, and says in plain words what it does:

1. a fresh start, interrupted ``--interrupt-after`` seconds in (SIGTERM, then SIGKILL after
   ``--grace-period``): does it stop in time, and save a checkpoint when asked to stop?
2. a new attempt with ``GPU_PROVIDER_RESUME_FROM`` set to the newest checkpoint, interrupted again: does
   it continue from there rather than start over?
3. a restart with a *stale* ``GPU_PROVIDER_RESUME_FROM`` (an older checkpoint; what a service that
   restarts a job inside the attempt, SageMaker managed spot or a Kubernetes Job, leaves set): does it
   take the newest checkpoint in the store, and run to the end and declare its output?

``--dag FILE`` also checks a DAG file's ``GpuJobOperator`` tasks: a checkpoint URI that does not change
with the run would let one run resume from another's checkpoints (a backfill, a re-run), and two tasks
sharing one would resume from each other's. Whether each stage declares its output is read from a run:
:func:`check_dag_run` (``run_gpu_dag`` gives one).

The program is run as the provider runs it on the local backend: its own process group, the contract's
environment (``GPU_PROVIDER_CHECKPOINT_URI`` a ``file://`` folder of the checker's), the current folder.
Exit status: 0 when nothing failed, 1 otherwise. Base install only (no moto, no Airflow for programs).

The report types are in :mod:`gpu_provider.testing.findings`, the DAG checks in
:mod:`gpu_provider.testing.check_dag`; every name is importable from here.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_provider import names
from gpu_provider.testing.check_dag import check_dag, check_dag_run
from gpu_provider.testing.findings import CHECKS, CheckReport, Finding

__all__ = ["CHECKS", "CheckReport", "Finding", "check_dag", "check_dag_run", "check_program", "main"]


# --- the program checks --------------------------------------------------------------------------


@dataclass
class _Run:
    state: str
    exit_code: int | None
    reason: str
    output: str | None
    first_new_step: int | None  # the first checkpoint step the run published
    last_step: int | None  # the newest published step when the run ended
    stop_requested_at_step: int | None  # the newest published step when the interruption was asked for
    log: str


def _published_step(uri: str) -> int | None:
    from gpu_provider.runtime.checkpoint import published_checkpoint

    try:
        found = published_checkpoint(uri)
    except OSError:
        return None
    return found[1] if found else None


def _step_uri(uri: str) -> str | None:
    from gpu_provider.runtime.checkpoint import published_checkpoint

    found = published_checkpoint(uri)
    return found[0] if found else None


class _ProgramRunner:
    def __init__(self, command: Sequence[str], state_dir: Path, grace_period: float, gpus: Sequence[int]) -> None:
        from gpu_provider.backends.base import TaskKey
        from gpu_provider.backends.local import LocalBackend

        self.command = tuple(command)
        self.backend = LocalBackend(state_dir=str(state_dir), grace_period=grace_period, gpus=list(gpus))
        self.task = TaskKey(dag_id="gpu_provider_check", task_id="program", run_id=f"check-{uuid.uuid4().hex[:12]}")

    def run(
        self,
        attempt: int,
        uri: str,
        resume_from: str | None,
        *,
        interrupt_after: float | None,
        timeout: float,
        capacity: str = names.SPOT,
    ) -> _Run:
        from gpu_provider.backends.base import JobIdentity, JobRequest, JobStatus
        from gpu_provider.job import GpuResources

        env = {
            names.ENV_CHECKPOINT_URI: uri,
            names.ENV_CHECKPOINT_KEEP: "",
            names.ENV_RESUME_FROM: resume_from or "",
            names.ENV_ATTEMPT: str(attempt),
            names.ENV_CAPACITY: capacity,
        }
        request = JobRequest(
            identity=JobIdentity(task=self.task, try_number=1, attempt=attempt, capacity=capacity),
            command=self.command,
            env=env,
            resources=GpuResources(gpus=1),
            capacity=capacity,
            checkpoint_uri=uri,
            resume_from=resume_from,
        )
        start_step = _published_step(uri)
        handle = self.backend.submit(request)
        first_new: int | None = None
        stop_step: int | None = None
        interrupted = False
        deadline = time.monotonic() + timeout
        status: Any = None
        try:
            while True:
                step = _published_step(uri)
                if first_new is None and step is not None and step != start_step:
                    first_new = step
                status = self.backend.poll([handle])[handle.job_id]
                if isinstance(status, JobStatus):
                    if status.state.terminal:
                        break
                    started = status.started_at
                    due = interrupt_after is not None and started is not None
                    if due and not interrupted and time.time() - (started or 0.0) >= (interrupt_after or 0.0):
                        stop_step = step
                        self.backend.simulate_preemption(handle)
                        interrupted = True
                if time.monotonic() > deadline:
                    self.backend.cancel(handle, "the checker's timeout")
                    raise TimeoutError(f"the program did not end within {timeout:g}s")
                time.sleep(0.02)
        finally:
            if not (isinstance(status, JobStatus) and status.state.terminal):
                self.backend.cancel(handle, "checker stopped")
        step = _published_step(uri)
        if first_new is None and step is not None and step != start_step:
            first_new = step
        log = "\n".join(self.backend.logs(handle, None, max_bytes=256 * 1024).lines)
        return _Run(
            state=status.state.name,
            exit_code=status.exit_code,
            reason=status.reason,
            output=status.output_uri,
            first_new_step=first_new,
            last_step=step,
            stop_requested_at_step=stop_step if interrupted else None,
            log=log,
        )


def check_program(
    command: Sequence[str],
    *,
    interrupt_after: float = 3.0,
    grace_period: float = 5.0,
    timeout: float = 120.0,
    state_dir: str | Path | None = None,
    gpus: Sequence[int] = (0,),
) -> CheckReport:
    """Run ``command`` three times under the local backend (see the module's docstring) and report.

    :param command: the job program's command line, as ``GpuJobOperator(command=...)`` takes it
    :param interrupt_after: seconds after the start at which runs 1 and 2 are interrupted; the program
        should run longer than twice that and checkpoint more often
    :param grace_period: seconds between SIGTERM and SIGKILL
    :param timeout: the longest one run may take
    :param state_dir: where the local backend and the checkpoints live (default: a temporary folder)
    :param gpus: fake GPU indices (``CUDA_VISIBLE_DEVICES``)
    """
    if not command:
        raise ValueError("command=[] is empty: give the job program's command line")
    if interrupt_after <= 0:
        raise ValueError(f"interrupt_after={interrupt_after!r} must be more than 0 seconds")
    with tempfile.TemporaryDirectory(prefix="gpu-provider-check-") as tmp:
        root = Path(state_dir) if state_dir is not None else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        return _check(command, root, interrupt_after, grace_period, timeout, gpus)


def _tail(log: str, lines: int = 15) -> str:
    return "\n".join("    | " + line for line in log.rstrip().splitlines()[-lines:])


def _check(
    command: Sequence[str], root: Path, interrupt_after: float, grace: float, timeout: float, gpus: Sequence[int]
) -> CheckReport:
    runner = _ProgramRunner(command, root / "state", grace, gpus)
    uri = (root / f"checkpoints-{runner.task.run_id}").as_uri()
    report = CheckReport()
    add = report.findings.append

    # 1: fresh start, interrupted
    first = runner.run(1, uri, None, interrupt_after=interrupt_after, timeout=timeout)
    report.logs["run 1 (fresh start, interrupted)"] = first.log
    if first.stop_requested_at_step is None and first.state == "SUCCEEDED":
        add(
            Finding(
                "sigterm",
                None,
                f"the program finished (exit {first.exit_code}) before the interruption at {interrupt_after:g}s: "
                "give it more work, or a smaller --interrupt-after",
            )
        )
        add(Finding("checkpoint", first.last_step is not None, _checkpoint_words(first.last_step, uri)))
        add(Finding("output", first.output is not None, _output_words(first)))
        return report
    if first.state not in ("PREEMPTED", "SUCCEEDED"):
        add(
            Finding(
                "sigterm",
                False,
                f"the program ended {first.state} (exit {first.exit_code}: {first.reason}) before or while "
                f"being interrupted; its log ends:\n{_tail(first.log)}",
            )
        )
        return report
    add(Finding("checkpoint", first.last_step is not None, _checkpoint_words(first.last_step, uri)))
    killed = first.exit_code == 137 or "SIGKILL" in first.reason
    saved = first.last_step is not None and first.last_step != first.stop_requested_at_step
    if killed:
        add(
            Finding(
                "sigterm",
                False,
                f"it was still running {grace:g}s after SIGTERM and was killed with SIGKILL (exit 137): it ignores "
                "or blocks SIGTERM. On spot capacity that loses everything since its last checkpoint. Handle it: "
                "gpu_provider.runtime.install_stop_handler(), then save a checkpoint and exit when "
                "stop.requested",
            )
        )
    elif not saved:
        add(
            Finding(
                "sigterm",
                False,
                f"it stopped on SIGTERM (exit {first.exit_code}) without saving a checkpoint first (newest step "
                f"{first.last_step} both when asked to stop and at exit): save one when the stop handler fires",
            )
        )
    else:
        add(
            Finding(
                "sigterm",
                True,
                f"on SIGTERM it saved step {first.last_step} (newest before: {first.stop_requested_at_step or 'none'})"
                f" and exited {first.exit_code} within the {grace:g}s grace period",
            )
        )
    if first.last_step is None:
        add(Finding("resume", None, "no checkpoint to resume from: cannot tell"))
        return report

    # 2: resume from GPU_PROVIDER_RESUME_FROM, interrupted again
    resume_uri = _step_uri(uri)
    second = runner.run(2, uri, resume_uri, interrupt_after=interrupt_after, timeout=timeout)
    report.logs["run 2 (resumed, interrupted)"] = second.log
    if second.first_new_step is None:
        add(Finding("resume", None, f"the second run wrote no checkpoint (it ended {second.state}): cannot tell"))
    elif second.first_new_step > first.last_step:
        add(
            Finding(
                "resume",
                True,
                f"given GPU_PROVIDER_RESUME_FROM={resume_uri} (step {first.last_step}), its first new checkpoint "
                f"was step {second.first_new_step}",
            )
        )
    else:
        add(
            Finding(
                "resume",
                False,
                f"given GPU_PROVIDER_RESUME_FROM={resume_uri} (step {first.last_step}), it wrote step "
                f"{second.first_new_step} next: it started over instead of resuming. Restore the checkpoint "
                "GPU_PROVIDER_RESUME_FROM names (gpu_provider.runtime.resume_checkpoint())",
            )
        )

    # 3: a restart with a stale GPU_PROVIDER_RESUME_FROM, to the end
    newest = second.last_step
    third = runner.run(3, uri, resume_uri, interrupt_after=None, timeout=timeout, capacity=names.ON_DEMAND)
    report.logs["run 3 (restart with a stale GPU_PROVIDER_RESUME_FROM, to the end)"] = third.log
    if newest is None or newest == first.last_step:
        add(Finding("newest", None, "the second run published no newer checkpoint: cannot tell"))
    elif third.first_new_step is None:
        add(Finding("newest", None, f"the third run wrote no checkpoint (it ended {third.state}): cannot tell"))
    elif third.first_new_step > newest:
        add(
            Finding(
                "newest",
                True,
                f"with GPU_PROVIDER_RESUME_FROM still naming step {first.last_step}, it took the newest "
                f"checkpoint, step {newest}, and wrote step {third.first_new_step} next",
            )
        )
    else:
        add(
            Finding(
                "newest",
                False,
                f"with GPU_PROVIDER_RESUME_FROM still naming step {first.last_step} while step {newest} was the "
                f"newest in the store, it wrote step {third.first_new_step} next: after a restart inside the "
                "attempt (SageMaker managed spot, a Kubernetes Job) it would redo work. Look in the store at "
                "start: gpu_provider.runtime.resume_checkpoint()",
            )
        )
    if third.state != "SUCCEEDED":
        add(
            Finding(
                "output",
                False,
                f"the last run ended {third.state} (exit {third.exit_code}: {third.reason}); its log "
                f"ends:\n{_tail(third.log)}",
            )
        )
    else:
        add(Finding("output", third.output is not None, _output_words(third)))
    return report


def _checkpoint_words(step: int | None, uri: str) -> str:
    if step is None:
        return (
            f"nothing was published under {uri} (no LATEST naming a complete ckpt-<step> folder): an interruption "
            "restarts it from the beginning. Use gpu_provider.runtime.save_checkpoint()"
        )
    return f"published checkpoints up to step {step}"


def _output_words(run: _Run) -> str:
    if run.output is None:
        return (
            "it succeeded without declaring an output: the next stage cannot find what it wrote through XCom "
            "(output_uri). Call gpu_provider.runtime.declare_output(uri)"
        )
    return f"declared {run.output}"


# --- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, prog: str = "python -m gpu_provider.testing.check") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Check a GPU job program (SIGTERM, checkpoints, resume, output) under the local backend, "
        "and a DAG file's checkpoint URIs.",
    )
    parser.add_argument("--dag", help="a DAG file: check its GpuJobOperator tasks' checkpoint URIs")
    parser.add_argument("--dag-id", help="with --dag: check only this DAG of the file (default: every DAG in it)")
    parser.add_argument("--interrupt-after", type=float, default=3.0, help="seconds in (default 3)")
    parser.add_argument("--grace-period", type=float, default=5.0, help="SIGTERM to SIGKILL (default 5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="the longest one run may take (default 120)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the job program's command line (after --)")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("gpu_provider").setLevel(logging.WARNING)  # not every submit: the findings are the output
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program and not args.dag:
        parser.error("give a program to check (after --) and/or --dag FILE")
    report = CheckReport()
    if args.dag:
        report.findings += check_dag(args.dag, args.dag_id).findings
    if program:
        checked = check_program(
            program, interrupt_after=args.interrupt_after, grace_period=args.grace_period, timeout=args.timeout
        )
        report.findings += checked.findings
        report.logs.update(checked.logs)
    if args.json:
        print(json.dumps([f.__dict__ for f in report.findings], indent=2))
    else:
        print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
