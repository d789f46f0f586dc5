"""Example pipeline, stage 2: data-parallel training that survives interruptions.

Trains a small two-layer network (16 -> 32 tanh -> 1 logit, float64, logistic loss) with minibatch SGD with momentum,
data-parallel over ``NNODES`` processes. For every global batch each rank takes its shard, computes the summed
gradient, and the ranks add their gradients together through rank 0 over plain TCP sockets (``MASTER_ADDR``,
``MASTER_PORT``): rank 0 receives the other ranks' vectors, adds them in rank order, and sends the sum back. The sum
order is fixed and the batch order is derived from ``(seed, epoch)``, so for a fixed ``NNODES`` a run is
bit-for-bit reproducible, and so is a run that is interrupted and resumed from any of its checkpoints.

The job's side of the provider's contract (see ``gpu_provider.runtime``):

* every ``--checkpoint-every`` steps rank 0 saves the parameters, the momentum and the step with
  ``save_checkpoint(GPU_PROVIDER_CHECKPOINT_URI, step)``;
* when ``GPU_PROVIDER_RESUME_FROM`` is set, every rank restores that checkpoint and continues from its step;
* on SIGTERM/SIGINT, or an EC2 spot notice on spot capacity, the ranks agree on a stop step (each rank's stop flag
  rides on the gradient message), rank 0 saves a checkpoint there and every rank exits with code 143; a SIGKILL
  without warning loses only the steps since the last periodic checkpoint, and the resumed run is still exact;
* after the last step rank 0 writes ``model.npz`` (w1, b1, w2, b2) and ``metrics.json`` under ``--out``.

Usage::

    python -m gpu_provider.examples.train --data file:///tmp/pipeline/data --out file:///tmp/pipeline/model \\
        --epochs 4 [--steps-per-epoch S] [--batch-size 128] [--lr 0.1] [--checkpoint-every 20] [--step-delay 0.05]

With the preprocess stage's default 8000 rows that is 4 x 50 steps; ``--step-delay 0.05`` stretches it to about
10 s, so a simulated interruption lands mid-training. Rank 0 prints progress; every rank prints how it started
and ended.

Results are reproducible on one machine (one BLAS thread per process, set below); a resume on a different CPU type
may round differently.
"""

from __future__ import annotations

import os

# Small matrices: one BLAS thread per process is faster, avoids oversubscribing the cores shared by the ranks, and
# keeps the floating-point results independent of the thread count. Must be set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from gpu_provider.examples._common import as_uri, np, uri_to_path, write_json, write_npz  # noqa: E402
from gpu_provider.runtime import (  # noqa: E402
    SpotInterruptionWatcher,
    StopFlag,
    declare_output,
    install_stop_handler,
    job_env,
    restore_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)

HIDDEN = 32
MOMENTUM = 0.9
EXIT_STOPPED = 143  # 128 + SIGTERM: what the backends read as "stopped on request"


def log(rank: int, message: str) -> None:
    """Print one line, prefixed with the rank, flushed at once so interleaved logs stay readable."""
    print(f"[rank {rank}] {message}", flush=True)


# --------------------------------------------------------------------------------------------------------- files


