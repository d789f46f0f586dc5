"""The team quota file: what it accepts, what it refuses (with the field, value and what is allowed), and
where it reaches: the operator's parse-time checks and spend control's team budgets."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpu_provider.quotas.file import QuotaFileError, configured_quotas, load_quotas, parse_quotas

GOOD = """
teams:
  vision:
    gpus: 8
    max_priority: 100
    monthly_budget_usd: 5000
  ml-infra:
    gpus: 2
  nlp_core:
    gpus: 16
    namespace: nlp
    share_identifier: NLP
kueue:
  cohort: gpus
"""


def test_a_good_file_reads_into_teams_with_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD)
    quotas = load_quotas(path)
    assert quotas.names == ["vision", "ml-infra", "nlp_core"]
    vision, infra, nlp = quotas.teams
    assert (vision.gpus, vision.max_priority, vision.monthly_budget_usd, vision.pool) == (8, 100, 5000.0, "gpu_vision")
    # defaults: namespace with '-' for '_', Batch share identifier with '_' for '-'
    assert (infra.namespace, infra.share_identifier, infra.max_priority) == ("ml-infra", "ml_infra", None)
    assert (nlp.namespace, nlp.share_identifier) == ("nlp", "NLP")
    assert quotas.budgets() == {"vision": 5000.0}
    assert quotas.kueue_cohort == "gpus" and quotas.kueue_flavor == "gpu"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "top level=[]: must be a mapping with a 'teams' key"),
        ({"teams": {}}, "teams={}: must map each team"),
        ({"teams": {"a": {"gpus": 1}}, "pools": 1}, "unknown key(s) pools; allowed: teams, kueue"),
        ({"teams": {"Vision": {"gpus": 1}}}, "teams key='Vision': a team is 1-63 lower-case letters"),
        ({"teams": {"a": 4}}, "teams.a=4: must be a mapping with at least 'gpus'"),
        ({"teams": {"a": {}}}, "teams.a.gpus is missing"),
        ({"teams": {"a": {"gpus": -1}}}, "teams.a.gpus=-1: must be a whole number of GPUs from 0 to 100000"),
        ({"teams": {"a": {"gpus": 2.5}}}, "teams.a.gpus=2.5: must be a whole number of GPUs"),
        ({"teams": {"a": {"gpus": True}}}, "teams.a.gpus=True: must be a whole number"),
        ({"teams": {"a": {"gpus": 1, "gpu": 2}}}, "unknown key(s) teams.a.gpu; allowed in teams.a: gpus, max_priority"),
        ({"teams": {"a": {"gpus": 1, "max_priority": "high"}}}, "teams.a.max_priority='high': must be a whole number"),
        (
            {"teams": {"a": {"gpus": 1, "monthly_budget_usd": -5}}},
            "teams.a.monthly_budget_usd=-5: must be US dollars from 0",
        ),
        ({"teams": {"a": {"gpus": 1, "namespace": "A_B"}}}, "teams.a.namespace='A_B': must be a Kubernetes namespace"),
        (
            {"teams": {"a": {"gpus": 1, "share_identifier": "a-b"}}},
            "teams.a.share_identifier='a-b': must be 1-255 letters, digits or '_'",
        ),
        (
            {"teams": {"a-b": {"gpus": 1}, "a_b": {"gpus": 1, "namespace": "x"}}},
            "teams.a_b.share_identifier='a_b': is team 'a-b''s Batch share identifier too",
        ),
        (
            {"teams": {"a": {"gpus": 1}}, "kueue": {"cohort": "Big Pool"}},
            "kueue.cohort='Big Pool': must be a Kubernetes",
        ),
    ],
)
def test_a_bad_file_names_the_field_the_value_and_what_is_allowed(data: Any, message: str) -> None:
    with pytest.raises(QuotaFileError) as err:
        parse_quotas(data, "q.yaml")
    assert str(err.value).startswith("quota file q.yaml: ") and message in str(err.value), str(err.value)


def test_unreadable_and_invalid_yaml_say_so(tmp_path: Path) -> None:
    with pytest.raises(QuotaFileError, match="cannot be read"):
        load_quotas(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams: [a, b\n")
    with pytest.raises(QuotaFileError, match="is not valid YAML"):
        load_quotas(bad)


@pytest.fixture
def quota_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(GOOD)
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__QUOTA_FILE", str(path))
    return path


def test_the_operator_refuses_a_team_not_in_the_quota_file_when_the_dag_is_parsed(quota_file: Path) -> None:
    from gpu_provider.operators import GpuJobOperator

    ok = GpuJobOperator(task_id="ok", command=["true"], team="vision", priority=100)
    assert ok.pool == "gpu_vision"
    with pytest.raises(ValueError) as err:
        GpuJobOperator(task_id="t", command=["true"], team="audio")
    assert f"team='audio' is not in the quota file {quota_file} (teams: vision, ml-infra, nlp_core)" in str(err.value)
    assert "would wait forever for a pool gpu_audio" in str(err.value)
    with pytest.raises(ValueError, match=r"priority=101 is above team 'vision''s ceiling max_priority=100"):
        GpuJobOperator(task_id="t", command=["true"], team="vision", priority=101)
    GpuJobOperator(task_id="free", command=["true"], team="ml-infra", priority=10**6)  # no ceiling
    GpuJobOperator(task_id="noteam", command=["true"])  # no team: no pool, nothing to check


def test_the_file_is_read_again_when_it_changes_and_a_missing_one_names_the_config_key(
    quota_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = configured_quotas()
    assert first is not None and configured_quotas() is first  # cached while unchanged
    quota_file.write_text("teams:\n  solo:\n    gpus: 1\n")
    again = configured_quotas()
    assert again is not None and again.names == ["solo"]
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__QUOTA_FILE", str(quota_file.parent / "gone.yaml"))
    with pytest.raises(QuotaFileError, match=r"\[gpu_provider\] quota_file='.*gone.yaml' cannot be read"):
        configured_quotas()


def test_spend_control_takes_team_budgets_from_the_quota_file_and_the_config_key_wins(
    quota_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.job import GpuResources
    from gpu_provider.recovery import resolve_capacity
    from gpu_provider.spend.budget import SpendControl

    backend, resources, policy = LocalBackend(), GpuResources(gpus=1), resolve_capacity("on_demand")
    log = logging.getLogger("test")
    assert SpendControl.from_config(backend, resources, policy, log=log).team_budgets == {"vision": 5000.0}
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__TEAM_MONTHLY_BUDGET_USD", '{"vision": 10, "nlp_core": 7}')
    budgets = SpendControl.from_config(backend, resources, policy, log=log).team_budgets
    assert budgets == {"vision": 10.0, "nlp_core": 7.0}
