"""Jinja filters the provider adds to its operators' and sensors' templates.

``GpuJobOperator``, ``CheckpointSensor`` and ``GpuJobSensor`` render their templated fields with these
filters available, so a DAG needs no ``user_defined_filters`` for them; another operator's fields can
use them through ``DAG(user_defined_filters=TEMPLATE_FILTERS)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def path_segment(text: Any) -> str:
    """``text`` as one storage-safe folder or key name: letters, digits, ``_`` and ``-`` only.

    Run ids hold ``:`` and ``+`` (``scheduled__2026-03-02T00:00:00+00:00``), which S3 keys and URIs
    handle badly, and are chosen by whoever triggers a run, so they may hold ``/`` or ``..``. ``:``
    becomes ``-``, everything else outside the safe set ``_``:
    ``{{ run_id | path_segment }}`` -> ``scheduled__2026-03-02T00-00-00_00-00``.
    """
    return _UNSAFE.sub("_", str(text).replace(":", "-"))


#: the filters by name, for ``DAG(user_defined_filters=...)``
TEMPLATE_FILTERS: dict[str, Callable[..., str]] = {"path_segment": path_segment}


def add_filters(env: Any) -> Any:
    """Add :data:`TEMPLATE_FILTERS` to a Jinja environment (a DAG's own filters of the same name win)."""
    for name, function in TEMPLATE_FILTERS.items():
        env.filters.setdefault(name, function)
    return env
