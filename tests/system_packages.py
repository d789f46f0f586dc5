"""Debian packages that some tests need (a headless browser, a PostgreSQL server), installed by the
test setup when they are missing, so that `make test` on a fresh Debian machine needs nothing done by
hand. One install at a time across xdist workers (a file lock); each package is installed once.

Where they cannot be installed (not root, no apt-get, no package index reachable), `ensure` returns
the reason and the test skips with it: the feature is still built and tested wherever the packages
exist, and the reason says exactly what is missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

_LOCK = Path(tempfile.gettempdir()) / "gpu-provider-tests-apt.lock"
_INSTALL_TIMEOUT_S = 900


def installed(package: str) -> bool:
    """Whether dpkg knows `package` as installed."""
    if shutil.which("dpkg-query") is None:
        return False
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.strip().endswith("installed")


def ensure(packages: Iterable[str]) -> str | None:
    """Install the Debian `packages` that are missing; None when all are there, else why not."""
    wanted = list(packages)
    if all(installed(p) for p in wanted):
        return None
    if shutil.which("apt-get") is None:
        return f"Debian packages {wanted} are needed and this machine has no apt-get"
    if os.geteuid() != 0:
        return f"Debian packages {wanted} are needed: install them (apt-get install {' '.join(wanted)})"
    with _LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be installing the same packages
        missing = [p for p in wanted if not installed(p)]
        if not missing:
            return None
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        log: list[str] = []
        for command in (
            ["apt-get", "install", "-y", "--no-install-recommends", *missing],
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", *missing],
        ):
            if command[1] == "update" and all(installed(p) for p in missing):
                break
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False
            )
            log.append(f"$ {' '.join(command)} -> {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
        still = [p for p in missing if not installed(p)]
        if still:
            return f"could not install Debian packages {still}:\n" + "\n".join(log)
    return None