def load_split(data_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Load ``<data_dir>/<name>.npz`` as float64 features and float64 0/1 labels."""
    with np.load(data_dir / f"{name}.npz") as data:
        return data["X"].astype(np.float64), data["y"].astype(np.float64)


# --------------------------------------------------------------------------------------------------------- model


def param_shapes(n_features: int) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter, in the order they are packed into one flat vector."""
    return {"w1": (n_features, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN,), "b2": (1,)}


def unpack(flat: np.ndarray, n_features: int) -> dict[str, np.ndarray]:
    """Views of the named parameters inside the flat parameter vector."""
    params, offset = {}, 0
    for name, shape in param_shapes(n_features).items():
        size = int(np.prod(shape))
        params[name] = flat[offset : offset + size].reshape(shape)
        offset += size
    return params


def init_params(n_features: int, seed: int) -> np.ndarray:
    """Deterministic initial parameters (scaled normal weights, zero biases) as one flat vector."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(size=(n_features, HIDDEN)) / np.sqrt(n_features)
    w2 = rng.normal(size=HIDDEN) / np.sqrt(HIDDEN)
    return np.concatenate([w1.ravel(), np.zeros(HIDDEN), w2, np.zeros(1)])


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden activations and output logits."""
    hidden = np.tanh(x @ params["w1"] + params["b1"])
    return hidden, hidden @ params["w2"] + params["b2"][0]


def loss_and_grad(flat: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Summed logistic loss, number correct, and the summed gradient (flat) over the rows of ``x``."""
    params = unpack(flat, x.shape[1])
    hidden, logits = forward(params, x)
    loss = float(np.sum(np.logaddexp(0.0, logits) - y * logits))
    correct = float(np.sum((logits > 0) == (y > 0.5)))
    d_logits = 1.0 / (1.0 + np.exp(-logits)) - y
    d_hidden = np.outer(d_logits, params["w2"]) * (1.0 - hidden**2)
    grad = np.concatenate(
        [(x.T @ d_hidden).ravel(), d_hidden.sum(axis=0), hidden.T @ d_logits, [d_logits.sum()]],
    )
    return loss, correct, grad


def batch_indices(seed: int, epoch: int, n_rows: int) -> np.ndarray:
    """The row order of one epoch: a pure function of (seed, epoch), so a resumed run needs no RNG state."""
    return np.random.default_rng([seed, epoch]).permutation(n_rows)


# ------------------------------------------------------------------------------------------------- communication


class CommError(RuntimeError):
    """A peer died, hung up or sent something unexpected."""


class Collective:
    """Sum-allreduce of float64 vectors through rank 0 over TCP; with one process it is the identity.

    Every message is ``(step, length)`` followed by ``length`` little-endian float64 values, so a rank that
    fell out of step is caught at once. Sockets have timeouts: a dead or stuck peer is an error, never a hang.
    """

    HEADER = struct.Struct("!qI")

    def __init__(self, rank: int, world: int, peers: dict[int, socket.socket], timeout: float) -> None:
        self.rank, self.world, self.peers, self.timeout = rank, world, peers, timeout

    @classmethod
    def rendezvous(
        cls, rank: int, world: int, addr: str, port: int, hello: dict[str, Any], timeout: float, stop: StopFlag
    ) -> Collective:
        """Connect all ranks; every rank must present the same ``hello`` (run configuration and start step)."""
        if world == 1:
            return cls(rank, world, {}, timeout)
        deadline = time.monotonic() + timeout
        peers: dict[int, socket.socket] = {}
        if rank == 0:
            with socket.create_server(("", port)) as server:  # SO_REUSEADDR: a resumed run can reuse the port
                server.settimeout(0.5)
                while len(peers) < world - 1:
                    check_rendezvous(deadline, stop, f"waiting for {world - 1 - len(peers)} rank(s) on port {port}")
                    try:
                        conn, _ = server.accept()
                    except TimeoutError:
                        continue
                    conn.settimeout(timeout)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    theirs = json.loads(recv_frame(conn, "a connecting rank"))
                    peer = int(theirs.pop("rank", -1))
                    if not 0 < peer < world or peer in peers:
                        conn.close()
                        raise CommError(f"unexpected or duplicate rank {peer} connected")
                    send_frame(conn, json.dumps(hello).encode())
                    if theirs != hello:
                        raise CommError(f"rank {peer} disagrees on the run: {theirs} != {hello}")
                    peers[peer] = conn
        else:
            while True:
                check_rendezvous(deadline, stop, f"connecting to rank 0 at {addr}:{port}")
                try:
                    conn = socket.create_connection((addr, port), timeout=min(5.0, timeout))
                    break
                except OSError:
                    time.sleep(0.2)  # rank 0 is not listening yet
            conn.settimeout(timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_frame(conn, json.dumps({"rank": rank, **hello}).encode())
            theirs = json.loads(recv_frame(conn, "rank 0"))
            if theirs != hello:
                raise CommError(f"rank 0 disagrees on the run: {theirs} != {hello}")
            peers[0] = conn
        return cls(rank, world, peers, timeout)

    def allreduce_sum(self, step: int, vector: np.ndarray) -> np.ndarray:
        """The sum of every rank's ``vector``, added in rank order (deterministic), returned on every rank."""
        if self.world == 1:
            return vector
        if self.rank == 0:
            total: np.ndarray = vector.copy()
            for peer in range(1, self.world):
                total += self._recv(peer, step, vector.size)
            for peer in range(1, self.world):
                self._send(peer, step, total)
            return total
        self._send(0, step, vector)
        return self._recv(0, step, vector.size)

    def barrier(self, step: int) -> None:
        """Wait until every rank gets here."""
        self.allreduce_sum(step, np.zeros(1))

    def close(self) -> None:
        """Close every connection."""
        for conn in self.peers.values():
            conn.close()

    def _send(self, peer: int, step: int, vector: np.ndarray) -> None:
        payload = vector.astype("<f8").tobytes()
        try:
            self.peers[peer].sendall(self.HEADER.pack(step, vector.size) + payload)
        except OSError as exc:
            raise CommError(f"lost the connection to rank {peer} at step {step}: {exc}") from exc

    def _recv(self, peer: int, step: int, size: int) -> np.ndarray:
        conn = self.peers[peer]
        their_step, their_size = self.HEADER.unpack(recv_exact(conn, self.HEADER.size, f"rank {peer}"))
        if (their_step, their_size) != (step, size):
            raise CommError(
                f"rank {peer} is out of step: sent step {their_step} ({their_size} values), "
                f"expected step {step} ({size} values)"
            )
        return np.frombuffer(recv_exact(conn, 8 * size, f"rank {peer}"), dtype="<f8").astype(np.float64)


def check_rendezvous(deadline: float, stop: StopFlag, doing: str) -> None:
    """Give up the rendezvous on a stop request (nothing to save yet) or when the deadline passes."""
    if stop.requested:
        print("stop requested before training started: nothing to save, exiting", flush=True)
        sys.exit(EXIT_STOPPED)
    if time.monotonic() > deadline:
        raise CommError(f"rendezvous timed out while {doing}")


def recv_exact(conn: socket.socket, size: int, who: str) -> bytes:
    """Read exactly ``size`` bytes, turning a closed connection or a timeout into a clear ``CommError``."""
    chunks, left = [], size
    while left:
        try:
            chunk = conn.recv(min(left, 1 << 20))
        except TimeoutError as exc:
            raise CommError(f"no message from {who} within {conn.gettimeout():.0f}s (is it stuck?)") from exc
        except OSError as exc:
            raise CommError(f"lost the connection to {who}: {exc}") from exc
        if not chunk:
            raise CommError(f"{who} closed the connection (did it die?)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_frame(conn: socket.socket, payload: bytes) -> None:
    """Send a length-prefixed byte string (used for the rendezvous handshake)."""
    try:
        conn.sendall(struct.pack("!I", len(payload)) + payload)
    except OSError as exc:
        raise CommError(f"lost a connection during the rendezvous: {exc}") from exc


def recv_frame(conn: socket.socket, who: str) -> bytes:
    """Receive a length-prefixed byte string."""
    (size,) = struct.unpack("!I", recv_exact(conn, 4, who))
    return recv_exact(conn, size, who)


# ---------------------------------------------------------------------------------------------------- checkpoints

PLAN_KEYS = ("seed", "batch_size", "steps_per_epoch", "hidden")  # must match for a resume to be exact


def save_state(uri: str, step: int, flat: np.ndarray, velocity: np.ndarray, plan: dict[str, Any]) -> None:
    """Rank 0: write one complete checkpoint (parameters, momentum, step) through the runtime helper."""
    with save_checkpoint(uri, step) as folder:
        write_npz(folder / "state.npz", {"params": flat, "velocity": velocity})
        write_json(folder / "meta.json", {"step": step, **plan})


def load_state(resume_from: str, plan: dict[str, Any]) -> tuple[int, np.ndarray, np.ndarray]:
    """Every rank: restore a checkpoint, checking it was made with the same batch plan."""
    try:
        folder = restore_checkpoint(resume_from)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: cannot resume: {exc}") from None
    meta = json.loads((folder / "meta.json").read_text())
    for key in PLAN_KEYS:
        if meta.get(key) != plan[key]:
            raise SystemExit(
                f"error: checkpoint {resume_from} was made with {key}={meta.get(key)!r}, this run has {plan[key]!r}"
            )
    with np.load(folder / "state.npz") as state:
        return int(meta["step"]), state["params"].copy(), state["velocity"].copy()


# ----------------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="--data and --out accept file:// URIs or plain paths (s3:// is not supported for data by this "
        "example); checkpoints go through gpu_provider.runtime, so GPU_PROVIDER_CHECKPOINT_URI may be file:// or "
        "s3://. Exit codes: 0 done, 143 stopped on request (checkpoint saved), 1 error (e.g. a peer died).",
    )
    parser.add_argument("--data", required=True, help="folder with train.npz (and test.npz) from the preprocess stage")
    parser.add_argument("--out", required=True, help="folder for model.npz and metrics.json")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="default: every full batch of the data")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and batch order (default: %(default)s)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps; 0: only on stop (default: 20)")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (demo pacing)")
    parser.add_argument("--comm-timeout", type=float, default=120.0, help="rendezvous and per-message timeout, s")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.steps_per_epoch < 0 or args.checkpoint_every < 0:
        parser.error("--epochs and --batch-size must be positive; --steps-per-epoch and --checkpoint-every >= 0")
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env = job_env()
    except ValueError as exc:
        raise SystemExit(f"error: bad job environment: {exc}") from None
    rank, world = env.node_rank, env.nnodes
    stop = install_stop_handler()

    x, y = load_split(uri_to_path(args.data), "train")
    n_rows, n_features = x.shape
    steps_per_epoch = args.steps_per_epoch or n_rows // args.batch_size
    if steps_per_epoch * args.batch_size > n_rows or args.batch_size < world:
        raise SystemExit(
            f"error: {steps_per_epoch} steps x batch {args.batch_size} do not fit {n_rows} rows "
            f"split over {world} rank(s)"
        )
    total_steps = args.epochs * steps_per_epoch
    plan = {"seed": args.seed, "batch_size": args.batch_size, "steps_per_epoch": steps_per_epoch, "hidden": HIDDEN}

    # the newest checkpoint in the store, not only the one named at submission: a service that restarts
    # the job inside one attempt (SageMaker managed spot, Kubernetes) keeps the submit-time hint
    resume_from = resume_checkpoint(env)
    if resume_from:
        step, flat, velocity = load_state(resume_from, plan)
        name = resume_from.rstrip("/").rsplit("/", 1)[-1]
        log(rank, f"resumed from checkpoint {name} (step {step} of {total_steps})")
    else:
        step, flat = 0, init_params(n_features, args.seed)
        velocity = np.zeros_like(flat)
        log(rank, f"starting from step 0 (no checkpoint), {total_steps} steps")
    if env.checkpoint_uri is None and rank == 0:
        log(rank, "GPU_PROVIDER_CHECKPOINT_URI is not set: no checkpoints will be written")

    hello = {**plan, "world": world, "start_step": step, "total_steps": total_steps, "lr": args.lr}
    try:
        comm = Collective.rendezvous(rank, world, env.master_addr, env.master_port, hello, args.comm_timeout, stop)
        # On spot capacity, also watch for the EC2 interruption notice (about two minutes before the SIGTERM).
        watch = SpotInterruptionWatcher(stop) if env.capacity == "spot" else contextlib.nullcontext()
        with watch:
            stopped = train(args, env.checkpoint_uri, comm, stop, x, y, step, flat, velocity, plan, total_steps)
    except CommError as exc:
        print(f"[rank {rank}] error: {exc}", file=sys.stderr, flush=True)
        return 1
    comm.close()
    if stopped:
        return EXIT_STOPPED
    if rank == 0:
        finish(args, flat, x, y, total_steps, world)
    else:
        log(rank, f"done: {total_steps} steps")
    return 0


