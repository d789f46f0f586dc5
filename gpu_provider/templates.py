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


class WithTemplateFilters:
    """Mixin (before ``BaseOperator``) giving an operator's templates :data:`TEMPLATE_FILTERS`.

    Airflow's task runner renders with the DAG's environment, mapped tasks through
    ``_do_render_template_fields`` of the unmapped task: the filters are added there, and in
    ``get_template_env`` for direct ``render_template`` calls.
    """

    def get_template_env(self, dag: Any = None) -> Any:
        return add_filters(super().get_template_env(dag))  # type: ignore[misc]

    def _do_render_template_fields(
        self, parent: Any, template_fields: Any, context: Any, jinja_env: Any, seen_oids: set[int]
    ) -> None:
        add_filters(jinja_env)
        super()._do_render_template_fields(parent, template_fields, context, jinja_env, seen_oids)  # type: ignore[misc]
