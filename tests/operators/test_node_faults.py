"""GPU hardware faults are not the job's fault: a multi-node local job whose node reports an Xid or an
NCCL watchdog timeout is resubmitted and resumed from its checkpoint, counted as a ``node_fault``;
the same fault again on the fresh attempt is the job's own error after all."""

from __future__ import annotations

import json

import pytest

from tests.harness import Harness

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
NCCL_WATCHDOG = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out."
)


def _dag(harness: Harness, dag_id: str, fault_text: str, attempts: str, *, deferrable: bool = False) -> object:
    out = harness.tmp / dag_id / "out"
    command = harness.toy_args(str(out), 6, 0.1, "--fault-on-attempts", attempts, "--fault-text", fault_text)
    return harness.write_dag(
        dag_id,
        f"""
        GpuJobOperator(
            task_id="job",
            backend=LocalBackend(state_dir={str(harness.state_dir)!r}, grace_period=2),
            command={command!r},
            resources=GpuResources(gpus=1, nodes=2),
            capacity=OnDemand(backoff=0, max_node_faults=2),
            checkpoint="file://{harness.tmp / dag_id / "ckpt"}",
            deferrable={deferrable},
            poll_interval=0.3,
        )
        """,
    )


@pytest.mark.parametrize(
    ("fault_text", "fault", "deferrable"),
    [(XID_79, "gpu_lost", False), (NCCL_WATCHDOG, "nccl_timeout", False), (XID_79, "gpu_lost", True)],
    ids=["xid", "nccl", "xid-deferrable"],
)
def test_a_gpu_fault_on_a_multi_node_job_is_resubmitted_and_resumed_not_the_job_s_error(
    harness: Harness, fault_text: str, fault: str, deferrable: bool
) -> None:
    dag_id = f"node_fault_{fault}_{'def' if deferrable else 'sync'}"
    run = harness.run(_dag(harness, dag_id, fault_text, "1", deferrable=deferrable), dag_id)
    task = run.task()
    assert task["state"] == "success", run.log[-3000:]
    assert task["try_number"] == 1, "a node fault is not an Airflow retry"
    first, second = task["xcom"]["attempts"]
    assert (first["state"], first["interruption"], first["fault"]) == ("FAILED", "node_fault", fault)
    assert "reported a GPU hardware fault" in first["reason"]
    assert second["state"] == "SUCCEEDED" and second["try_number"] == 1
    assert second["resume_from"].endswith("ckpt-0000000002"), "resumed from the checkpoint before the fault"
    assert f"A GPU hardware fault ({fault}), not the job's error; resubmitting on fresh hardware" in run.log
    history = json.loads((harness.tmp / dag_id / "out" / "result.json").read_text())["history"]
    assert [h["start"] for h in history] == [0, 2]


def test_the_same_fault_twice_on_fresh_hardware_is_the_job_s_own_error(harness: Harness) -> None:
    run = harness.run(_dag(harness, "node_fault_twice", XID_79, "1,2"), "node_fault_twice")
    task = run.task()
    assert task["state"] == "failed", run.log[-3000:]
    assert "The same GPU hardware fault (gpu_lost) ended attempt 1 too, on other hardware" in run.log
    assert "treated as the job's own error, not a node fault" in run.log
    assert "max_node_faults" not in run.log.split("ended attempt 1 too")[1][:300]
