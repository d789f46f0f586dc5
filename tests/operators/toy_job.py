"""A tiny checkpointing job for operator tests: counts to --steps, one checkpoint per step.

Writes its pid to ``$PID_DIR/<attempt>-<rank>.pid``, resumes from ``GPU_PROVIDER_RESUME_FROM``,
stops cleanly on SIGTERM (checkpoint, exit 143), can fail on chosen attempts (``--fail-on-attempt``),
steps fast from a chosen attempt on (``--fast-from-attempt``: the test's last attempt only has to finish),
with ``--hold-until FILE`` waits after its last step until FILE exists (a test releases it once it
has seen what it waits for, however slow the machine), and at the end writes ``result.json`` (the
steps it executed in each attempt) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gpu_provider.runtime import declare_output, install_stop_handler, job_env, restore_checkpoint, save_checkpoint

#: the step of an attempt at or after --fast-from-attempt (seconds)
FAST_DELAY_S = 0.01


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--fast-from-attempt",
        type=int,
        default=0,
        help="from this attempt on, step every 0.01 s instead of --delay (a last attempt that only has to finish)",
    )
    parser.add_argument("--fail-on-attempt", type=int, default=0)
    parser.add_argument("--hold-until", default=None, help="after the last step, wait until this file exists")
    parser.add_argument("--fault-on-attempts", default="", help="attempts (comma-separated) that hit a GPU fault")
    parser.add_argument("--fault-rank", type=int, default=0, help="the node that prints the fault")
    parser.add_argument("--fault-text", default="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    args = parser.parse_args()
    env = job_env()
    pid_dir = os.environ.get("PID_DIR")
    if pid_dir:
        Path(pid_dir).mkdir(parents=True, exist_ok=True)
        Path(pid_dir, f"{env.attempt}-{env.node_rank}.pid").write_text(str(os.getpid()))
    stop = install_stop_handler()
    step, history = 0, []
    if env.resume_from:
        state = json.loads((restore_checkpoint(env.resume_from) / "state.json").read_text())
        step, history = state["step"], state["history"]
        print(f"resumed from step {step}", flush=True)
    history.append({"attempt": env.attempt, "capacity": env.capacity, "start": step})
    print(f"attempt {env.attempt} on {env.capacity}, rank {env.node_rank}/{env.nnodes}", flush=True)
    delay = FAST_DELAY_S if args.fast_from_attempt and env.attempt >= args.fast_from_attempt else args.delay
    while step < args.steps:
        time.sleep(delay)
        step += 1
        if env.node_rank == 0 and env.checkpoint_uri:
            with save_checkpoint(env.checkpoint_uri, step) as folder:
                (folder / "state.json").write_text(json.dumps({"step": step, "history": history}))
        if args.fail_on_attempt == env.attempt and step >= 2:
            print("failing on purpose", flush=True)
            return 3
        faulty = [int(a) for a in args.fault_on_attempts.split(",") if a.strip()]
        if env.attempt in faulty and step >= 2 and env.node_rank == args.fault_rank:
            print(args.fault_text, flush=True)  # what the driver or NCCL prints when the hardware fails
            return 1
        if stop.requested:
            print(f"stop requested at step {step}", flush=True)
            return 143
    while args.hold_until and not os.path.exists(args.hold_until):
        if stop.requested:
            print(f"stop requested while held at step {step}", flush=True)
            return 143
        time.sleep(0.05)
    if env.node_rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"steps": step, "history": history, "env": dict(os.environ)}))
        declare_output("file://" + str(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
