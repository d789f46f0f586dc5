"""Fixtures for the example job programs' tests: a process launcher that cleans up, and a shared data set."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the helpers below, whatever pytest's import mode

from jobrun import Launcher

DATA_INTERVAL = ("2024-03-04T00:00:00+00:00", "2024-03-11T00:00:00+00:00")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    """Starts job programs; kills any still running when the test ends."""
    jobs = Launcher(tmp_path / "logs")
    yield jobs
    jobs.close()


@pytest.fixture(scope="session")
def session_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Like ``launcher``, for session-scoped fixtures."""
    jobs = Launcher(tmp_path_factory.mktemp("session-logs"))
    yield jobs
    jobs.close()


@pytest.fixture(scope="session")
def dataset(session_launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data set made by the preprocess stage (train.npz, test.npz, meta.json), shared by the read-only tests."""
    out = tmp_path_factory.mktemp("data")
    start, end = DATA_INTERVAL
    session_launcher.run("preprocess", ["--start", start, "--end", end, "--out", out.as_uri(), "--rows", "4000"])
    return out
