"""Example pipeline, stage 2 with PyTorch: DistributedDataParallel training that survives interruptions.

The PyTorch variant of :mod:`gpu_provider.examples.train`: the same two-layer network (16 -> 32 tanh -> 1
logit, float64, logistic loss) and minibatch SGD with momentum, as a ``torch.nn.Module`` wrapped in
``DistributedDataParallel``. One process per node, started by ``torchrun`` with the rendezvous of the
provider's job contract (``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, normalised on
every backend by ``gpu_provider.runtime.launch``); process group ``gloo`` on the CPU, ``nccl`` on GPUs.
Run it on each node as::

    python -m gpu_provider.runtime.launch -- sh -c 'exec torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" \\
        --nproc-per-node 1 --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\
        -m gpu_provider.examples.train_ddp --data file:///data --out file:///model --epochs 4'

Checkpoints go through :mod:`gpu_provider.runtime` (``save_checkpoint`` / ``resume_checkpoint``):
every ``--checkpoint-every`` steps rank 0 saves the model, the optimizer (momentum) and the step. On
SIGTERM/SIGINT (torchrun forwards the backend's stop to its worker) or a spot notice, the ranks agree on
a stop step (each step all-reduces a stop flag with the loss), rank 0 saves a checkpoint there, and every
rank exits 143. The batch order comes from ``(seed, epoch)`` and the gradient sum over two ranks does
not depend on order, so on one machine a run that is interrupted and resumed ends with exactly the
parameters of an uninterrupted run. After the last step rank 0 writes ``model.pt`` and ``metrics.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from gpu_provider.examples._common import uri_to_path, write_json
from gpu_provider.examples.train import HIDDEN, MOMENTUM, batch_indices, load_split
from gpu_provider.runtime import (
    SpotInterruptionWatcher,
    declare_output,
    install_stop_handler,
    job_env,
    restore_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

EXIT_STOPPED = 143


def make_net(n_features: int) -> nn.Module:
    """16 -> 32 tanh -> 1 logit, float64 (the numpy example's network)."""
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Linear(n_features, HIDDEN, dtype=torch.float64),
        nn.Tanh(),
        nn.Linear(HIDDEN, 1, dtype=torch.float64),
        nn.Flatten(0),
    )


def log(rank: int, message: str) -> None:
    print(f"[rank {rank}] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", required=True, help="folder with train.npz from the preprocess stage")
    parser.add_argument("--out", required=True, help="folder for model.pt and metrics.json")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="default: every full batch of the data")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps; 0: only on stop")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (demo pacing)")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.steps_per_epoch < 0 or args.checkpoint_every < 0:
        parser.error("--epochs and --batch-size must be positive; --steps-per-epoch and --checkpoint-every >= 0")
    return args


def save_state(uri: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, plan: dict[str, Any]) -> None:
    import torch

    with save_checkpoint(uri, step) as folder:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "state.pt")
        write_json(folder / "meta.json", {"step": step, **plan})


def load_state(resume_from: str, model: nn.Module, optimizer: torch.optim.Optimizer, plan: dict[str, Any]) -> int:
    import json

    import torch

    folder = restore_checkpoint(resume_from)
    meta = json.loads((folder / "meta.json").read_text())
    for key, value in plan.items():
        if meta.get(key) != value:
            raise SystemExit(f"error: checkpoint {resume_from} was made with {key}={meta.get(key)!r}, not {value!r}")
    state = torch.load(folder / "state.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(meta["step"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = job_env()
    # before importing torch (seconds on a busy machine): a stop during the import is not lost
    stop = install_stop_handler()
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    try:
        x_np, y_np = load_split(uri_to_path(args.data), "train")
        x, y = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).to(device, torch.float64)
        n_rows, n_features = x.shape
        steps_per_epoch = args.steps_per_epoch or n_rows // args.batch_size
        total_steps = args.epochs * steps_per_epoch
        plan = {"seed": args.seed, "batch_size": args.batch_size, "steps_per_epoch": steps_per_epoch, "world": world}
        torch.manual_seed(args.seed)
        model = make_net(n_features).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
        step = 0
        resume_from = resume_checkpoint(env)
        if resume_from:
            step = load_state(resume_from, model, optimizer, plan)
            log(rank, f"resumed from {resume_from.rstrip('/').rsplit('/', 1)[-1]} (step {step} of {total_steps})")
        else:
            log(rank, f"starting from step 0, {total_steps} steps, {world} ranks on {device.type}")
        ddp = DistributedDataParallel(model)
        watch = SpotInterruptionWatcher(stop) if env.capacity == "spot" else contextlib.nullcontext()
        with watch:
            while step < total_steps:
                epoch, index = divmod(step, steps_per_epoch)
                order = torch.from_numpy(batch_indices(args.seed, epoch, n_rows))
                shard = torch.tensor_split(order[index * args.batch_size : (index + 1) * args.batch_size], world)[rank]
                optimizer.zero_grad()
                logits = ddp(x[shard])
                # DDP averages gradients over ranks; scale so that the update is that of the global batch mean
                loss = nn.functional.binary_cross_entropy_with_logits(logits, y[shard], reduction="sum")
                (loss * world / args.batch_size).backward()
                optimizer.step()
                step += 1
                flag = torch.tensor([1.0 if stop.requested else 0.0], dtype=torch.float64, device=device)
                dist.all_reduce(flag)
                if flag.item() > 0 and step < total_steps:
                    if rank == 0 and env.checkpoint_uri:
                        save_state(env.checkpoint_uri, step, model, optimizer, plan)
                    dist.barrier()  # nobody exits before the checkpoint is complete
                    log(rank, f"stop requested at step {step}: checkpoint saved, exiting")
                    return EXIT_STOPPED
                if rank == 0 and env.checkpoint_uri and args.checkpoint_every and step % args.checkpoint_every == 0:
                    save_state(env.checkpoint_uri, step, model, optimizer, plan)
                if args.step_delay:
                    import time

                    time.sleep(args.step_delay)
        if rank == 0:
            out = uri_to_path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), out / "model.pt")
            with torch.no_grad():
                final = nn.functional.binary_cross_entropy_with_logits(model(x), y).item()
            write_json(out / "metrics.json", {"steps": total_steps, "nnodes": world, "final_loss": final})
            declare_output(args.out)
            log(rank, f"done: {total_steps} steps, final loss {final:.4f}")
        return 0
    finally:
        # the process group is NOT destroyed: see leave()
        sys.stdout.flush()
        sys.stderr.flush()


def leave(run: Callable[[], int]) -> NoReturn:
    """Run ``run`` and end the process with its exit code at once, without the interpreter's teardown.

    Tearing down a gloo process group can deadlock (seen with torch 2.13 on two nodes, unpaced): the main
    thread, holding the GIL, destroys the group DDP's reducer holds and joins gloo's run-loop thread, while
    that thread waits for the GIL to release a tensor. A rank that never exits holds its GPUs until the
    task's timeout, so each rank leaves with ``os._exit`` once its work is done: every collective has
    completed (the last step's stop-flag all-reduce, or the barrier after a stop checkpoint), rank 0's files
    are written and closed, and the output is flushed. An error or ``SystemExit`` ends the same way, with the
    code and message Python would give.
    """
    try:
        code = run()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main)
