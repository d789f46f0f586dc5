"""Bad input fails early, with a message that names the field (and the value where it is safe)."""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import pytest

from gpu_provider import Checkpoint, GpuResources, OnDemand, Spot, SpotFallback
from gpu_provider.backends.base import resolve_backend
from gpu_provider.job import to_bool, to_seconds, validate_checkpoint_uri
from gpu_provider.operators import GpuJobOperator
from gpu_provider.recovery import resolve_capacity

CMD = ["python", "-c", "print(1)"]


def op(**kwargs: Any) -> GpuJobOperator:
    kwargs.setdefault("task_id", "t")
    kwargs.setdefault("command", CMD)
    return GpuJobOperator(**kwargs)


# (description, callable, exception type, text the message must contain)
BAD_INPUTS: list[tuple[str, Any, type[Exception], str]] = [
    ("gpus is a string", lambda: GpuResources(gpus="two"), TypeError, "resources.gpus"),
    ("gpus is None", lambda: GpuResources(gpus=None), TypeError, "resources.gpus"),
    ("gpus is a bool", lambda: GpuResources(gpus=True), TypeError, "resources.gpus"),
    ("gpus zero", lambda: GpuResources(gpus=0), ValueError, "resources.gpus=0"),
    ("gpus negative", lambda: GpuResources(gpus=-1), ValueError, "resources.gpus=-1"),
    ("gpus NaN", lambda: GpuResources(gpus=float("nan")), ValueError, "resources.gpus"),
    ("gpus 1.5", lambda: GpuResources(gpus=1.5), ValueError, "resources.gpus=1.5"),
    ("nodes zero", lambda: GpuResources(nodes=0), ValueError, "resources.nodes=0"),
    ("nodes float", lambda: GpuResources(nodes=2.0), TypeError, "resources.nodes=2.0"),
    ("fraction multi-node", lambda: GpuResources(gpus=0.5, nodes=2), ValueError, "resources.gpus=0.5"),
    ("unknown gpu type", lambda: GpuResources(gpu_type="gtx1080"), ValueError, "resources.gpu_type='gtx1080'"),
    ("cpu zero", lambda: GpuResources(cpu=0), ValueError, "resources.cpu=0"),
    ("cpu string", lambda: GpuResources(cpu="4"), TypeError, "resources.cpu"),
    ("memory garbage", lambda: GpuResources(memory="lots"), ValueError, "resources.memory='lots'"),
    ("memory negative", lambda: GpuResources(memory=-5), ValueError, "resources.memory=-5"),
    ("instance types string", lambda: GpuResources(instance_types="g5.xlarge"), TypeError, "resources.instance_types"),
    ("instance type bad", lambda: GpuResources(instance_types=["big gpu"]), ValueError, "resources.instance_types"),
    ("checkpoint http", lambda: Checkpoint(uri="http://x/ckpt"), ValueError, "checkpoint.uri='http://x/ckpt'"),
    ("checkpoint bare path", lambda: Checkpoint(uri="/tmp/ckpt"), ValueError, "checkpoint.uri='/tmp/ckpt'"),
    ("checkpoint file relative", lambda: Checkpoint(uri="file://rel/ckpt"), ValueError, "checkpoint.uri"),
    ("checkpoint s3 no bucket", lambda: Checkpoint(uri="s3:///x"), ValueError, "checkpoint.uri"),
    ("checkpoint keep 0", lambda: Checkpoint(uri="file:///tmp/c", keep=0), ValueError, "checkpoint.keep=0"),
    ("spot wait negative", lambda: SpotFallback(spot_wait_timeout=-1), ValueError, "capacity.spot_wait_timeout=-1"),
    (
        "spot wait negative timedelta",
        lambda: Spot(spot_wait_timeout=timedelta(seconds=-5)),
        ValueError,
        "capacity.spot_wait_timeout",
    ),
    (
        "after_preemptions negative",
        lambda: SpotFallback(after_preemptions=-1),
        ValueError,
        "capacity.after_preemptions",
    ),
    ("max_interruptions negative", lambda: OnDemand(max_interruptions=-2), ValueError, "capacity.max_interruptions"),
    ("capacity unknown string", lambda: resolve_capacity("cheap"), ValueError, "capacity='cheap'"),
    ("capacity wrong type", lambda: resolve_capacity(3), TypeError, "capacity=3"),
    ("backend unknown", lambda: resolve_backend("ec2"), ValueError, "backend='ec2'"),
    ("backend mapping without name", lambda: resolve_backend({"simulate_preemptions": [1]}), ValueError, "'name'"),
    ("backend wrong type", lambda: resolve_backend(42), TypeError, "backend=42"),
    ("operator backend unknown", lambda: op(backend="slurm"), ValueError, "backend='slurm'"),
    ("operator command string", lambda: op(command="python train.py"), TypeError, "command must be a list"),
    ("operator command empty", lambda: op(command=[]), TypeError, "command (list) must be a non-empty list"),
    ("operator command has None", lambda: op(command=["python", None]), TypeError, "command[1] is a NoneType"),
    ("operator env reserved", lambda: op(env={"NODE_RANK": "3"}), ValueError, "env key 'NODE_RANK'"),
    ("operator env contract", lambda: op(env={"GPU_PROVIDER_ATTEMPT": "3"}), ValueError, "GPU_PROVIDER_ATTEMPT"),
    ("operator env bad name", lambda: op(env={"1X": "a"}), ValueError, "env key '1X'"),
    ("operator env not mapping", lambda: op(env=["A=1"]), TypeError, "env="),
    ("operator resources wrong type", lambda: op(resources=4), TypeError, "resources (int)"),
    ("operator resources bad dict key", lambda: op(resources={"gpu": 1}), TypeError, "resources with keys ['gpu']"),
    ("operator checkpoint wrong type", lambda: op(checkpoint=5), TypeError, "checkpoint (int)"),
    ("operator team uppercase", lambda: op(team="Vision Team"), ValueError, "team='Vision Team'"),
    ("operator team plus pool", lambda: op(team="nlp", pool="other"), ValueError, "pool='other'"),
    ("operator priority string", lambda: op(priority="high"), TypeError, "priority='high'"),
    ("operator max_runtime negative", lambda: op(max_runtime=-10), ValueError, "max_runtime=-10"),
    ("operator max_runtime zero", lambda: op(max_runtime=0), ValueError, "max_runtime=0"),
    ("operator max_runtime text", lambda: op(max_runtime="an hour"), ValueError, "max_runtime='an hour'"),
    ("operator poll_interval zero", lambda: op(poll_interval=0), ValueError, "poll_interval=0"),
    ("memory bare number string", lambda: GpuResources(memory="32768"), ValueError, "resources.memory='32768'"),
    ("checkpoint query", lambda: Checkpoint(uri="s3://b/p?x=1"), ValueError, "checkpoint.uri"),
    ("checkpoint fragment", lambda: Checkpoint(uri="file:///tmp/c#a"), ValueError, "checkpoint.uri"),
    ("operator checkpoint query", lambda: op(checkpoint="s3://b/p?x=1"), ValueError, "checkpoint.uri"),
    ("templated checkpoint query", lambda: Checkpoint(uri="s3://b/{{ run_id }}?x=1"), ValueError, "checkpoint.uri"),
    (
        "local backend negative simulated preemption",
        lambda: resolve_backend({"name": "local", "simulate_preemptions": "-3"}),
        ValueError,
        "simulate_preemptions",
    ),
]


