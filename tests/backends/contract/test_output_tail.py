"""Contract: every backend says why a job failed: ``output_tail`` answers the last lines of a failed
job's output (the task's error quotes the last 20, see ``AttemptRunner.explain``), read from its end."""

from __future__ import annotations

import re

from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import BackendWorld, py, wait_ended
from tests.harness import wait_for

LINES = 60
TAIL = 20
LINE = re.compile(r"tail-line i=(\d+)\b")
FAILING_JOB = py(
    f"""
    import sys
    for i in range({LINES}):
        print(f'tail-line i={{i:03d}} ' + 'y' * 30, flush=True)
    print('Traceback: ModuleNotFoundError: No module named trainer_lib', flush=True)
    sys.exit(3)
    """
)


def test_a_failed_job_s_last_lines_come_from_the_end_of_its_output(world: BackendWorld) -> None:
    backend = world.backend()
    handle = backend.submit(world.request("tail", FAILING_JOB))
    status = wait_ended(backend, handle)
    assert status.state is JobState.FAILED, status

    # a service may deliver an ended job's last lines a little later (log_settle_s)
    tail: list[str] = []

    def complete() -> bool:
        tail[:] = backend.output_tail(handle, TAIL)
        return any("No module named trainer_lib" in line for line in tail)

    try:
        wait_for(complete, 20, f"the end of job {handle.job_id}'s output")
    except AssertionError as err:
        raise AssertionError(f"{err}; output_tail answered {tail}") from None
    assert len(tail) == TAIL, tail
    # the job's last lines in order, ending with its traceback (a backend may add its own words after,
    # as the local supervisor says how the job ended)
    numbers = [int(m.group(1)) for line in tail if (m := LINE.search(line))]
    assert numbers == list(range(LINES - len(numbers), LINES)) and len(numbers) >= TAIL - 4, tail
    last_job_line = max(i for i, line in enumerate(tail) if LINE.search(line))
    assert "No module named trainer_lib" in tail[last_job_line + 1], tail
    assert backend.output_tail(handle, 0) == []
