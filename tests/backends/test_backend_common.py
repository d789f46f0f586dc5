"""The pieces every backend shares (``gpu_provider.backends.common``): the attempt number in a job's name
(the format of ``JobIdentity.name``), the ``master_port`` option, and ``mark``'s owner-try check, here
also through the backends that use them (Kubernetes, SageMaker; local for the owner-try check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_provider import names
from gpu_provider.backends.base import JobHandle, JobIdentity, TaskKey
from gpu_provider.backends.common import attempt_in_name, check_owner_try, mark_tags, port_option
from gpu_provider.backends.kubernetes import KubernetesBackend
from gpu_provider.backends.local import LocalBackend
from gpu_provider.backends.sagemaker import SageMakerBackend


def test_the_attempt_in_a_name_reads_what_the_identity_writes() -> None:
    identity = JobIdentity(TaskKey("dag", "task", "manual__1", 3), try_number=2, attempt=7, capacity=names.SPOT)
    assert attempt_in_name(identity.name) == 7
    assert attempt_in_name("gp-dag-task-t12-a34") == 34
    for other in ("gp-dag-task", "gp-dag-task-t1-a", "gp-dag-task-a1-t1", "gp-t1-a1-extra"):
        assert attempt_in_name(other) is None, other


@pytest.mark.parametrize(("value", "port"), [(29500, 29500), (" 1234 ", 1234), ("65535", 65535), (1, 1)])
def test_a_port_option_takes_numbers_and_text(value: object, port: int) -> None:
    assert port_option("master_port", value) == port


@pytest.mark.parametrize("value", [0, 65536, -1, "http", "", None, "29500.5"])
def test_a_port_option_names_the_field_and_value(value: object) -> None:
    with pytest.raises(ValueError, match=rf"master_port={value!r} must be a TCP port number \(1-65535\)"):
        port_option("master_port", value)
    with pytest.raises(ValueError, match=r"master_port=.* must be a TCP port number"):
        KubernetesBackend(master_port=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"master_port={value!r} must be a TCP port number \(1-65535\)"):
        SageMakerBackend(master_port=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -3, True, "2", 1.0])
def test_an_owner_try_is_an_airflow_try_number(value: object) -> None:
    with pytest.raises(ValueError, match=rf"owner_try={value!r} must be an Airflow try number"):
        check_owner_try(value)
    handle = JobHandle("kubernetes", "gp-x-t1-a1", "gp-x-t1-a1", 1, names.SPOT, 0.0, {"kind": "Pod"})
    # refused before any request: no API server is needed to see it
    with pytest.raises(ValueError, match=rf"owner_try={value!r} must be an Airflow try number"):
        KubernetesBackend().mark(handle, owner_try=value)  # type: ignore[arg-type]
    assert check_owner_try(1) == 1


@pytest.mark.parametrize("value", [0, -3, True, "2", 1.0])
def test_sagemaker_and_local_refuse_a_bad_owner_try_before_any_request(value: object, tmp_path: Path) -> None:
    for backend in (SageMakerBackend(), LocalBackend(state_dir=tmp_path)):
        handle = JobHandle(backend.name, "gp-x-t1-a1", "gp-x-t1-a1", 1, names.SPOT, 0.0, {"region": "eu-west-1"})
        with pytest.raises(ValueError, match=rf"owner_try={value!r} must be an Airflow try number"):
            backend.mark(handle, owner_try=value)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir()), "the local backend wrote a mark it refused"


def test_the_tags_of_a_mark_name_the_owner_try_and_the_collected_flag() -> None:
    assert mark_tags(None, False) == {}
    assert mark_tags(3, False) == {names.TAG_OWNER_TRY: "3"}
    assert mark_tags(None, True) == {names.TAG_COLLECTED: "true"}
    assert mark_tags(2, True) == {names.TAG_OWNER_TRY: "2", names.TAG_COLLECTED: "true"}
    with pytest.raises(ValueError, match=r"owner_try=0 must be an Airflow try number"):
        mark_tags(0, True)
