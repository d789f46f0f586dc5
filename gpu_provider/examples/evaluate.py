"""Example pipeline, evaluation branch: evaluate every new checkpoint of a training run while it trains.

Runs next to the train stage. Every ``--poll-interval`` seconds it looks at the training run's
checkpoint folder and evaluates, on the test split, each complete checkpoint it has not evaluated
yet (oldest step first, up to the one ``LATEST`` names: a checkpoint being written is never read),
prints its test accuracy and log loss, and rewrites::

    <out>/evaluations.json   {"checkpoints": URI, "evaluations": [{"step", "checkpoint", "test_accuracy",
                              "test_log_loss"}, ...], "best": {...} | null, "training_finished": bool}

It stops once training has ended: the train stage writes ``metrics.json`` into its ``--out`` folder
(``--model`` here) as its very last file, after ``model.npz``. It then evaluates the checkpoints
written since its last look and exits 0. Everything it needs is under the data root, so it works
the same from a pip install, on the local backend and on a container backend that mounts the folder.
If training has not ended after ``--max-wait`` seconds (it failed, or waits for capacity for too
long), it writes what it has and exits 1 saying so.

A checkpoint the training run pruned before it was looked at (``Checkpoint(keep=...)``) is skipped,
and the log says so. Clearing the train task of a run that finished makes this program stop at once
(the old ``metrics.json`` is still there): clear the evaluation with it, or point it at a new run.

Usage::

    python -m gpu_provider.examples.evaluate --checkpoints file:///tmp/pipeline/checkpoints \\
        --data file:///tmp/pipeline/data --model file:///tmp/pipeline/model --out file:///tmp/pipeline/evaluations \\
        [--from-step 0] [--poll-interval 2] [--max-wait 7200]

Needs only numpy (the ``examples`` extra), the standard library and ``gpu_provider.runtime``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from gpu_provider.examples._common import as_uri, np, uri_to_path, write_json
from gpu_provider.examples.train import load_split, loss_and_grad
from gpu_provider.runtime import checkpoint_step, declare_output, latest_checkpoint, restore_checkpoint

#: the file the train stage writes last into its --out folder: training has ended once it exists
TRAINING_DONE = "metrics.json"
EXIT_TRAINING_NOT_DONE = 1
_CHECKPOINT = re.compile(r"ckpt-[0-9]+")


def published(checkpoints: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in the folder, oldest step first, up to the step ``LATEST`` names (none without it)."""
    newest = latest_checkpoint(checkpoints.as_uri()) if checkpoints.is_dir() else None
    if newest is None:
        return []
    bound = checkpoint_step(newest.rsplit("/", 1)[-1])
    found = []
    for path in checkpoints.iterdir():  # ``.tmp-`` folders being written do not match
        step = checkpoint_step(path.name) if _CHECKPOINT.fullmatch(path.name) else None
        if step is not None and bound is not None and step <= bound and path.is_dir():
            found.append((step, path))
    return sorted(found)


def published_on_s3(uri: str) -> list[tuple[int, Path]]:
    """On ``s3://`` (training on SageMaker): the checkpoint ``LATEST`` names, downloaded; only the newest
    is evaluated at each look (a checkpoint pruned meanwhile is skipped, as on file://)."""
    newest = latest_checkpoint(uri)
    step = checkpoint_step(newest.rsplit("/", 1)[-1]) if newest else None
    if newest is None or step is None:
        return []
    try:
        return [(step, restore_checkpoint(newest))]
    except FileNotFoundError:
        return []


def evaluate(folder: Path, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Test accuracy and mean log loss of the parameters saved in one checkpoint folder."""
    with np.load(folder / "state.npz") as state:
        flat = state["params"].copy()
    loss, correct, _ = loss_and_grad(flat, x, y)
    return {"test_accuracy": correct / len(x), "test_log_loss": loss / len(x)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="--checkpoints, --data, --model and --out accept file:// URIs or plain paths (--checkpoints also s3://, "
        "where the newest checkpoint is evaluated at each look; s3:// is not supported otherwise "
        f"by this example). Exit codes: 0 training ended and every checkpoint seen was evaluated, "
        f"{EXIT_TRAINING_NOT_DONE} training did not end within --max-wait.",
    )
    parser.add_argument("--checkpoints", required=True, help="the training run's checkpoint folder")
    parser.add_argument("--data", required=True, help="folder with test.npz from the preprocess stage")
    parser.add_argument(
        "--model", required=True, help="the train stage's --out folder (its metrics.json ends the wait)"
    )
    parser.add_argument("--out", required=True, help="folder for evaluations.json")
    parser.add_argument("--from-step", type=int, default=0, help="evaluate only checkpoints at this step or later")
    parser.add_argument("--poll-interval", type=float, default=2.0, help="seconds between looks (default: 2)")
    parser.add_argument("--max-wait", type=float, default=7200.0, help="seconds to wait for training to end")
    args = parser.parse_args(argv)
    if args.from_step < 0 or not 0 < args.poll_interval <= 3600 or args.max_wait <= 0:
        parser.error("--from-step must be >= 0, --poll-interval in (0, 3600], --max-wait > 0")

    on_s3 = args.checkpoints.startswith("s3://")
    checkpoints = Path(args.checkpoints) if on_s3 else uri_to_path(args.checkpoints)
    model, out = uri_to_path(args.model), uri_to_path(args.out)
    x, y = load_split(uri_to_path(args.data), "test")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "checkpoints": as_uri(args.checkpoints),
        "evaluations": [],
        "best": None,
        "training_finished": False,
    }
    last = args.from_step - 1
    deadline = time.monotonic() + args.max_wait
    print(f"evaluate: watching {checkpoints} for checkpoints from step {args.from_step}", flush=True)
    while True:
        # read before looking at the checkpoints: every checkpoint training wrote before it ended is then seen below
        finished = (model / TRAINING_DONE).exists()
        for step, folder in published_on_s3(args.checkpoints) if on_s3 else published(checkpoints):
            if step <= last:
                continue
            try:
                metrics = evaluate(folder, x, y)
            except FileNotFoundError:  # pruned by the training run between the listing and the read
                print(f"evaluate: step {step} ({folder.name}) was removed before it could be read; skipped", flush=True)
                continue
            last = step
            entry = {"step": step, "checkpoint": as_uri(str(folder)), **metrics}
            report["evaluations"].append(entry)
            if report["best"] is None or metrics["test_accuracy"] > report["best"]["test_accuracy"]:
                report["best"] = entry
            write_json(out / "evaluations.json", report)
            print(
                f"evaluate: step {step} ({folder.name}): test accuracy {metrics['test_accuracy']:.4f}, "
                f"log loss {metrics['test_log_loss']:.4f}",
                flush=True,
            )
        if finished:
            break
        if time.monotonic() > deadline:
            write_json(out / "evaluations.json", report)
            print(
                f"evaluate: error: training did not end within {args.max_wait:g}s ({model / TRAINING_DONE} "
                f"does not exist); {len(report['evaluations'])} checkpoint(s) evaluated",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_TRAINING_NOT_DONE
        time.sleep(args.poll_interval)

    report["training_finished"] = True
    write_json(out / "evaluations.json", report)
    best = report["best"]
    summary = (
        f"best step {best['step']}, test accuracy {best['test_accuracy']:.4f}" if best else "no checkpoint to evaluate"
    )
    print(f"evaluate: training ended; {len(report['evaluations'])} checkpoint(s) evaluated, {summary}", flush=True)
    declare_output(as_uri(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