@pytest.mark.parametrize(("case", "build", "exc", "needle"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_names_the_field(case: str, build: Any, exc: type[Exception], needle: str) -> None:
    with pytest.raises(exc) as info:
        build()
    assert needle in str(info.value), f"{case}: message {str(info.value)!r} does not name {needle!r}"


def test_there_are_at_least_25_bad_inputs() -> None:
    assert len(BAD_INPUTS) >= 25


def test_env_error_never_echoes_a_secret_value() -> None:
    with pytest.raises(TypeError) as info:
        op(env={"API_TOKEN": {"secret": "hunter2"}})
    assert "API_TOKEN" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_spot_without_checkpoint_warns_for_long_jobs_only() -> None:
    with pytest.warns(UserWarning, match="no checkpoint"):
        op(task_id="long", capacity="spot", max_runtime=timedelta(hours=5))
    with pytest.warns(UserWarning, match="no checkpoint"):
        op(task_id="unbounded", capacity=SpotFallback())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op(task_id="short", capacity="spot", max_runtime=timedelta(minutes=20))
        op(task_id="ckpt", capacity="spot", checkpoint="file:///tmp/ckpt")
        op(task_id="ondemand", capacity="on_demand")


def test_valid_spec_values() -> None:
    res = GpuResources(gpus=4, nodes=2, gpu_type="A100", cpu=16, memory="64Gi", instance_types=["p4d.24xlarge"])
    assert res.total_gpus == 8
    assert res.pool_slots == 8
    assert res.gpu_type == "a100"
    assert res.memory_mib == 65536
    assert res.instance_types == ("p4d.24xlarge",)
    assert GpuResources(gpus=0.25).pool_slots == 1
    assert GpuResources(memory="16G").memory_mib == 15259
    assert Checkpoint(uri="s3://bucket/prefix/").uri == "s3://bucket/prefix/"


def test_templated_values_are_checked_after_rendering_not_at_parse_time() -> None:
    task = op(
        backend="{{ params.backend }}",
        command="{{ params.cmd }}",
        env="{{ params.env }}",
        checkpoint="file:///ckpt/{{ run_id }}",
    )
    assert task.backend == "{{ params.backend }}"
    with pytest.raises(ValueError, match=r"checkpoint\.uri='ftp://x'"):
        validate_checkpoint_uri("ftp://x")


INF = float("inf")
HUGE = 10**400

# (description, callable, field the message must name, the allowed range it must state)
OUT_OF_RANGE: list[tuple[str, Any, str, str]] = [
    ("gpus huge int", lambda: GpuResources(gpus=HUGE), "resources.gpus=", "from 1 to 64"),
    ("gpus beyond a node", lambda: GpuResources(gpus=65), "resources.gpus=65", "from 1 to 64"),
    ("gpus infinite", lambda: GpuResources(gpus=INF), "resources.gpus=inf", "from 1 to 64"),
    ("gpus tiny", lambda: GpuResources(gpus=1e-12), "resources.gpus=1e-12", "from 0.01 to 1"),
    ("nodes huge", lambda: GpuResources(nodes=HUGE), "resources.nodes=", "from 1 to 1000"),
    ("nodes beyond the cap", lambda: GpuResources(nodes=1001), "resources.nodes=1001", "from 1 to 1000"),
    ("cpu infinite", lambda: GpuResources(cpu=INF), "resources.cpu=inf", "from 0.1 to 1024"),
    ("cpu huge int", lambda: GpuResources(cpu=HUGE), "resources.cpu=", "from 0.1 to 1024"),
    ("cpu tiny", lambda: GpuResources(cpu=1e-9), "resources.cpu=1e-09", "from 0.1 to 1024"),
    ("memory infinite", lambda: GpuResources(memory=INF), "resources.memory=inf", "between 128 MiB and 64 TiB"),
    ("memory huge int", lambda: GpuResources(memory=HUGE), "resources.memory=", "between 128 MiB and 64 TiB"),
    ("memory huge string", lambda: GpuResources(memory="9" * 400 + "Ti"), "resources.memory=", "64 TiB"),
    ("memory tiny", lambda: GpuResources(memory="1Ki"), "resources.memory='1Ki'", "between 128 MiB"),
    ("memory above 64 TiB", lambda: GpuResources(memory="65Ti"), "resources.memory='65Ti'", "64 TiB"),
    ("checkpoint keep huge", lambda: Checkpoint(uri="file:///c", keep=HUGE), "checkpoint.keep=", "from 1 to 1000"),
    ("poll_interval 1e308", lambda: op(poll_interval=1e308), "poll_interval=1e+308", "0 to 3600"),
    ("max_runtime timedelta.max", lambda: op(max_runtime=timedelta.max), "max_runtime=", "366 days"),
    ("max_runtime huge int", lambda: op(max_runtime=HUGE), "max_runtime=", "366 days"),
    ("grace_period 1e308", lambda: to_seconds("grace_period", 1e308), "grace_period=1e+308", "366 days"),
    ("duration string 1e400", lambda: to_seconds("grace_period", "1e400"), "grace_period='1e400'", "366 days"),
    ("spot wait huge", lambda: Spot(spot_wait_timeout=10**400), "capacity.spot_wait_timeout=", "366 days"),
    ("spot wait max", lambda: SpotFallback(spot_wait_timeout=timedelta.max), "capacity.spot_wait_timeout=", "366"),
    ("backoff infinite", lambda: OnDemand(backoff=INF), "capacity.backoff=inf", "0 to 300"),
    ("backoff 1e308", lambda: OnDemand(backoff=1e308), "capacity.backoff=1e+308", "0 to 300"),
    ("max_interruptions huge", lambda: Spot(max_interruptions=HUGE), "capacity.max_interruptions=", "0 to 100"),
    ("after_preemptions huge", lambda: SpotFallback(after_preemptions=HUGE), "capacity.after_preemptions=", "0 to 100"),
]


@pytest.mark.parametrize(("case", "build", "field", "allowed"), OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_absurd_numbers_are_refused_naming_field_and_range(case: str, build: Any, field: str, allowed: str) -> None:
    with pytest.raises(ValueError) as info:
        build()
    message = str(info.value)
    assert field in message, f"{case}: {message!r} does not name {field!r}"
    assert allowed in message, f"{case}: {message!r} does not state the allowed range {allowed!r}"
    assert len(message) < 400  # a huge value is summarised, not printed in full


def test_bounds_themselves_are_accepted() -> None:
    assert GpuResources(gpus=64, nodes=1000, cpu=1024, memory="64Ti").memory_mib == 64 * 1024 * 1024
    assert GpuResources(gpus=0.01, cpu=0.1, memory=128).memory_mib == 128
    assert to_seconds("max_runtime", timedelta(days=366)) == 366 * 86400
    assert to_seconds("poll_interval", "2.5") == 2.5
    assert to_seconds("x", 5000, maximum=10**4) == 5000.0
    with pytest.raises(ValueError, match=r"x=10001 is out of range: use a timedelta or seconds, 0 to 10000"):
        to_seconds("x", 10001, maximum=10**4)
    assert OnDemand(backoff=300).backoff_s == 300.0
    assert Spot(max_interruptions=100).max_interruptions == 100
    assert Spot(max_interruptions=100).backoff_delay(100) <= 300.0


def test_memory_string_without_unit_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError) as info:
        GpuResources(memory="32768")
    assert "'32768Mi'" in str(info.value)
    assert "32Gi" in str(info.value)
    assert "means MiB" in str(info.value)
    # a number and a string with a unit mean the same thing
    assert GpuResources(memory=32768).memory_mib == GpuResources(memory="32768Mi").memory_mib == 32768


def test_checkpoint_query_is_not_echoed() -> None:
    with pytest.raises(ValueError) as info:
        validate_checkpoint_uri("s3://bucket/run?X-Amz-Signature=abc123secret")
    assert "s3://bucket/run" in str(info.value)
    assert "abc123secret" not in str(info.value)
    assert Checkpoint(uri="s3://b/{{ run_id }}/x").uri == "s3://b/{{ run_id }}/x"
    assert Checkpoint(uri="s3://b/{# note #}{{ run_id }}").uri.endswith("}}")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        ("False", False),
        (" TRUE ", True),
        ("1", True),
        ("0", False),
        (1, True),
        (0, False),
    ],
)
def test_to_bool_accepts(value: Any, expected: bool) -> None:
    assert to_bool("deferrable", value) is expected


@pytest.mark.parametrize(
    ("value", "exc"),
    [
        ("no", ValueError),
        ("yes", ValueError),
        ("", ValueError),
        (2, ValueError),
        (None, TypeError),
        (1.0, TypeError),
        ([], TypeError),
    ],
)
def test_to_bool_refuses(value: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc) as info:
        to_bool("deferrable", value)
    assert str(info.value).startswith(f"deferrable={value!r}")
    assert "'true', 'false'" in str(info.value)


def test_capacity_strings_and_defaults() -> None:
    assert resolve_capacity(None) == OnDemand()
    assert resolve_capacity("on_demand") == OnDemand()
    assert resolve_capacity("spot") == Spot()
    assert resolve_capacity("spot-fallback") == SpotFallback()
    fallback = SpotFallback()
    assert fallback.after_preemptions == 1
    assert fallback.spot_wait_timeout_s == 1800.0
    assert fallback.max_interruptions == 3
