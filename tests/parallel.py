"""Parallel runs of the suite (pytest-xdist, ``-n N --dist loadgroup``): tests that share a module-,
class- or package-scoped fixture run on one worker, so such a fixture (an `airflow standalone`, a
trained reference model, an emulator of its own) is built once, not once per worker.

Why not plain ``loadgroup``: xdist passes a test's group from the worker to the controller by
appending ``@group`` to the test's node id, and with pytest 9.2's structured node ids that suffix is
silently lost (pytest-xdist issue #1386): every test would be scheduled on its own. So this plugin
carries the groups itself: each worker writes ``{node id: group}`` to a file in a folder the
controller named, and the controller schedules with loadgroup's scheduler fed from that file.

A test's group: its explicit ``xdist_group`` marks (as xdist names them), else its module's path
when it uses a module- or class-scoped fixture, else its package's folder for a package-scoped one.
Registered for the whole suite by tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

_WORKERINPUT_KEY = "gpu_provider_groups_dir"
_GROUPS_DIR = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of a collected test, or None when it may run on any worker."""
    marked = set()
    for mark in item.iter_markers("xdist_group"):
        marked.add(str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")))
    if marked:
        return "_".join(sorted(marked))
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    scopes = {d.scope for name in info.names_closure for d in info.name2fixturedefs.get(name, ())}
    path = item.nodeid.split("::", 1)[0]
    if "package" in scopes:
        return path.rsplit("/", 1)[0]
    if scopes & {"module", "class"}:
        return path
    return None


# --- worker side -------------------------------------------------------------------------------


@pytest.hookimpl(trylast=True)  # after every other hook has reordered or deselected items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or _WORKERINPUT_KEY not in workerinput:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    folder = Path(workerinput[_WORKERINPUT_KEY])
    # written before this worker reports its collection, so the controller finds it when it schedules
    tmp = folder / f".{workerinput['workerid']}.json"
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, folder / f"{workerinput['workerid']}.json")


# --- controller side ---------------------------------------------------------------------------


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    config: pytest.Config = node.config
    if _GROUPS_DIR not in config.stash:
        config.stash[_GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="gpu-provider-xdist-groups-"))
    node.workerinput[_WORKERINPUT_KEY] = str(config.stash[_GROUPS_DIR])


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureScheduling(LoadGroupScheduling):  # type: ignore[misc]  # xdist is untyped here
        """loadgroup, with the groups the workers wrote (read once, when the first test is placed)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = {}
                folder = config.stash.get(_GROUPS_DIR, None)
                for path in sorted(folder.glob("gw*.json")) if folder is not None else []:
                    self._groups.update(json.loads(path.read_text()))
            group = self._groups.get(nodeid)
            return f"group:{group}" if group is not None else str(super()._split_scope(nodeid))

    return SharedFixtureScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_GROUPS_DIR, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
