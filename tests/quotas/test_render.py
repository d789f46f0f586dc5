"""`gpu-provider quotas render`: the Batch fair-share policy is a valid CreateSchedulingPolicy request
(botocore's own request model, and moto accepts it), each team's ResourceQuota passes kubernetes-validate
(strict), and the Kueue queues carry each team's GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import botocore.session
import kubernetes_validate
import pytest
import yaml
from botocore.validate import ParamValidator

from gpu_provider.cli import main
from gpu_provider.quotas.render import share_weight
from tests.batch_world import BatchWorld
from tests.quotas.test_quota_file import GOOD


@pytest.fixture
def quota_path(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD)
    return path


def _render(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> str:
    assert main(["quotas", "render", "--quota-file", str(path), *args]) == 0
    return capsys.readouterr().out


def test_the_batch_policy_is_a_valid_create_scheduling_policy_request(
    capsys: pytest.CaptureFixture[str], quota_path: Path
) -> None:
    policy = json.loads(
        _render(capsys, quota_path, "--batch", "--policy-name", "teams", "--share-decay-seconds", "600")
    )
    model = botocore.session.get_session().get_service_model("batch").operation_model("CreateSchedulingPolicy")
    report = ParamValidator().validate(policy, model.input_shape)
    assert not report.has_errors(), report.generate_report()
    shares = {s["shareIdentifier"]: s["weightFactor"] for s in policy["fairsharePolicy"]["shareDistribution"]}
    # share = 1/weightFactor: nlp_core (16 GPUs) 1.0, vision (8) 2.0, ml-infra (2) 8.0
    assert shares == {"vision": 2.0, "ml_infra": 8.0, "NLP": 1.0}
    assert policy["name"] == "teams" and policy["fairsharePolicy"]["shareDecaySeconds"] == 600
    # every value inside Batch's documented bounds (the model does not carry them)
    assert all(0.0001 <= w <= 999.9999 for w in shares.values())


def test_the_batch_policy_is_accepted_by_the_batch_api(
    capsys: pytest.CaptureFixture[str], quota_path: Path, batch: BatchWorld
) -> None:
    # the session's Batch emulator, not moto's mock_aws: that resets moto's state in this process, and with
    # it the queues of the emulator every Batch test here shares
    policy = json.loads(_render(capsys, quota_path, "--batch", "--policy-name", "teams-render-test"))
    client = batch.emulator.client("batch")
    arn = client.create_scheduling_policy(**policy)["arn"]
    (stored,) = client.describe_scheduling_policies(arns=[arn])["schedulingPolicies"]
    assert stored["fairsharePolicy"]["shareDistribution"] == policy["fairsharePolicy"]["shareDistribution"]


def test_share_weights_stay_in_batchs_range() -> None:
    assert share_weight(0, 8) == 999.9999  # a team with no GPUs gets the smallest share Batch allows
    assert share_weight(1, 10**6) == 999.9999
    assert share_weight(8, 8) == 1.0 and share_weight(3, 8) == 2.6667


def test_resource_quotas_pass_strict_kubernetes_validation(
    capsys: pytest.CaptureFixture[str], quota_path: Path
) -> None:
    docs = list(yaml.safe_load_all(_render(capsys, quota_path, "--kubernetes")))
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    assert [(d["metadata"]["namespace"], d["spec"]["hard"]) for d in docs] == [
        ("vision", {"requests.nvidia.com/gpu": "8"}),
        ("ml-infra", {"requests.nvidia.com/gpu": "2"}),
        ("nlp", {"requests.nvidia.com/gpu": "16"}),
    ]


def test_kueue_queues_give_each_team_its_gpus_in_the_cohort(
    capsys: pytest.CaptureFixture[str], quota_path: Path
) -> None:
    docs = list(yaml.safe_load_all(_render(capsys, quota_path, "--kueue")))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ResourceFlavor"] + ["ClusterQueue", "LocalQueue"] * 3
    cluster_queues = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ClusterQueue"}
    assert set(cluster_queues) == {"gpu-vision", "gpu-ml-infra", "gpu-nlp"}
    nlp = cluster_queues["gpu-nlp"]
    assert nlp["cohort"] == "gpus"
    assert nlp["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "nlp"}}
    assert nlp["resourceGroups"][0]["flavors"][0]["resources"] == [{"name": "nvidia.com/gpu", "nominalQuota": 16}]
    local = [d for d in docs if d["kind"] == "LocalQueue"]
    assert {(d["metadata"]["namespace"], d["spec"]["clusterQueue"]) for d in local} == {
        ("vision", "gpu-vision"),
        ("ml-infra", "gpu-ml-infra"),
        ("nlp", "gpu-nlp"),
    }


def test_cli_validate_lists_teams_and_a_bad_file_exits_1_with_the_field(
    capsys: pytest.CaptureFixture[str], quota_path: Path, tmp_path: Path
) -> None:
    assert main(["quotas", "validate", "--quota-file", str(quota_path)]) == 0
    out = capsys.readouterr().out
    assert "vision: 8 GPUs, pool gpu_vision, namespace vision, share vision (max_priority 100, $5000/month)" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams:\n  vision:\n    gpus: many\n")
    assert main(["quotas", "render", "--kubernetes", "--quota-file", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpu-provider: error: quota file ") and "teams.vision.gpus='many'" in err
