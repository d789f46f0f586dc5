"""The example DAGs' side of the asset ``gpu_ml_pipeline_dataset``: which dataset a run takes.

``gpu_ml_pipeline``'s ``preprocess`` task publishes the asset with the dataset's URI in the event's extra
(``{"output_uri": ...}``). ``gpu_retrain_on_new_data`` and ``gpu_lr_sweep`` call :func:`pick_dataset` from
a task (never at parse time): the event that triggered the run, else the asset's latest event.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

#: the asset's name (``Asset("gpu_ml_pipeline_dataset")`` in the DAG files)
DATASET_ASSET = "gpu_ml_pipeline_dataset"


def dataset_folder(uri: Any) -> str:
    """``uri`` checked: a ``file://`` URI of an absolute folder named ``dataset`` (what preprocess writes),
    without ``..``; the example's job programs read and write local files only."""
    parts = urlsplit(str(uri))
    if (
        parts.scheme != "file"
        or parts.netloc
        or parts.query
        or parts.fragment
        or not parts.path.startswith("/")
        or ".." in parts.path.split("/")
        or not parts.path.rstrip("/").endswith("/dataset")
    ):
        raise ValueError(
            f"the asset event's output_uri {str(uri)[:200]!r} is not a file:// URI of a dataset folder written by "
            "gpu_ml_pipeline's preprocess (file:///<data root>/<week>/dataset)"
        )
    return str(uri).rstrip("/")


def pick_dataset(asset: Any, context: Mapping[str, Any]) -> dict[str, str]:
    """The dataset of the event of ``asset`` that triggered this run, else (a manual run) of its latest
    event: ``{"dataset": <uri>, "base": <the folder above it>}``. The task needs ``inlets=[asset]``."""
    triggering = context.get("triggering_asset_events") or {}
    events = list(triggering.get(asset) or []) if hasattr(triggering, "get") else []
    if not events:
        try:
            events = [context["inlet_events"][asset][-1]]
        except (IndexError, KeyError):
            raise ValueError(
                f"no dataset to train on: the asset {DATASET_ASSET} has no event yet. Run gpu_ml_pipeline first "
                "(its preprocess task publishes one)"
            ) from None
    found = dataset_folder((events[-1].extra or {}).get("output_uri"))
    return {"dataset": found, "base": found.rsplit("/", 1)[0]}
