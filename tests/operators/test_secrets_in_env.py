"""A secret passed through ``env=`` to a remote backend (issue 25, item 3): ``env=`` travels in the job's
request (``CreateTrainingJob.Environment``, Batch's container overrides, the pod spec), readable by anyone
allowed to describe the job. The DAG gets a parse-time warning, or a refusal with
``[gpu_provider] refuse_secrets_in_env``; the backends' ``secrets=`` passes references instead."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from gpu_provider.operators import GpuJobOperator
from gpu_provider.operators._fields import secret_in_env

SAGEMAKER = {
    "name": "sagemaker",
    "role_arn": "arn:aws:iam::123456789012:role/gpu-sagemaker-job",
    "output_path": "s3://models/out",
}


def _op(env: dict[str, str], backend: Any = SAGEMAKER) -> GpuJobOperator:
    return GpuJobOperator(task_id="train", command=["python", "train.py"], image="trainer:1", env=env, backend=backend)


@pytest.mark.parametrize(
    ("env", "what"),
    [
        ({"HF_TOKEN": "{{ conn.huggingface.password }}"}, "a connection's password"),
        ({"HF": "{{ conn['huggingface'].password }}"}, "a connection's password"),
        ({"DB": "{{ conn.warehouse.extra_dejson.key }}"}, "a connection's extra_dejson"),
        ({"TOK": "{{ var.value.hf_token }}"}, "the Variable 'hf_token'"),
        ({"K": "{{ var.json.wandb_api_key }}"}, "the Variable 'wandb_api_key'"),
        ({"K": "{{ var.value.get('db-password') }}"}, "the Variable 'db-password'"),
        ({"WANDB_API_KEY": "{{ params.key }}"}, "a template under a secret's name"),
    ],
)
def test_a_secret_through_env_to_a_remote_backend_warns_at_parse_time(env: dict[str, str], what: str) -> None:
    with pytest.warns(UserWarning, match="env=") as caught:
        _op(env)
    message = str(caught[0].message)
    key = next(iter(env))
    assert f"env[{key!r}] passes {what} to the 'sagemaker' backend" in message, message
    assert "secrets=" in message and "refuse_secrets_in_env" in message


@pytest.mark.parametrize(
    "backend",
    [
        {"name": "batch", "spot_queue": "s", "on_demand_queue": "o"},
        "kubernetes",
        {"name": "{{ params.backend }}"},  # may be remote: warned too
    ],
)
def test_every_remote_backend_and_a_templated_one_warn(backend: Any) -> None:
    with pytest.warns(UserWarning, match=r"env\['HF_TOKEN'\] passes a connection's password"):
        GpuJobOperator(
            task_id="t", command=["true"], image="img:1", env={"HF_TOKEN": "{{ conn.hf.password }}"}, backend=backend
        )


def test_no_warning_for_the_local_backend_or_for_ordinary_values() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GpuJobOperator(task_id="local", command=["true"], env={"HF_TOKEN": "{{ conn.hf.password }}"}, backend="local")
        _op({"TOKENIZERS_PARALLELISM": "false", "DATA": "{{ var.value.dataset_uri }}", "LR": "{{ params.lr }}"})
    assert secret_in_env("PASSWORD", "literal") is None  # a literal is the DAG file's own business


def test_the_config_switch_refuses_the_dag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__REFUSE_SECRETS_IN_ENV", "True")
    with pytest.raises(
        ValueError, match=r"env\['HF_TOKEN'\] passes a connection's password.*refuse_secrets_in_env is on"
    ):
        _op({"HF_TOKEN": "{{ conn.huggingface.password }}"})
