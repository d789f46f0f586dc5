"""The benchmarks' measuring parts on tiny inputs (the figures themselves are never asserted: see benchmarks/)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.parse_cost import child_env, measure, table
from benchmarks.recovery import steps_of


def test_the_parse_benchmark_measures_each_case_in_a_fresh_process(tmp_path: Path) -> None:
    cases = {"floor": "import json", "more": "import json, email.mime.text, urllib.request"}
    samples = measure(cases, 1, child_env(str(tmp_path)), floor="import json")
    assert set(samples) == {"floor", "more"}
    floor, more = samples["floor"][0], samples["more"][0]
    assert more.modules > floor.modules  # counted in the child, not in this process
    assert floor.wall > 0 and floor.cpu > 0 and floor.heavy == []
    # what each case adds on top of the floor's import, timed inside: nothing for the floor itself
    assert more.own_cpu > floor.own_cpu >= 0 and more.own > floor.own
    lines = table(samples, "floor")
    assert lines[2].startswith("| floor | ") and "| 1.000 |" in lines[2]
    assert lines[3].startswith("| more | ") and f"| {more.modules} | +{more.modules - floor.modules} |" in lines[3]


def test_the_recovery_benchmark_reads_where_each_training_job_started_and_stopped() -> None:
    fresh = [
        "[rank 0] starting from step 0 (no checkpoint), 200 steps",
        "[rank 0] step 20/200 (epoch 1/4): batch loss 0.6, batch accuracy 0.7",
        "[rank 0] step 40/200 (epoch 1/4): batch loss 0.5, batch accuracy 0.8",
        "[rank 0] stop requested: SIGTERM",
        "[rank 0] stop requested at step 47: checkpoint saved, exiting",
    ]
    resumed = [
        "[rank 0] resumed from checkpoint step-00000047 (step 47 of 200)",
        "[rank 0] step 60/200 (epoch 2/4): batch loss 0.4, batch accuracy 0.8",
        "[rank 0] done: 200 steps",
    ]
    killed = ["[rank 0] starting from step 0 (no checkpoint), 200 steps", "[rank 0] step 40/200 (epoch 1/4): x"]
    assert steps_of(fresh) == (0, 47)
    assert steps_of(resumed) == (47, 200)
    assert steps_of(killed) == (0, 40)  # SIGKILL: the last progress line is all the log says


def test_the_latency_benchmarks_jobs_end_their_log_with_the_marker_unless_plain() -> None:
    """Figure 3's jobs run under the runtime helper, whose end-of-log marker ends our log reading at once;
    ``--plain`` jobs print none (ours then waits for quiet log reads)."""
    import subprocess

    from benchmarks.latency import job_command
    from gpu_provider.runtime.output import parse_end_of_log

    for plain, markers in ((False, 1), (True, 0)):
        lines = subprocess.run(job_command(0.0, plain), capture_output=True, text=True, check=True).stdout.splitlines()
        assert lines[0] == "started" and "finished" in lines
        ends = [end for end in map(parse_end_of_log, lines) if end is not None]
        assert len(ends) == markers
        assert all((end.node, end.nnodes, end.exit_code) == (0, 1, 0) for end in ends)


def test_the_launch_floor_benchmark_times_each_side_until_its_command_ran() -> None:
    """Figure 5b: one launch per side after the unmeasured ones, each timed to the mark its command wrote."""
    from benchmarks.launch_floor import measure as floor

    result = floor(1, pause=0.01)
    assert set(result) == {"popen", "handover", "ours"}
    for side, times in result.items():
        assert len(times) == 1 and 0 < times[0] < 10, (side, times)
