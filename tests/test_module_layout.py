"""The layout issue 27 set out: names defined once, old import paths kept after modules were split,
short modules, and no import cycle in the testing helpers (read from the source, not by running it)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "gpu_provider"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("name", ["MAX_POLL_INTERVAL_S", "DEFER_TIMEOUT_SLACK_S", "STATE_KEY"])
def test_shared_names_are_defined_once_in_names_py(name: str) -> None:
    assignment = re.compile(rf"^_?{name}\s*(:[^=]*)?=", re.MULTILINE)
    defined = [str(p.relative_to(REPO)) for p in _sources() if assignment.search(p.read_text())]
    assert defined == ["gpu_provider/names.py"], defined


def test_the_old_places_still_export_them() -> None:
    from gpu_provider import names
    from gpu_provider.operators import gpu_job
    from gpu_provider.sensors import checkpoint, spot_capacity
    from gpu_provider.sensors import gpu_job as sensor

    for module in (gpu_job, sensor, checkpoint, spot_capacity):
        assert module.MAX_POLL_INTERVAL_S is names.MAX_POLL_INTERVAL_S == 3600.0, module.__name__
    assert gpu_job.STATE_KEY is names.STATE_KEY == "gpu_provider_attempts"
    assert gpu_job.DEFER_TIMEOUT_SLACK_S is sensor.DEFER_TIMEOUT_SLACK_S is names.DEFER_TIMEOUT_SLACK_S == 300.0


#: every name ``gpu_provider.backends.base`` defined before it was split into ``backends/contract/``
BASE_NAMES = [
    "Backend",
    "Capabilities",
    "DEFAULT_BACKEND",
    "EventSink",
    "EventSource",
    "JobHandle",
    "JobIdentity",
    "JobRequest",
    "JobState",
    "JobStatus",
    "LOG_READ_BYTES",
    "LogChunk",
    "MAX_LOG_LINE_CHARS",
    "OwnedJob",
    "OwnerRead",
    "PollResult",
    "TaskKey",
    "backend_class",
    "backend_options",
    "check_backend_name",
    "clip_line",
    "lookup_key",
    "map_state",
    "provider_config",
    "register_backend",
    "registered_backends",
    "resolve_backend",
    "task_from_tags",
    "_REGISTRY",
    "_TERMINAL",
    "_NAME_UNSAFE",
    "_known_fields",
    "_slug",
]


def test_backends_base_still_exports_every_name_it_defined() -> None:
    base = importlib.import_module("gpu_provider.backends.base")
    missing = [name for name in BASE_NAMES if not hasattr(base, name)]
    assert not missing
    from gpu_provider.backends.contract import registry

    assert base._REGISTRY is registry._REGISTRY, "one registry: registering through either path is seen by both"
    defined_in = {getattr(base, n).__module__ for n in BASE_NAMES if isinstance(getattr(base, n), type)}
    assert defined_in and all(m.startswith("gpu_provider.backends.contract.") for m in defined_in), defined_in


#: the public names of ``gpu_provider.runtime.checkpoint`` before it became a package
CHECKPOINT_NAMES = [
    "CHECKPOINT_PREFIX",
    "ENV_CHECKPOINT_KEEP",
    "KEEP_FROM_ENV",
    "LATEST",
    "S3_STAGING_PREFIX",
    "SCHEMES",
    "STALE_TEMP_AGE_S",
    "TEMP_PREFIX",
    "CheckpointWriter",
    "checkpoint_name",
    "checkpoint_step",
    "latest_checkpoint",
    "parse_uri",
    "published_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
    "save_checkpoint_files",
]


def test_runtime_checkpoint_still_exports_every_public_name() -> None:
    checkpoint = importlib.import_module("gpu_provider.runtime.checkpoint")
    assert [n for n in CHECKPOINT_NAMES if not hasattr(checkpoint, n)] == []
    assert sorted(checkpoint.__all__) == sorted(CHECKPOINT_NAMES)
    assert (PACKAGE / "runtime" / "checkpoint").is_dir()


def test_the_airflow_api_client_has_its_own_module() -> None:
    from gpu_provider import airflow_api
    from gpu_provider.quotas import pools
    from gpu_provider.spend import reaper

    assert reaper.AirflowApi is airflow_api.AirflowApi and reaper.AirflowApiError is airflow_api.AirflowApiError
    assert pools.AirflowApi is airflow_api.AirflowApi
    assert "from gpu_provider.spend.reaper import" not in (PACKAGE / "quotas" / "pools.py").read_text()


def _imports(path: Path) -> set[str]:
    """Every ``gpu_provider`` module ``path`` imports, at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("gpu_provider.")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_testing_helpers_import_no_cycle() -> None:
    modules = {_module_name(p): p for p in sorted((PACKAGE / "testing").glob("*.py"))}
    graph = {name: _imports(path) & set(modules) for name, path in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    cycles = sorted(f"{a} -> {b}" for a, edges in graph.items() for b in edges if reaches(b, a))
    assert cycles == [], cycles


def test_the_split_modules_are_short() -> None:
    split = [
        *sorted((PACKAGE / "runtime" / "checkpoint").glob("*.py")),
        PACKAGE / "backends" / "base.py",
        *sorted((PACKAGE / "backends" / "contract").glob("*.py")),
        *sorted((PACKAGE / "operators").glob("*.py")),
        PACKAGE / "airflow_api.py",
        PACKAGE / "spend" / "reaper.py",
        PACKAGE / "testing" / "dagrun.py",
        PACKAGE / "testing" / "dagchild.py",
        PACKAGE / "testing" / "check.py",
        PACKAGE / "testing" / "check_dag.py",
        PACKAGE / "testing" / "findings.py",
    ]
    split += [PACKAGE / "engine" / "places.py", PACKAGE / "engine" / "calls.py", PACKAGE / "engine" / "spot_moves.py"]
    split += [PACKAGE / "engine" / "restart_stops.py"]
    # every product module stays short, not only the split ones; the provider metadata is one literal
    # (the config section's keys, each with its description), read by Airflow, not by people
    every = [p for p in PACKAGE.rglob("*.py") if p.name != "get_provider_info.py"]
    long = {str(p.relative_to(REPO)): n for p in every if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
    for path in split:  # each says in its first line what it holds
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and doc.strip(), f"{path.relative_to(REPO)} has no module docstring"
