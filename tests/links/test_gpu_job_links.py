"""The extra links: kept when the operator stored one, empty and quiet when it did not."""

from __future__ import annotations

from tests.batch_world import BatchWorld
from tests.harness import Harness


def stored_links(dag_id: str, run_id: str) -> dict[tuple[str, str], str]:
    """The link XComs of a run, by (task id, key), as the UI reads them."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key.like("_link_%")
        )
        return {(row.task_id, row.key): XComModel.deserialize_value(row) for row in rows}


def test_a_missing_link_is_no_error_and_a_stored_one_is_kept(harness: Harness, batch: BatchWorld) -> None:
    out = harness.tmp / "out"
    dag_file = harness.write_dag(
        "links",
        f"""
        # fails before anything is submitted: no link of either kind was stored
        GpuJobOperator(task_id="unsubmitted", backend="{{{{ 'no_such_backend' }}}}", command=["true"])
        # the local backend offers no link (its job log is a file on the worker no browser can open)
        GpuJobOperator(task_id="local", backend=LocalBackend(), poll_interval=0.2,
                       command={harness.toy_command(str(out / "local"), steps=2, delay=0.05)})
        # a Batch job has a console page and a log stream: both links are stored and kept
        GpuJobOperator(task_id="batch", backend={batch.backend_source()}, image="trainer:1", poll_interval=0.3,
                       command={harness.toy_command(str(out / "batch"), steps=2, delay=0.05)})
        """,
    )
    run = harness.run(dag_file, "links", extra_env={"AIRFLOW__GPU_PROVIDER__LOCAL_STATE_DIR": str(harness.state_dir)})
    assert run.task("unsubmitted")["state"].endswith("failed"), run.log[-3000:]
    assert run.task("local")["state"].endswith("success"), run.log[-3000:]
    assert run.task("batch")["state"].endswith("success"), run.log[-3000:]
    assert "XCom not found" not in run.log
    assert "Failed to push an xcom for task operator extra link" not in run.log
    links = stored_links("links", run.result["run_id"])
    for task_id in ("unsubmitted", "local"):
        assert links[(task_id, "_link_GpuJobConsoleLink")] == "", links
        assert links[(task_id, "_link_GpuJobLogsLink")] == "", links
    job_id = run.task("batch")["xcom"]["attempts"][0]["job_id"]
    assert links[("batch", "_link_GpuJobConsoleLink")].startswith("https://"), links
    assert job_id in links[("batch", "_link_GpuJobConsoleLink")], links
    assert links[("batch", "_link_GpuJobLogsLink")].startswith("https://"), links
