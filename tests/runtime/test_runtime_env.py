"""job_env(): our variables, and the normalisation of AWS Batch, SageMaker and Kubernetes variables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_provider.runtime import JobEnv, export_torchrun_env, job_env

SM_HOSTS = json.dumps(["algo-2", "algo-1", "algo-3"])


def test_defaults_are_a_single_node_fresh_start() -> None:
    assert job_env({}) == JobEnv(
        checkpoint_uri=None,
        resume_from=None,
        attempt=1,
        capacity="on-demand",
        nnodes=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        output_file=None,
    )


def test_reads_our_variables_and_treats_empty_as_absent() -> None:
    env = job_env(
        {
            "GPU_PROVIDER_CHECKPOINT_URI": "s3://b/ckpts",
            "GPU_PROVIDER_RESUME_FROM": "",
            "GPU_PROVIDER_ATTEMPT": "3",
            "GPU_PROVIDER_CAPACITY": "spot",
            "GPU_PROVIDER_OUTPUT_FILE": "/tmp/out",
            "NNODES": "4",
            "NODE_RANK": "2",
            "MASTER_ADDR": "10.0.0.7",
            "MASTER_PORT": "29400",
        }
    )
    assert (env.checkpoint_uri, env.resume_from, env.attempt, env.capacity) == ("s3://b/ckpts", None, 3, "spot")
    assert (env.nnodes, env.node_rank, env.master_addr, env.master_port) == (4, 2, "10.0.0.7", 29400)
    assert env.output_file == "/tmp/out"
    assert not env.is_main


def test_resume_from_is_passed_through() -> None:
    env = job_env({"GPU_PROVIDER_RESUME_FROM": "file:///data/ckpt/ckpt-0000000040"})
    assert env.resume_from == "file:///data/ckpt/ckpt-0000000040"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {
                "AWS_BATCH_JOB_NUM_NODES": "3",
                "AWS_BATCH_JOB_NODE_INDEX": "2",
                "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
                "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.1.2.3",
            },
            (3, 2, "10.1.2.3", 29500),
            id="batch-child-node",
        ),
        pytest.param(
            {"AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"},
            (3, 0, "127.0.0.1", 29500),
            id="batch-main-node-has-no-main-address",
        ),
        pytest.param(
            {"SM_HOSTS": SM_HOSTS, "SM_CURRENT_HOST": "algo-3"},
            (3, 2, "algo-1", 29500),
            id="sagemaker-rank-is-index-in-sorted-hosts",
        ),
        pytest.param(
            {"SM_HOSTS": SM_HOSTS, "SM_CURRENT_HOST": "algo-1"},
            (3, 0, "algo-1", 29500),
            id="sagemaker-first-host-is-master",
        ),
        pytest.param(
            {"JOB_COMPLETION_INDEX": "1", "NNODES": "2", "MASTER_ADDR": "train-0.train-svc"},
            (2, 1, "train-0.train-svc", 29500),
            id="kubernetes-indexed-job",
        ),
        pytest.param(
            {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "31000"},
            (2, 1, "127.0.0.1", 31000),
            id="ours-local-processes",
        ),
        pytest.param(
            {"SM_HOSTS": SM_HOSTS, "SM_CURRENT_HOST": "algo-2", "MASTER_PORT": "7777", "MASTER_ADDR": "10.9.9.9"},
            (3, 1, "10.9.9.9", 7777),
            id="ours-win-over-derived-per-variable",
        ),
    ],
)
def test_rendezvous_normalisation(environ: dict[str, str], expected: tuple[int, int, str, int]) -> None:
    env = job_env(environ)
    assert (env.nnodes, env.node_rank, env.master_addr, env.master_port) == expected
    assert export_torchrun_env(env) == {
        "NNODES": str(expected[0]),
        "NODE_RANK": str(expected[1]),
        "MASTER_ADDR": expected[2],
        "MASTER_PORT": str(expected[3]),
    }


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROVIDER_ATTEMPT", "5")
    monkeypatch.setenv("NNODES", "1")
    monkeypatch.delenv("NODE_RANK", raising=False)
    assert job_env().attempt == 5


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"NODE_RANK": "one", "NNODES": "2"}, "NODE_RANK='one' is not an integer"),
        ({"NODE_RANK": "2", "NNODES": "2"}, "NODE_RANK='2' must be below the number of nodes 2"),
        ({"NODE_RANK": "1"}, "NODE_RANK='1' must be below the number of nodes 1"),
        ({"NODE_RANK": "-1", "NNODES": "2"}, "NODE_RANK='-1' must be >= 0"),
        ({"NNODES": "0"}, "NNODES='0' must be >= 1"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 must be <= 65535"),
        ({"GPU_PROVIDER_ATTEMPT": "0"}, "GPU_PROVIDER_ATTEMPT='0' must be >= 1"),
        ({"GPU_PROVIDER_CAPACITY": "preemptible"}, "GPU_PROVIDER_CAPACITY='preemptible' is not allowed"),
        ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX='3' must be below the number of nodes 1"),
        ({"AWS_BATCH_JOB_NUM_NODES": "x"}, "AWS_BATCH_JOB_NUM_NODES='x' is not an integer"),
        (
            {"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1", "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0"},
            "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set on AWS Batch node 1",
        ),
        ({"SM_HOSTS": "algo-1,algo-2"}, "SM_HOSTS='algo-1,algo-2' is not a JSON list"),
        ({"SM_HOSTS": "[]"}, "SM_HOSTS='[]' is not a non-empty JSON list"),
        ({"SM_HOSTS": SM_HOSTS, "SM_CURRENT_HOST": "algo-9"}, "SM_CURRENT_HOST='algo-9' is not one of SM_HOSTS"),
    ],
)
def test_bad_values_name_the_variable_and_value(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        job_env(environ)
    assert message in str(info.value)


def test_capacity_spelling_is_normalised() -> None:
    assert job_env({"GPU_PROVIDER_CAPACITY": "ON_DEMAND"}).capacity == "on-demand"


def test_jobenv_validates_direct_construction() -> None:
    with pytest.raises(ValueError, match="node_rank must be in"):
        JobEnv(nnodes=2, node_rank=2)
    with pytest.raises(ValueError, match="capacity 'reserved' is not allowed"):
        JobEnv(capacity="reserved")


def test_sagemaker_resourceconfig_json_gives_the_rendezvous_without_sm_variables(tmp_path: Path) -> None:
    config = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}
    (tmp_path / "resourceconfig.json").write_text(json.dumps(config))
    env = job_env({"SM_INPUT_CONFIG_DIR": str(tmp_path)})
    assert (env.nnodes, env.node_rank, env.master_addr) == (2, 1, "algo-1")
    # our own variables still win, one at a time
    assert job_env({"SM_INPUT_CONFIG_DIR": str(tmp_path), "NODE_RANK": "0"}).node_rank == 0
    (tmp_path / "resourceconfig.json").write_text(json.dumps({"hosts": ["algo-1"]}))
    with pytest.raises(ValueError, match="has no current_host"):
        job_env({"SM_INPUT_CONFIG_DIR": str(tmp_path)})
    assert job_env({"SM_INPUT_CONFIG_DIR": str(tmp_path / "missing")}).nnodes == 1  # no file: a single node
