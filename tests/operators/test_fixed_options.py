"""Fixed backend options (issue 25, items 1 and 2): an option that chooses who a job runs as, where its
secrets come from, which account, endpoint or folder, is written literally in the DAG file or set in
``[gpu_provider]``; a template cannot set it, also when the backend's name or the whole ``backend``
mapping is a template (then only rendering shows it, and the operator and the sensor check again)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from gpu_provider.backends.base import backend_class
from gpu_provider.operators import GpuJobOperator
from gpu_provider.operators._fields import check_rendered_fixed_options
from gpu_provider.sensors.gpu_job import GpuJobSensor
from tests.harness import Harness

ARN = "arn:aws:iam::123456789012:role/other-team"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:other-team-token"
#: a valid value for every fixed option of every backend: what a trigger form could send
VALUES: dict[str, dict[str, Any]] = {
    "local": {
        "nvidia_smi": "/bin/true",
        "state_dir": "/tmp/someone-elses-state",
        "run_as_user": "root",
        "working_dir": "/tmp",
        "retention_days": "0",
    },
    "batch": {
        "aws_conn_id": "aws_other_team",
        "region_name": "eu-west-1",
        "job_role_arn": ARN,
        "execution_role_arn": ARN,
        "secrets": {"HF_TOKEN": SECRET_ARN},
    },
    "sagemaker": {
        "aws_conn_id": "aws_other_team",
        "region_name": "eu-west-1",
        "role_arn": ARN,
        "secrets": {"HF_TOKEN": SECRET_ARN},
        "output_path": "s3://other-team/models",
        "kms_key_id": "alias/other-team",
        "subnets": ["subnet-0123abcd"],
        "security_group_ids": ["sg-0123abcd"],
    },
    "kubernetes": {
        "kubernetes_conn_id": "kubernetes_other_team",
        "namespace": "other-team",
        "service_account": "cluster-admin",
        "secrets": {"HF_TOKEN": "other-team-secret/token"},
        "image_pull_secrets": ["other-team-registry"],
        "dashboard_url": "https://phishing.example/",
    },
}
CASES = [(name, option) for name, options in VALUES.items() for option in options]


def test_every_backend_declares_its_fixed_options() -> None:
    """The table above covers each backend's declaration exactly: a new fixed option gets a case here."""
    for name, options in VALUES.items():
        assert backend_class(name).fixed_options == frozenset(options), name


def _context(params: dict[str, Any]) -> dict[str, Any]:
    return {"params": params, "ti": None, "task_instance": None}


@pytest.mark.parametrize(("name", "option"), CASES)
def test_a_templated_backend_name_cannot_set_a_fixed_option(name: str, option: str) -> None:
    """The name is a template, so the parse-time check cannot know the backend; the rendered one is refused."""
    with DAG(dag_id="fixed_name", schedule=None):
        op = GpuJobOperator(
            task_id="job",
            command=["true"],
            backend={"name": "{{ params.backend }}", option: "{{ params.value }}"},
        )
        sensor = GpuJobSensor(
            task_id="sensor", job_id="j-1", backend={"name": "{{ params.backend }}", option: "{{ params.value }}"}
        )
    value = VALUES[name][option]
    params = {"backend": name, "value": value if isinstance(value, str) else json.dumps(value)}
    for task in (op, sensor):
        task.render_template_fields(_context(params))
        assert task.backend[option] == params["value"]  # rendered: before the fix it went to the backend
        with pytest.raises(ValueError, match=f"backend option '{option}' of the '{name}' backend came from a template"):
            task.execute(_context(params))


@pytest.mark.parametrize(("name", "option"), CASES)
def test_a_whole_templated_backend_mapping_cannot_set_a_fixed_option(name: str, option: str) -> None:
    """Native rendering: the trigger form hands over the whole mapping."""
    with DAG(dag_id="fixed_whole", schedule=None, render_template_as_native_obj=True):
        op = GpuJobOperator(task_id="job", command=["true"], backend="{{ params.backend }}")
        sensor = GpuJobSensor(task_id="sensor", job_id="j-1", backend="{{ params.backend }}")
    params = {"backend": {"name": name, option: VALUES[name][option]}}
    for task in (op, sensor):
        task.render_template_fields(_context(params))
        assert task.backend == params["backend"]
        with pytest.raises(ValueError, match=f"backend option '{option}' of the '{name}' backend came from a template"):
            task.execute(_context(params))


