"""Example pipeline, stage 3: batch inference with the trained model.

Loads ``model.npz`` written by ``train`` (w1, b1, w2, b2 of the 16 -> 32 tanh -> 1 network) and ``test.npz``
written by ``preprocess``, and writes::

    <out>/predictions.npy   int8 (n,): the predicted class, 0 or 1, per test row
    <out>/metrics.json      rows, accuracy, log loss, predicted positive rate

Usage::

    python -m gpu_provider.examples.infer --model file:///tmp/pipeline/model --data file:///tmp/pipeline/data \\
        --out file:///tmp/pipeline/predictions

Needs only numpy (the ``examples`` extra), the standard library and ``gpu_provider.runtime``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpu_provider.examples._common import as_uri, np, uri_to_path, write_json
from gpu_provider.runtime import declare_output


def predict_logits(model: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The network's output logits for the rows of ``x`` (the same forward pass as in ``train``)."""
    hidden = np.tanh(x @ model["w1"] + model["b1"])
    logits: np.ndarray = hidden @ model["w2"] + model["b2"][0]
    return logits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="--model, --data and --out accept file:// URIs or plain paths (s3:// is not supported by this example).",
    )
    parser.add_argument("--model", required=True, help="folder with model.npz from the train stage")
    parser.add_argument("--data", required=True, help="folder with test.npz from the preprocess stage")
    parser.add_argument("--out", required=True, help="folder for predictions.npy and metrics.json")
    args = parser.parse_args(argv)

    with np.load(uri_to_path(args.model) / "model.npz") as archive:
        model = {name: archive[name] for name in ("w1", "b1", "w2", "b2")}
    with np.load(uri_to_path(args.data) / "test.npz") as archive:
        x, y = archive["X"].astype(np.float64), archive["y"].astype(np.float64)

    logits = predict_logits(model, x)
    predictions = (logits > 0).astype(np.int8)
    metrics: dict[str, Any] = {
        "rows": len(x),
        "accuracy": float(np.mean(predictions == y)),
        "log_loss": float(np.mean(np.logaddexp(0.0, logits) - y * logits)),
        "predicted_positive_rate": float(predictions.mean()),
    }

    out = uri_to_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "predictions.npy.tmp"
    with tmp.open("wb") as stream:  # write, then rename: readers never see a half-written file
        np.save(stream, predictions)
    os.replace(tmp, out / "predictions.npy")
    write_json(out / "metrics.json", metrics)

    print(
        f"infer: {metrics['rows']} rows, accuracy {metrics['accuracy']:.4f}, log loss {metrics['log_loss']:.4f}, "
        f"predicted positive rate {metrics['predicted_positive_rate']:.3f}; written to {out}"
    )
    declare_output(as_uri(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
