"""Entry wrapper that normalises the rendezvous variables, then runs the job's command in their place.

Use it as the container's command (or in front of ``torchrun``) on any backend::

    python -m gpu_provider.runtime.launch -- torchrun --nnodes "$NNODES" ... train.py

It reads the environment with :func:`~gpu_provider.runtime.job_env` (AWS Batch multi-node,
SageMaker hosts, Kubernetes indexed Jobs, our own variables), writes ``NNODES``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` into the command's environment, and replaces itself with the
command (``exec``), so signals reach the command directly and its exit status is the job's.
Shell-style parameters such as ``"$NNODES"`` must be expanded by a shell *after* this wrapper, e.g.
``... launch -- sh -c 'torchrun --nnodes "$NNODES" ...'``.

Exit status when the command cannot be started: 2 for a usage or environment error, 127 when the
command is not found, 126 when it cannot be executed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gpu_provider.runtime.env import export_torchrun_env, job_env

USAGE = "usage: python -m gpu_provider.runtime.launch -- <command> [args...]"
_PREFIX = "gpu_provider.runtime.launch"


def main(argv: Sequence[str] | None = None) -> int:
    """Normalise the environment and ``exec`` the command; returns only when the command cannot start.

    :param argv: the arguments after the module name; ``sys.argv[1:]`` when ``None``. A leading
        ``--`` separates the command from this wrapper and is dropped.
    :return: 2, 126 or 127 as described in the module documentation.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    elif args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if not args:
        print(USAGE, file=sys.stderr)
        return 2

    try:
        env = job_env()
    except ValueError as exc:
        print(f"{_PREFIX}: bad job environment: {exc}", file=sys.stderr)
        return 2
    rendezvous = export_torchrun_env(env)
    child_env = {**os.environ, **rendezvous}
    print(f"{_PREFIX}: " + " ".join(f"{k}={v}" for k, v in rendezvous.items()), file=sys.stderr)

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, child_env)
    except FileNotFoundError:
        print(f"{_PREFIX}: command not found: {args[0]!r}", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"{_PREFIX}: cannot execute {args[0]!r}: {exc}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main())
