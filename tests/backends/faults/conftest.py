"""The fault suite: safety nets under stale, ambiguous or missing evidence, on every backend world.

Fixture ``world`` is the contract suite's (``tests/backends/contract/worlds.py``): every test here
that takes it runs once per backend (local, Batch, SageMaker, Kubernetes). The promise these tests
hold the provider to: nothing destructive on a guess, and no GPU billing for nobody.
"""

from __future__ import annotations

from tests.backends.contract.conftest import world

__all__ = ["world"]
