"""``GpuJobOperator.partial(...).expand(...)``: each map index its own job (its own name and ownership tags),
its own pool slots, and its own reattach after a worker crash; on the local backend and on AWS Batch."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from gpu_provider import names
from gpu_provider.backends.local.common import REQUEST_FILE
from gpu_provider.testing.dagrun import load_dags
from tests.batch_world import BatchWorld
from tests.harness import Harness, pid_alive, wait_for

SWEEP = 3


def _mapped_dag(harness: Harness, dag_id: str, backend_source: str, *, hold: Path | None = None) -> Path:
    """A sweep of ``SWEEP`` map indexes, each with its own output and PID folder (``expand_kwargs``)."""
    extra = ("--hold-until", str(hold)) if hold is not None else ()
    kwargs = [
        {
            "command": harness.toy_args(str(harness.tmp / f"out{i}"), 12, 0.1, *extra),
            "env": {"PID_DIR": str(harness.tmp / f"pids{i}")},
        }
        for i in range(SWEEP)
    ]
    return harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator.partial(
            task_id="sweep",
            backend={backend_source},
            image="trainer:1",
            team="research",
            resources=GpuResources(gpus=2),
            poll_interval=0.3,
            deferrable=False,
        ).expand_kwargs({kwargs!r})
        """,
    )


def _pids(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.pid")} if folder.exists() else set()


def test_a_mapped_task_holds_its_teams_pool_slots_per_map_index(harness: Harness) -> None:
    dag_file = _mapped_dag(harness, "mapped_pool", f"LocalBackend(state_dir={str(harness.state_dir)!r})")
    sweep = load_dags(dag_file)["mapped_pool"].get_task("sweep")
    # what the scheduler reads for every map index, before any __init__ runs
    assert (sweep.pool, sweep.pool_slots) == ("gpu_research", 2)
    assert sweep.weight_rule == "gpu_provider.plugins.priority.GpuDownstreamPriority"


def test_each_map_index_is_its_own_job_and_reattaches_to_its_own_after_a_crash(harness: Harness) -> None:
    release = harness.tmp / "release"
    dag_file = _mapped_dag(harness, "mapped_local", f"LocalBackend(state_dir={str(harness.state_dir)!r})", hold=release)
    worker, _, _ = harness.start(dag_file, "mapped_local")

    # dag.test runs the map indexes one at a time, in no fixed order: the first one's job runs (held after
    # its last step)
    def started() -> int | None:
        return next((i for i in range(SWEEP) if _pids(harness.tmp / f"pids{i}")), None)

    wait_for(lambda: started() is not None, 120, "a map index's job to start")
    first = started()
    assert first is not None
    job_pid = int((harness.tmp / f"pids{first}" / "1-0.pid").read_text())
    os.killpg(worker.pid, signal.SIGKILL)  # the worker dies; the job does not
    worker.wait(timeout=10)
    assert pid_alive(job_pid)
    assert [i for i in range(SWEEP) if _pids(harness.tmp / f"pids{i}")] == [first], "one map index ran so far"

    retry = harness.start(dag_file, "mapped_local")
    wait_for(lambda: "Reattached to local job" in retry[2].read_text(), 180, f"map index {first} to reattach")
    release.touch()
    run = harness.finish(*retry, timeout=300)
    assert run.state.endswith("success"), run.log[-4000:]
    assert run.log.count("Reattached to local job") == 1, f"only map index {first} had a job to reattach to"
    assert f"-m{first}-" in run.log.split("Reattached to local job", 1)[1].split("\n", 1)[0]
    tasks = [run[f"sweep[{i}]"] for i in range(SWEEP)]
    assert [t.state for t in tasks] == ["success"] * SWEEP
    assert [len(t.attempts) for t in tasks] == [1] * SWEEP
    # one job per map index, each ran once (the first map index's job was not submitted twice)
    assert [_pids(harness.tmp / f"pids{i}") for i in range(SWEEP)] == [{"1-0"}] * SWEEP
    job_names = [t.result["job_name"] for t in tasks]
    assert len(set(job_names)) == SWEEP and all(f"-m{i}-" in n for i, n in enumerate(job_names)), job_names
    # ownership: each job's request names its task instance, map index included (what reattach and the
    # reaper read)
    requests = [json.loads(p.read_text()) for p in harness.state_dir.rglob(REQUEST_FILE)]
    owners = sorted(r["task"]["map_index"] for r in requests if r["task"]["dag_id"] == "mapped_local")
    assert owners == list(range(SWEEP)), requests


def test_each_map_index_is_its_own_batch_job(harness: Harness, batch: BatchWorld) -> None:
    dag_file = _mapped_dag(harness, "mapped_batch", batch.backend_source())
    run = harness.run(dag_file, "mapped_batch", timeout=300)
    assert run.state.endswith("success"), run.log[-4000:]
    submits = [b for b in batch.bodies("SubmitJob") if b["jobName"].startswith("gp-mapped-batch-")]
    assert len(submits) == SWEEP, [b["jobName"] for b in submits]
    assert len({b["jobName"] for b in submits}) == SWEEP
    assert sorted(b["tags"][names.TAG_MAP_INDEX] for b in submits) == [str(i) for i in range(SWEEP)]
    results = [run[f"sweep[{i}]"].result for i in range(SWEEP)]
    assert {r["job_name"] for r in results} == {b["jobName"] for b in submits}
    assert all(_pids(harness.tmp / f"pids{i}") == {"1-0"} for i in range(SWEEP))
