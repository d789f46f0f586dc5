"""Each backend's capabilities are declared once: the table of docs/how-to/write-a-gpu-task.md must agree."""

from __future__ import annotations

from pathlib import Path

from gpu_provider.backends.base import Capabilities, backend_class, registered_backends

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "write-a-gpu-task.md"


def _row(caps: Capabilities) -> list[str]:
    yes = {True: "yes", False: "no"}
    priorities = f"{caps.priority_range[0]}-{caps.priority_range[1]}" if caps.priority_range else "no"
    shortest = f"{caps.min_runtime_s:g} s" if caps.min_runtime_s else "-"
    return [
        yes[caps.multi_node],
        yes[caps.multi_node_spot],
        yes[caps.fractional_gpus],
        yes[caps.instance_types],
        yes[caps.image_required],
        yes[caps.restarts_inside_job],
        yes[caps.unique_names],
        priorities,
        shortest,
    ]


def test_the_docs_table_matches_every_backends_declared_capabilities() -> None:
    text = PAGE.read_text()
    section = text.split("## What each backend can run", 1)[1].split("\n\n", 3)[2]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    assert set(rows) == set(registered_backends())
    for name in registered_backends():
        assert rows[name] == _row(backend_class(name).capabilities), name
