"""What ``GpuJobOperator`` refuses when the DAG is parsed: each error names the field, the value
(never a secret) and what is allowed."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from gpu_provider.operators import GpuJobOperator

SECRET = "s3cr3t-value-do-not-print"


def _op(**kwargs: Any) -> GpuJobOperator:
    kwargs.setdefault("command", ["python", "train.py"])
    return GpuJobOperator(task_id="t", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field", "allowed"),
    [
        ({"deferrable": "no"}, "deferrable", "'true', 'false'"),
        ({"deferrable": 2}, "deferrable", "True, False"),
        ({"poll_interval": 1e308}, "poll_interval", "0 to 3600"),
        ({"poll_interval": math.inf}, "poll_interval", "0 to 3600"),
        ({"max_runtime": timedelta.max}, "max_runtime", "366 days"),
        ({"queue_timeout": -1}, "queue_timeout", "seconds"),
        ({"resources": {"gpus": 10**400}}, "resources.gpus", "64"),
        ({"resources": {"gpus": 1e-12}}, "resources.gpus", "0.01"),
        ({"resources": {"memory": "32768"}}, "resources.memory", "32768Mi"),
        ({"resources": {"memory": math.inf}}, "resources.memory", "MiB"),
        ({"resources": {"cpu": 1e-9}}, "resources.cpu", "0.1"),
        ({"checkpoint": "file:///ckpt?x=1"}, "checkpoint", "query"),
        ({"priority": 10**30}, "priority", "2147483647"),
    ],
)
def test_out_of_range_values_are_refused_at_parse_time_naming_the_field(
    kwargs: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises((ValueError, TypeError)) as err:
        _op(**kwargs)
    assert field in str(err.value) and allowed in str(err.value)


def test_an_unknown_backend_option_is_named_without_echoing_any_value() -> None:
    with pytest.raises(ValueError) as err:
        _op(backend={"name": "local", "api_token": SECRET, "grace_period": SECRET})
    message = str(err.value)
    assert "'api_token'" in message and "grace_period" in message
    assert SECRET not in message


def test_an_option_choosing_an_executable_or_a_path_cannot_be_a_template() -> None:
    """Issue 7: params from the trigger form must not pick the nvidia-smi binary or the state folder."""
    for option in ("nvidia_smi", "state_dir"):
        with pytest.raises(ValueError, match=f"backend option '{option}' .* cannot be a template"):
            _op(backend={"name": "local", option: "{{ params.x }}"})
    # other options may be templated
    op = _op(backend={"name": "local", "simulate_preemptions": "{{ params.preempt_at }}"})
    assert op.backend["simulate_preemptions"] == "{{ params.preempt_at }}"


def test_deferrable_accepts_real_booleans_and_their_spellings() -> None:
    assert _op(deferrable="false").deferrable is False
    assert _op(deferrable="TRUE").deferrable is True
    assert _op(deferrable=False).deferrable is False