def train(
    args: argparse.Namespace,
    checkpoint_uri: str | None,
    comm: Collective,
    stop: StopFlag,
    x: np.ndarray,
    y: np.ndarray,
    step: int,
    flat: np.ndarray,
    velocity: np.ndarray,
    plan: dict[str, Any],
    total_steps: int,
) -> bool:
    """Run the steps from ``step`` to ``total_steps``, updating ``flat`` and ``velocity`` in place.

    Returns True when the ranks stopped on request (after rank 0 saved a checkpoint), False when training finished.
    """
    rank, world, batch = comm.rank, comm.world, args.batch_size
    steps_per_epoch = plan["steps_per_epoch"]
    log_every = max(1, total_steps // 10)
    order, order_epoch = np.empty(0, dtype=np.int64), -1
    while step < total_steps:
        epoch, index = divmod(step, steps_per_epoch)
        if epoch != order_epoch:
            order, order_epoch = batch_indices(args.seed, epoch, len(x)), epoch
        shard = np.array_split(order[index * batch : (index + 1) * batch], world)[rank]
        loss, correct, grad = loss_and_grad(flat, x[shard], y[shard])

        # One message per step: the gradient sum, the loss and accuracy sums, and this rank's stop flag.
        local = np.concatenate([grad, [loss, correct, 1.0 if stop.requested else 0.0]])
        total = comm.allreduce_sum(step, local)
        velocity *= MOMENTUM
        velocity -= args.lr * (total[:-3] / batch)
        flat += velocity
        step += 1

        if rank == 0 and (step % log_every == 0 or step == total_steps):
            log(
                rank,
                f"step {step}/{total_steps} (epoch {epoch + 1}/{args.epochs}): "
                f"batch loss {total[-3] / batch:.4f}, batch accuracy {total[-2] / batch:.3f}",
            )
        # Some rank was asked to stop: all stop after this step (after the last step, just finish).
        if total[-1] > 0 and step < total_steps:
            if stop.requested:
                log(rank, f"stop requested: {stop.reason}")
            if checkpoint_uri is None:
                log(rank, f"stop requested at step {step}: no checkpoint location, exiting")
                return True
            if rank == 0:
                save_state(checkpoint_uri, step, flat, velocity, plan)
            comm.barrier(step)  # nobody exits before the checkpoint is complete
            log(rank, f"stop requested at step {step}: checkpoint saved, exiting")
            return True
        periodic = args.checkpoint_every and step % args.checkpoint_every == 0 and step < total_steps
        if rank == 0 and checkpoint_uri and periodic:
            save_state(checkpoint_uri, step, flat, velocity, plan)
        if args.step_delay:
            time.sleep(args.step_delay)
    return False


def finish(args: argparse.Namespace, flat: np.ndarray, x: np.ndarray, y: np.ndarray, steps: int, world: int) -> None:
    """Rank 0: evaluate, write ``model.npz`` and ``metrics.json``, print a summary and declare the output."""
    loss, correct, _ = loss_and_grad(flat, x, y)
    metrics: dict[str, Any] = {
        "steps": steps,
        "epochs": args.epochs,
        "nnodes": world,
        "final_loss": loss / len(x),
        "train_accuracy": correct / len(x),
    }
    data_dir = uri_to_path(args.data)
    if (data_dir / "test.npz").exists():
        x_test, y_test = load_split(data_dir, "test")
        _, test_correct, _ = loss_and_grad(flat, x_test, y_test)
        metrics["test_accuracy"] = test_correct / len(x_test)
    out = uri_to_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_npz(out / "model.npz", unpack(flat, x.shape[1]))
    write_json(out / "metrics.json", metrics)
    summary = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
    log(0, f"done: {summary}; model written to {out / 'model.npz'}")
    declare_output(as_uri(args.out))


if __name__ == "__main__":
    sys.exit(main())
