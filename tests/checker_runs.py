"""Several runs of the checker (``gpu-provider check ...``) made in one process, each with its own status,
stdout and stderr, for tests that check many DAG files: Airflow is imported once, not once per run.

Each run calls ``gpu_provider.cli.main`` (what the ``gpu-provider`` script calls) with ``check`` and the run's
arguments. An exit or an exception that escapes ends the run as the interpreter would end the script: the
exit's message or the traceback on stderr, status 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = ["PROCESS", "Checked", "run_checks"]

#: the key of what the runs wrote to the process's own stdout and stderr, not to their captured streams (log
#: lines: Airflow's handlers write to the streams of the start); a run's traceback logged there shows here
PROCESS = "(the process)"


class Checked(NamedTuple):
    """One checker run: as ``subprocess.run`` would have given it."""

    returncode: int
    stdout: str
    stderr: str


_RUNNER = r"""
import contextlib, io, json, sys, traceback
from gpu_provider.cli import main

results = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["check", *argv])
        except SystemExit as stop:
            code = stop.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results[name] = [code or 0, out.getvalue(), err.getvalue()]
with open(sys.argv[2], "w") as written:
    json.dump(results, written)
"""


def run_checks(runs: dict[str, list[str]], folder: Path, env: dict[str, str] | None = None) -> dict[str, Checked]:
    """Run ``gpu-provider check ARGS`` for each named ``ARGS`` of ``runs`` in one child process (environment
    ``env``, default this process's); each run's result by its name, and under :data:`PROCESS` the process's
    own output. ``folder`` receives the results file."""
    results = folder / "checker-results.json"
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(runs), str(results)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ) if env is None else env,
    )
    assert done.returncode == 0 and results.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    checked = {name: Checked(*result) for name, result in json.loads(results.read_text()).items()}
    # every run's log lines: log handlers keep the streams they were given, not the captured ones
    checked[PROCESS] = Checked(done.returncode, done.stdout, done.stderr)
    return checked
