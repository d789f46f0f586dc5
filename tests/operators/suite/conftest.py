"""Fixture ``world``: every operator test runs once per backend world (see ``worlds.py``).

A remote world starts its session's emulator only when one of its tests runs, so ``-k local`` needs
no moto server nor fake API server.
"""

from __future__ import annotations

from tests.operators.suite.worlds import operator_world

__all__ = ["operator_world"]  # fixture "world"
