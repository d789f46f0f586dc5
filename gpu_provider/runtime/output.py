"""Tell the backend where the job put its output (a model, predictions, a report), and where a node's log ends."""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass

from gpu_provider.names import END_OF_LOG, ENV_OUTPUT_FILE

#: start of the line :func:`declare_output` prints; backends look for it in the job's logs
OUTPUT_LINE_PREFIX = "gpu_provider: output_uri="


def declare_output(uri: str) -> None:
    """Record the job's output location, for the backend to put into the task's result.

    Writes ``uri`` to the file named by ``GPU_PROVIDER_OUTPUT_FILE`` when that is set (atomically:
    a temporary file in the same folder, then a rename), and always prints one line
    ``gpu_provider: output_uri=<uri>`` to stdout, flushed, for backends that only see the logs.
    Calling it again replaces the recorded location.

    :param uri: where the output is, e.g. ``s3://bucket/models/run-42/``.
    :raises ValueError: ``uri`` is empty or spans several lines.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"output URI must be a non-empty string, got {uri!r}")
    if "\n" in uri or "\r" in uri:
        raise ValueError(f"output URI must be a single line, got {uri!r}")

    path = os.environ.get(ENV_OUTPUT_FILE, "").strip()
    if path:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        temp = os.path.join(directory, f".tmp-{os.path.basename(path)}-{secrets.token_hex(4)}")
        try:
            with open(temp, "w", encoding="utf-8") as handle:
                handle.write(uri)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise

    print(f"{OUTPUT_LINE_PREFIX}{uri}", flush=True)


@dataclass(frozen=True)
class EndOfLog:
    """One node's end-of-log marker: its rank, the job's node count and the command's exit status."""

    node: int
    nnodes: int
    exit_code: int
    fault: str | None = None
    """The GPU hardware fault the runtime helper saw in the node's output, when the command failed after it."""


#: the whole marker, at the end of a line (a backend may put a prefix such as ``[node 1] `` before it)
_END_OF_LOG = re.compile(
    re.escape(END_OF_LOG) + r" node=(\d{1,6}) nnodes=(\d{1,6}) exit=(-?\d{1,4})(?: fault=([a-z_]{1,32}))?\s*$"
)


def end_of_log_line(node: int, nnodes: int, exit_code: int, *, fault: str | None = None) -> str:
    """The marker line for ``node`` of ``nnodes`` whose command exited with ``exit_code`` (after the GPU
    hardware fault ``fault``, when the runtime helper saw one)."""
    return f"{END_OF_LOG} node={node} nnodes={nnodes} exit={exit_code}" + (f" fault={fault}" if fault else "")


def parse_end_of_log(line: str) -> EndOfLog | None:
    """The marker in ``line``, or ``None`` when the line is not one (or names a node outside the job)."""
    if END_OF_LOG not in line:
        return None
    found = _END_OF_LOG.search(line)
    if found is None:
        return None
    node, nnodes, code = int(found[1]), int(found[2]), int(found[3])
    if nnodes < 1 or node >= nnodes:
        return None
    return EndOfLog(node, nnodes, code, found[4])
