"""docker/: the compose file is accepted by `docker-compose config` (Debian's docker-compose parses and
validates it without a daemon), and each Dockerfile has what matters: a pinned base image, a non-root
user at the end, no secrets, and the build context it expects (hadolint is packaged neither by Debian
nor on PyPI here, so these are checked directly)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness import REPO
from tests.system_packages import ensure

DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*/Dockerfile"))
SECRET = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|ACCESS_KEY|PRIVATE_KEY|API_KEY)", re.IGNORECASE)


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_compose_file_is_accepted_by_docker_compose_config() -> None:
    reason = ensure(["docker-compose"])
    if reason:
        pytest.skip(reason)
    binary = shutil.which("docker-compose") or "/usr/bin/docker-compose"
    done = subprocess.run(
        [binary, "-f", str(DOCKER / "docker-compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    services = config["services"]
    assert set(services) >= {
        "postgres",
        "redis",
        "airflow-init",
        "api-server",
        "scheduler",
        "dag-processor",
        "triggerer",
        "airflow-worker",
        "aws-emulator",
    }
    for name in ("api-server", "scheduler", "dag-processor", "triggerer", "airflow-worker"):
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"), name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:"), name
        mounts = [str(v.get("target") if isinstance(v, dict) else v.split(":")[1]) for v in services[name]["volumes"]]
        assert "/opt/airflow/dags" in mounts, (name, mounts)
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    assert services["api-server"]["ports"][0]["published"] in (8080, "8080") or "8080" in str(
        services["api-server"]["ports"]
    )
    assert "aws-emulator:5000" in services["scheduler"]["environment"]["AIRFLOW_CONN_AWS_DEFAULT"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.parent.name for p in DOCKERFILES])
def test_each_dockerfile_pins_its_base_runs_as_non_root_and_holds_no_secret(path: Path) -> None:
    steps = _instructions(path)
    args = {}
    for word, rest in steps:
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args.setdefault(name, value)
    (base,) = [rest for word, rest in steps if word == "FROM"]
    image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base.split()[0])
    name, _, tag = image.partition(":")
    assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{path}: base {image} is not pinned to a version"
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), f"{path}: the image ends as root ({users})"
    for word, rest in steps:
        if word in ("ENV", "ARG"):
            assert not SECRET.search(rest.split("=")[0]), f"{path}: {word} {rest} looks like a secret"
        if word in ("COPY", "ADD"):
            assert ".env" not in rest.split() and "id_rsa" not in rest, f"{path}: copies a secret: {rest}"
    # the build context is the repository root: what it copies exists there
    for word, rest in steps:
        if word == "COPY":
            sources = [s for s in rest.split()[:-1] if not s.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"{path}: COPY {source}: not in the repository"


def test_the_pool_quota_file_of_the_stack_is_valid() -> None:
    from gpu_provider.quotas.file import load_quotas

    assert load_quotas(DOCKER / "gpu_quotas.yaml").names == ["research", "vision"]


AIRFLOW_SERVICES = ("airflow-init", "api-server", "scheduler", "dag-processor", "triggerer", "airflow-worker")


def _mounts(service: dict[str, object]) -> dict[str, str]:
    """target path -> source (a named volume or a host path) of a service's volumes (short syntax)."""
    out = {}
    for volume in service.get("volumes") or []:  # type: ignore[attr-defined]
        source, target = str(volume).split(":")[:2]
        out[target] = source
    return out


def test_batch_jobs_in_the_emulator_share_the_data_and_checkpoints_with_airflow() -> None:
    """The emulator runs Batch jobs in its own container: the example's file:// data root (checkpoints are
    under it) must be one volume at one path in the emulator and in every Airflow container, owned by the
    same user; and the example's Batch stages need GPU_PIPELINE_IMAGE. Read from the YAML (no daemon)."""
    from urllib.parse import urlsplit

    compose = yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())
    services = compose["services"]
    data_root = services["scheduler"]["environment"]["GPU_PIPELINE_DATA_ROOT"]
    path = urlsplit(data_root).path
    assert data_root.startswith("file:///") and path
    emulator = _mounts(services["aws-emulator"])
    assert path in emulator, f"the emulator does not mount {path}: {emulator}"
    volume = emulator[path]
    assert volume in compose["volumes"], f"{volume} is not a named volume"
    for name in AIRFLOW_SERVICES:
        env = services[name]["environment"]
        assert env["GPU_PIPELINE_DATA_ROOT"] == data_root, name
        assert env.get("GPU_PIPELINE_IMAGE"), f"{name}: the example's Batch stages need GPU_PIPELINE_IMAGE"
        assert _mounts(services[name]).get(path) == volume, f"{name} does not mount {volume} at {path}"
        assert services[name]["user"] == services["aws-emulator"]["user"], name
    # a new named volume takes the owner of the image's folder it is mounted on: both images make it
    # the Airflow user's
    airflow_image = (DOCKER / "airflow" / "Dockerfile").read_text()
    assert path in airflow_image
    emulator_image = (DOCKER / "aws-emulator" / "Dockerfile").read_text()
    assert f"chown 50000:0 {path}" in emulator_image and services["aws-emulator"]["user"] == "50000:0"
