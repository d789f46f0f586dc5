"""Contract: logs read from an opaque cursor, in bounded chunks, across every stream of an attempt."""

from __future__ import annotations

import re
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import POLL_S, BackendWorld, drain_logs, marked, poll_one

LINES_PER_NODE = 25
MAX_BYTES = 300
LINE = re.compile(r"contract-line r=(\d+) i=(\d+) ")


def log_job(folder: Path, nodes: int) -> tuple[str, ...]:
    """Every node prints its lines while the others print theirs; the main node (rank 0) ends last, once every other
    node has written ``<folder>/done/<rank>`` after its lines (at most 60 s), as Batch stops the other nodes of a
    multi-node job once the main node exits: on a loaded machine the second node started 1.5 s after the first.
    A script file (every world runs its jobs on this machine): SageMaker takes 256 characters per argument."""
    script, done = folder / "log_job.py", folder / "done"
    done.mkdir()
    script.write_text(
        textwrap.dedent(
            f"""
            import os, pathlib, sys, time
            rank, done = os.environ['NODE_RANK'], pathlib.Path(sys.argv[1])
            for i in range({LINES_PER_NODE}):
                print(f'contract-line r={{rank}} i={{i}} ' + 'x' * 24, flush=True)
                time.sleep(0.02)
            done.joinpath(rank).touch()
            deadline = time.monotonic() + 60
            while rank == '0' and len(list(done.iterdir())) < int(sys.argv[2]) and time.monotonic() < deadline:
                time.sleep(0.05)
            """
        )
    )
    return (sys.executable, str(script), str(done), str(nodes))


def test_logs_from_a_cursor_bring_every_line_of_every_node_once(world: BackendWorld, tmp_path: Path) -> None:
    backend = world.backend()
    nodes = 2 if world.backend_class().capabilities.multi_node else 1
    handle = backend.submit(world.request("logs", log_job(tmp_path, nodes), nodes=nodes))
    expected = {(str(r), str(i)) for r in range(nodes) for i in range(LINES_PER_NODE)}

    # one reader follows the job while it runs, keeping nothing but the cursor between reads
    lines: list[str] = []
    cursor: str | None = None
    deadline = time.monotonic() + 40
    while True:
        chunks, cursor = drain_logs(backend, handle, cursor, max_bytes=MAX_BYTES)
        for chunk in chunks:
            size = sum(len(line.encode()) + 1 for line in chunk.lines)
            longest = max((len(line.encode()) + 1 for line in chunk.lines), default=0)
            assert size <= MAX_BYTES + longest, f"a chunk of {size} bytes for max_bytes={MAX_BYTES}: {chunk}"
            lines += chunk.lines
        seen = {m.groups() for m in marked(lines, LINE)}
        if seen >= expected and poll_one(backend, handle).state.terminal:
            break
        assert time.monotonic() < deadline, f"after 40 s the reader has {len(seen)} of {len(expected)} lines"
        time.sleep(POLL_S)  # the interval between two reads of a running job's log

    assert poll_one(backend, handle).state is JobState.SUCCEEDED
    _assert_each_once_in_order(marked(lines, LINE), expected)

    # a second reader, starting from None, reads it all again: the cursor is the only state
    chunks, _ = drain_logs(world.backend(), handle, None, max_bytes=MAX_BYTES)
    assert len(chunks) > 1 and chunks[0].more, f"{len(expected)} lines fit no {MAX_BYTES}-byte read: {chunks[:2]}"
    again = [line for chunk in chunks for line in chunk.lines]
    _assert_each_once_in_order(marked(again, LINE), expected)


def _assert_each_once_in_order(matches: list[re.Match[str]], expected: set[tuple[str, str]]) -> None:
    counts = Counter(m.groups() for m in matches)
    assert set(counts) == expected, f"missing {sorted(expected - set(counts))}, extra {sorted(set(counts) - expected)}"
    assert all(n == 1 for n in counts.values()), f"lines read more than once: {[k for k, n in counts.items() if n > 1]}"
    for rank in {r for r, _ in expected}:
        order = [int(i) for r, i in (m.groups() for m in matches) if r == rank]
        assert order == sorted(order), f"node {rank}'s lines out of order: {order}"
