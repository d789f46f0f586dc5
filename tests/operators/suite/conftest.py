"""Fixture ``world``: every operator test runs once per backend world (see ``worlds.py``).

A remote world starts its session's emulator only when one of its tests runs, so ``-k local`` needs
no moto server nor fake API server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operators.suite.worlds import OPERATOR_WORLDS, OperatorWorld


@pytest.fixture(params=list(OPERATOR_WORLDS))
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OperatorWorld]:
    """One backend and its emulator for an operator test; whatever the test left running is stopped after it."""
    built = OPERATOR_WORLDS[request.param].create(request, tmp_path)
    assert isinstance(built, OperatorWorld)
    try:
        yield built
    finally:
        built.cleanup()
