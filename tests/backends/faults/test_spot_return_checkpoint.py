"""A move back to spot is a stop the provider chooses: without a checkpoint, refused (issue 36, item 4).

``SpotFallback(spot_return=SpotReturn(...))`` (or a ``Ladder``'s) stops a running on-demand attempt when spot
returns and submits the next one on spot, resuming from the checkpoint the stop asked for. On a task with no
checkpoint every such move would throw the attempt's work away, up to ``max_moves`` times a run: the DAG is
refused when it is parsed (an import error in Airflow's UI and in the DAG checker), and a templated checkpoint
that renders empty is refused before anything is submitted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_provider import GpuResources, Ladder, LadderRung, SpotFallback, SpotReturn
from gpu_provider.operators import GpuJobOperator
from tests.backends.contract.worlds import BackendWorld
from tests.checker_runs import run_checks
from tests.harness import Harness

#: the words of the refusal: the field and its value, what is allowed, the next step
REFUSED = r"capacity\.spot_return=SpotReturn\(max_moves=2\) on a task with no checkpoint="
ALLOWED = "Allowed: spot_return with a checkpoint"
NEXT = "Next step: give the task a checkpoint="
ROLE = "arn:aws:iam::123456789012:role/trainer"


def _spot_return(**kwargs: object) -> SpotReturn:
    return SpotReturn(instance_types=["p4d.24xlarge"], **kwargs)  # type: ignore[arg-type]


def _task(world: BackendWorld, task_id: str, capacity: SpotFallback, **kwargs: object) -> GpuJobOperator:
    """A task of ``world``'s backend (an image for the container backends; short, so spot needs no warning)."""
    return GpuJobOperator(
        task_id=task_id,
        command=["true"],
        backend=world.backend(),
        image="trainer:1",
        resources=GpuResources(gpus=1),
        capacity=capacity,
        max_runtime=600,
        **kwargs,
    )


def test_spot_return_without_a_checkpoint_is_refused_at_parse_time(world: BackendWorld) -> None:
    capacity = SpotFallback(spot_return=_spot_return())
    with pytest.raises(ValueError, match=REFUSED) as refused:
        _task(world, "no_ckpt", capacity)
    text = str(refused.value)
    assert ALLOWED in text and NEXT in text and "up to 2 time(s) per run" in text
    # with a checkpoint, or with no move allowed at all, the same task parses
    assert _task(world, "ckpt", capacity, checkpoint="s3://gpu-checkpoints/train").capacity.spot_return is not None
    _task(world, "no_moves", SpotFallback(spot_return=_spot_return(max_moves=0)))


def test_a_ladders_spot_return_without_a_checkpoint_is_refused_too() -> None:
    ladder = Ladder(
        LadderRung("batch", "spot", spot_queue="gpu-spot", on_demand_queue="gpu-od"),
        LadderRung(
            "sagemaker",
            "on_demand",
            instance_types=["ml.p4d.24xlarge"],
            role_arn="arn:aws:iam::123456789012:role/trainer",
        ),
        spot_return=_spot_return(),
    )
    with pytest.raises(ValueError, match=REFUSED):
        GpuJobOperator(task_id="t", command=["python", "train.py"], image="trainer:1", capacity=ladder)


SOURCE = """
GpuJobOperator(
    task_id="train",
    command=["true"],
    backend=LocalBackend(state_dir={state!r}),
    resources=GpuResources(gpus=1),
    capacity=SpotFallback(spot_return=SpotReturn(instance_types=["p4d.24xlarge"])),
    checkpoint={checkpoint},
)
"""


def _dag(harness: Harness, dag_id: str, checkpoint: str) -> Path:
    body = "from gpu_provider import SpotReturn\n" + SOURCE.format(state=str(harness.state_dir), checkpoint=checkpoint)
    return harness.write_dag(dag_id, body)


def test_the_dag_file_shows_the_refusal_as_an_import_error_and_the_checker_says_so(harness: Harness) -> None:
    from airflow.dag_processing.dagbag import DagBag

    dag_file = _dag(harness, "spot_return_no_ckpt", "None")
    bag = DagBag(dag_folder=str(dag_file))
    assert not bag.dags
    (error,) = bag.import_errors.values()
    assert "ValueError: capacity.spot_return=SpotReturn(max_moves=2) on a task with no checkpoint=" in error
    assert ALLOWED in error
    checked = run_checks({"refused": ["--dag", str(dag_file)]}, harness.tmp)["refused"]
    assert checked.returncode == 1
    assert "Airflow could not import it" in checked.stderr
    assert "capacity.spot_return=SpotReturn(max_moves=2) on a task with no checkpoint=" in checked.stderr


def test_a_templated_checkpoint_that_renders_empty_is_refused_before_any_submit(harness: Harness) -> None:
    from gpu_provider.backends.local import LocalBackend

    dag_file = _dag(harness, "spot_return_empty_ckpt", '\'{{ params.get("ckpt", "") }}\'')
    run = harness.run(dag_file, "spot_return_empty_ckpt")
    assert run.task("train")["state"] == "failed", run.log[-4000:]
    assert "on a task with a checkpoint= that rendered empty" in run.log, run.log[-4000:]
    assert LocalBackend(state_dir=str(harness.state_dir)).list_jobs() == []  # nothing was submitted
