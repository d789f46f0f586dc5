"""The documentation says what the code has: every argument and config key documented, nothing documented missing.

The operators' and sensors' reference pages are autodoc of their docstrings, and the ``[gpu_provider]`` reference
is generated from ``get_provider_info()`` (docs/_ext/gpu_provider_docs.py), so those can only drift where a
docstring or a hand-written page does: the argument tables of the how-to and reference pages, the ``:param:``
lines autodoc renders, and every ``[gpu_provider] key`` a page or the README mentions. ``make docs`` builds the
site itself (warnings as errors); these checks need no Sphinx.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpu_provider.get_provider_info import get_provider_info
from gpu_provider.operators import GpuJobOperator, GpuReaperOperator
from gpu_provider.sensors import CheckpointSensor, GpuJobSensor, SpotCapacitySensor

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

#: (class, the page with its argument table, the heading the table follows; None: the page's first table)
DOCUMENTED = [
    (GpuJobOperator, "reference/operator-arguments.md", None),
    (GpuReaperOperator, "how-to/run-the-reaper.md", None),
    (CheckpointSensor, "how-to/sensors.md", "## `CheckpointSensor`"),
    (GpuJobSensor, "how-to/sensors.md", "## `GpuJobSensor`"),
    (SpotCapacitySensor, "how-to/sensors.md", "## `SpotCapacitySensor`"),
]


def _arguments(cls: type) -> set[str]:
    """The keyword arguments the class's own constructor takes (Airflow's ``**kwargs`` aside)."""
    params = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    return {p.name for p in params if p.name != "self" and p.kind is not p.VAR_KEYWORD}


def _base_arguments(cls: type) -> set[str]:
    """The arguments of the Airflow base classes (BaseOperator, BaseSensorOperator) below ``cls``."""
    names: set[str] = set()
    for base in cls.__mro__[1:]:
        if base.__module__.startswith("airflow") and "__init__" in vars(base):
            names |= {p for p in inspect.signature(base.__init__).parameters if p not in ("self", "args", "kwargs")}
    return names


def table_arguments(text: str) -> set[str]:
    """The argument names of the first ``| argument | ...`` table in ``text`` (every name in its first cells)."""
    rows = re.search(r"^\| argument \|.*?\n((?:\|.*\n?)+)", text, re.M)
    assert rows is not None, "no '| argument | ...' table"
    names: set[str] = set()
    for line in rows.group(1).splitlines()[1:]:  # the first line is the |---| rule
        first = line.strip().strip("|").split("|")[0]
        names |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", first))
    return names


def _section(page: str, heading: str | None) -> str:
    text = (DOCS / page).read_text()
    if heading is None:
        return text
    assert heading in text, f"{page}: no heading {heading!r}"
    after = text.split(heading, 1)[1]
    return re.split(r"^## ", after, maxsplit=1, flags=re.M)[0]


@pytest.mark.parametrize(("cls", "page", "heading"), DOCUMENTED, ids=[c.__name__ for c, _, _ in DOCUMENTED])
def test_every_argument_is_in_its_table_and_every_table_row_is_an_argument(
    cls: type, page: str, heading: str | None
) -> None:
    documented = table_arguments(_section(page, heading))
    own = _arguments(cls)
    assert own - documented == set(), f"{cls.__name__} arguments missing from the table in docs/{page}"
    # rows for Airflow's own arguments (timeout, with the default this class gives it) are fine
    unknown = documented - own - _base_arguments(cls)
    assert unknown == set(), f"docs/{page} documents arguments {cls.__name__} does not take"


@pytest.mark.parametrize(("cls", "page", "heading"), DOCUMENTED, ids=[c.__name__ for c, _, _ in DOCUMENTED])
def test_the_docstring_autodoc_renders_has_a_param_line_for_exactly_the_arguments(
    cls: type, page: str, heading: str | None
) -> None:
    params = set(re.findall(r":param (\w+):", cls.__doc__ or ""))
    assert params == _arguments(cls), f"{cls.__name__}'s :param: lines and its arguments differ"


def _extension() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_provider_docs", DOCS / "_ext" / "gpu_provider_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_provider_docs", module)
    spec.loader.exec_module(module)
    return module


def _config_keys() -> set[str]:
    return set(get_provider_info()["config"]["gpu_provider"]["options"])


def test_the_config_reference_is_generated_from_every_key_with_a_description() -> None:
    generated = _extension().config_options()
    assert set(generated) == _config_keys()
    for key, info in generated.items():
        assert str(info.get("description", "")).strip(), f"[gpu_provider] {key} has no description"
        assert "version_added" in info, f"[gpu_provider] {key} does not say since when it exists"
    page = (DOCS / "reference" / "configuration.md").read_text()
    assert "```{gpu-config-options}" in page, "the configuration page no longer uses the generated list"


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]


#: how a page names a key: "[gpu_provider] key" (also inside backticks; "batch_*" for a family of keys) or its
#: environment variable
MENTION = re.compile(r"\[gpu_provider\]\s+`?([a-z][a-z0-9_]*\*?)|AIRFLOW__GPU_PROVIDER__([A-Z][A-Z0-9_]*)")


def mentioned_keys(text: str) -> set[str]:
    return {(section or env.lower()) for section, env in MENTION.findall(text)}


def _exists(key: str, keys: set[str]) -> bool:
    if key.endswith("*"):
        return any(k.startswith(key[:-1]) for k in keys)
    return key in keys


def test_every_config_key_a_page_names_exists() -> None:
    keys = _config_keys()
    missing = {
        f"{page.relative_to(REPO)}: {key}"
        for page in _pages()
        for key in mentioned_keys(page.read_text())
        if not _exists(key, keys)
    }
    assert missing == set()


def test_the_mention_check_would_see_a_key_that_does_not_exist() -> None:
    text = "Set `[gpu_provider] poll_intervall`, `[gpu_provider] slurm_*` or AIRFLOW__GPU_PROVIDER__DEFAULT_BACKEND."
    assert mentioned_keys(text) == {"poll_intervall", "slurm_*", "default_backend"}
    keys = _config_keys()
    assert not _exists("poll_intervall", keys) and not _exists("slurm_*", keys)
    assert _exists("default_backend", keys) and _exists("batch_*", keys)


def test_the_cli_reference_has_every_command() -> None:
    from gpu_provider.cli import COMMANDS

    commands = _extension().cli_commands()
    paths = {" ".join(path) for path, _ in commands}
    assert {name for name, _ in COMMANDS} <= paths
    assert all(text.startswith("usage: gpu-provider") for _, text in commands)
    assert "--dag" in dict((" ".join(p), t) for p, t in commands)["check"], "the checker's own options"


def test_the_external_link_check_refuses_malformed_links() -> None:
    malformed = _extension().malformed_link
    assert malformed("https://airflow.apache.org/docs/") is None
    assert malformed("http://localhost:8080") is None
    assert malformed("htps://example.org") is not None
    assert malformed("https://exa mple.org") is not None
    assert malformed("https:///path") is not None