@pytest.mark.parametrize("name", sorted(VALUES))
def test_fixed_options_written_literally_beside_a_templated_name_are_accepted(name: str) -> None:
    written = {"name": "{{ params.backend }}", **VALUES[name]}
    check_rendered_fixed_options({**written, "name": name}, written)
    # a rendered value that differs from the literal one did not come from the DAG file
    option, value = next(iter(VALUES[name].items()))
    with pytest.raises(ValueError, match=f"'{option}'"):
        check_rendered_fixed_options({**written, "name": name, option: f"{value}x"}, written)
    # left out or rendered empty: the backend reads [gpu_provider]
    check_rendered_fixed_options({"name": name, option: ""}, {"name": "{{ params.backend }}"})


def test_the_error_does_not_echo_the_value() -> None:
    with pytest.raises(ValueError) as err:
        check_rendered_fixed_options({"name": "batch", "secrets": {"X": SECRET_ARN}}, "{{ params.backend }}")
    assert SECRET_ARN not in str(err.value) and "[gpu_provider]" in str(err.value)


DAG_FILE = """
from airflow.sdk import DAG, Param
from gpu_provider.operators import GpuJobOperator

with DAG(dag_id={dag_id!r}, schedule=None, catchup=False, render_template_as_native_obj={native},
         params={{"backend": Param({default!r}), "user": Param("")}}) as dag:
    GpuJobOperator(task_id="job", backend={backend}, command={command!r})
"""


@pytest.mark.parametrize(
    ("native", "backend", "default", "conf"),
    [
        (False, {"name": "{{ params.backend }}", "run_as_user": "{{ params.user }}"}, "local", {"user": "root"}),
        (True, "{{ params.backend }}", {"name": "local"}, {"backend": {"name": "local", "run_as_user": "root"}}),
    ],
    ids=["templated-name", "whole-mapping"],
)
def test_trigger_form_params_cannot_choose_run_as_user(
    harness: Harness, native: bool, backend: Any, default: Any, conf: dict[str, Any]
) -> None:
    """The issue's reproduction: a run's params chose ``run_as_user="root"`` over the administrator's
    ``[gpu_provider] local_run_as_user``. Now the task fails before submitting anything."""
    marker = harness.tmp / "ran"
    dag_id = f"fixed_run_as_{'native' if native else 'name'}"
    path = harness.home / "dags" / f"{dag_id}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    command = ["/bin/sh", "-c", f"id -un > {marker}"]
    body = DAG_FILE.format(dag_id=dag_id, native=native, default=default, backend=repr(backend), command=command)
    path.write_text(textwrap.dedent(body))
    run = harness.run(path, dag_id, conf=conf)
    assert run.task()["state"] == "failed", run.log[-3000:]
    assert "backend option 'run_as_user' of the 'local' backend came from a template" in run.log
    assert not marker.exists(), "the job ran"
    assert not list(Path(harness.state_dir).glob("jobs/*")), "a job was submitted"


@pytest.mark.parametrize(("name", "option"), CASES)
def test_a_fixed_option_written_as_a_template_is_refused_at_parse_time(name: str, option: str) -> None:
    value = VALUES[name][option]
    templated: Any = (
        ["{{ params.x }}"]
        if isinstance(value, list)
        else {"X": "{{ params.x }}"}
        if isinstance(value, dict)
        else "{{ params.x }}"
    )
    with pytest.raises(ValueError, match=f"backend option '{option}' of the '{name}' backend cannot be a template"):
        GpuJobOperator(task_id="job", command=["true"], image="img:1", backend={"name": name, option: templated})
