"""The local backend's logs are complete and bounded: every line reaches ``job.log`` and ``logs()``,
memory stays small whatever the job prints, overlong lines come back cut."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_provider.backends.base import MAX_LOG_LINE_CHARS, JobHandle, JobState, LogChunk, TaskKey, clip_line
from gpu_provider.backends.local import LocalBackend
from tests.backends import test_local
from tests.backends.test_local import TASK, Local, job, wait_for

local = test_local.local  # the fixture: a LocalBackend in a temporary state dir, cleaned up after the test

MIB = 1 << 20


def drain(backend: LocalBackend, handle: JobHandle, cursor: str | None = None, **kwargs: int) -> list[LogChunk]:
    chunks = []
    for _ in range(10_000):
        chunk = backend.logs(handle, cursor, **kwargs)
        chunks.append(chunk)
        cursor = chunk.cursor
        if not chunk.more:
            return chunks
    raise AssertionError("logs() still said more=True after 10000 reads")


def vm_hwm_kib(pid: int) -> int:
    """The peak resident memory of a process (``VmHWM`` in ``/proc/<pid>/status``), in KiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    assert match, text
    return int(match.group(1))


def test_a_hundred_thousand_lines_all_come_back_in_bounded_chunks(local: Local) -> None:
    handle = local.submit(job("for i in range(100_000):\n    print(f'line {i:06d} ' + 'x' * 50)"))
    assert local.wait(handle, timeout=60).state is JobState.SUCCEEDED
    chunks = drain(local.backend, handle)
    assert len(chunks) > 5 and all(c.more for c in chunks[:-1])  # about 7 MB: several 1 MiB chunks
    for chunk in chunks:
        assert sum(len(line) + 1 for line in chunk.lines) < MIB + 200
    lines = [line for chunk in chunks for line in chunk.lines if line.startswith("[node 0] ")]
    assert lines == [f"[node 0] line {i:06d} " + "x" * 50 for i in range(100_000)]
    # a small max_bytes only makes more chunks; nothing is lost or repeated
    small = [line for c in drain(local.backend, handle, max_bytes=4096) for line in c.lines]
    assert small == [line for chunk in chunks for line in chunk.lines]


HUGE_LINE = """
    import os, sys, time
    # first wait for the supervisor's "started" line, so that no line of its own splits ours
    log = os.path.join(os.path.dirname(os.environ["GPU_PROVIDER_OUTPUT_FILE"]), "job.log")
    deadline = time.time() + 20
    while b"node(s) started" not in open(log, "rb").read() and time.time() < deadline:
        time.sleep(0.02)
    block = b"x" * (1 << 20)
    for _ in range(int(sys.argv[1])):
        sys.stdout.buffer.write(block)
    sys.stdout.buffer.flush()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
"""


@pytest.fixture
def huge_log(local: Local) -> Iterator[JobHandle]:
    """The 300 MiB line job; its log is deleted afterwards (pytest keeps recent temporary folders)."""
    handle = local.submit(job(HUGE_LINE, "300", str(local.tmp / "release")), max_runtime_s=120)
    try:
        yield handle
    finally:
        (Path(handle.extra["job_dir"]) / "job.log").unlink(missing_ok=True)


def test_a_300_mib_line_without_newline_costs_little_memory_and_loses_nothing(
    local: Local, huge_log: JobHandle
) -> None:
    mib, release, handle = 300, local.tmp / "release", huge_log
    log_file = Path(handle.extra["job_dir"]) / "job.log"
    prefix = b"[node 0] "
    started = b"[local] "  # the supervisor's own first line
    wait_for(
        "the whole line in job.log",
        lambda: log_file.exists() and log_file.stat().st_size >= mib * MIB + len(prefix),
        timeout=60,
        interval=0.2,
    )
    peak = vm_hwm_kib(local.supervisor_pid(handle))
    print(f"supervisor peak RSS with a {mib} MiB line in flight: {peak} KiB")
    assert peak < 64 * 1024, f"supervisor peak RSS {peak} KiB for a {mib} MiB line"
    release.touch()
    status = local.wait(handle, timeout=30)
    assert status.state is JobState.SUCCEEDED, status

    # every byte the job wrote is in job.log, as one line (closed with a newline at the end)
    with open(log_file, "rb") as fh:
        assert fh.readline().startswith(started)
        assert fh.read(len(prefix)) == prefix
        count = 0
        while True:
            block = fh.read(MIB)
            end = block.find(b"\n")
            count += len(block) if end < 0 else end
            assert set(block[: None if end < 0 else end]) <= {ord("x")}
            if end >= 0:
                break
    assert count == mib * MIB

    lines = [line for chunk in drain(local.backend, handle) for line in chunk.lines]
    cut = [line for line in lines if line.startswith("[node 0] ")]
    full = len(prefix) + mib * MIB
    assert cut == [
        "[node 0] "
        + "x" * (MAX_LOG_LINE_CHARS - len(prefix))
        + f" ... [line cut: {full - MAX_LOG_LINE_CHARS} more characters]"
    ]
    assert lines[-1] == "[local] job ended SUCCEEDED"


def test_cut_lines_read_like_clip_line_also_for_multibyte_text(local: Local) -> None:
    texts = ["a" * 20_000, "é" * 20_000, "€" * 100_000, "short é"]
    code = "import sys\nfor n, ch in [(20000, 'a'), (20000, 'é'), (100000, '€')]:\n    print(ch * n)\nprint('short é')"
    handle = local.submit(job(code))
    assert local.wait(handle).state is JobState.SUCCEEDED
    lines = [line for chunk in drain(local.backend, handle) for line in chunk.lines if line.startswith("[node 0] ")]
    assert lines == [clip_line("[node 0] " + text) for text in texts]
    # reading the 300 KB line from a tiny budget: the skip spans calls, the answer is the same
    tiny = [line for chunk in drain(local.backend, handle, max_bytes=1024) for line in chunk.lines]
    assert [line for line in tiny if line.startswith("[node 0] ")] == lines


TWO_WRITERS = """
    import os, sys, time
    rank = int(os.environ["NODE_RANK"])
    if rank == 0:
        for i in range(40):  # 40 x 10 KiB pieces of one 400 KiB line, written slowly
            sys.stdout.buffer.write(b"a" * 10240)
            sys.stdout.buffer.flush()
            time.sleep(0.01)
        sys.stdout.buffer.write(b"\\n")
    else:
        for i in range(200):
            print(f"rank1 line {i}", flush=True)
            time.sleep(0.002)
"""


def test_lines_of_concurrent_nodes_never_mix_and_no_byte_is_lost(local: Local) -> None:
    handle = local.submit(job(TWO_WRITERS), task=TaskKey(TASK.dag_id, "two", TASK.run_id), nodes=2)
    assert local.wait(handle, timeout=30).state is JobState.SUCCEEDED
    raw = (Path(handle.extra["job_dir"]) / "job.log").read_bytes().split(b"\n")
    assert raw[-1] == b""
    by_node: dict[bytes, bytearray] = {b"0": bytearray(), b"1": bytearray()}
    rank1 = []
    for line in raw[:-1]:
        if line.startswith(b"[local] "):
            continue
        match = re.match(rb"\[node ([01])\] (.*)$", line, re.S)
        assert match, line[:80]  # every line starts with its node's prefix
        by_node[match.group(1)] += match.group(2)
        if match.group(1) == b"1":
            rank1.append(match.group(2))
    assert by_node[b"0"] == b"a" * 409600  # node 0's long line, maybe in several pieces, complete
    assert rank1 == [f"rank1 line {i}".encode() for i in range(200)]
