"""Fixture ``world``: every contract test runs once per backend world (see ``worlds.py``).

The Batch world starts the session's Batch emulator only when a Batch test runs, so
``-k local`` needs no moto server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.contract.worlds import WORLDS, BackendWorld


@pytest.fixture(params=list(WORLDS))
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendWorld]:
    """One backend and its emulator, with fault knobs; whatever a test left running is stopped after it."""
    built = WORLDS[request.param].create(request, tmp_path)
    try:
        yield built
    finally:
        built.cleanup()
