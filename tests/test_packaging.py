"""What the package says about itself matches what it has: provider metadata, backends, dependencies."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

import pytest

import gpu_provider
from gpu_provider.backends import registered_backends
from gpu_provider.backends.aws.calls import s3_client_for
from gpu_provider.extras import BACKEND_EXTRAS, EXTRAS, MissingExtraError
from gpu_provider.get_provider_info import get_provider_info

PACKAGE = Path(gpu_provider.__file__).resolve().parent
#: services a description might name, and the backend that would have to exist for it
SERVICES = {"sagemaker": "sagemaker", "kubernetes": "kubernetes", "karpenter": "kubernetes", "eks": "kubernetes"}


def modules() -> dict[Path, ast.Module]:
    """Every module of the package, parsed."""
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def test_provider_info_names_no_backend_that_does_not_exist() -> None:
    text = json.dumps(get_provider_info()).lower()
    for word, backend in SERVICES.items():
        if re.search(rf"\b{word}\b", text):
            assert backend in registered_backends(), f"the provider info names {word}; no {backend} backend exists"


def test_every_documented_config_option_is_read_by_the_code() -> None:
    options = set(get_provider_info()["config"]["gpu_provider"]["options"])
    literals = {
        node.value
        for path, tree in modules().items()
        if path.name != "get_provider_info.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert options <= literals, f"documented but never read: {sorted(options - literals)}"


def test_only_the_kubernetes_backend_imports_kubernetes_and_only_when_used() -> None:
    """The cncf-kubernetes provider is an extra (``kubernetes``): the package must work without it, so
    only ``backends/kubernetes/`` imports it, inside the functions that build a client."""
    found = []
    for path, tree in modules().items():
        inside_functions = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            heavy = [
                name
                for name in names
                if name.split(".")[0] in ("kubernetes", "kubernetes_asyncio")
                or name.startswith("airflow.providers.cncf")
            ]
            allowed = path.relative_to(PACKAGE).parts[:2] == ("backends", "kubernetes") and id(node) in inside_functions
            found += [f"{path.relative_to(PACKAGE)}: {name}" for name in heavy if not allowed]
    assert found == []


REPO = Path(__file__).resolve().parents[1]


def _project() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_holds_no_backend_service_client() -> None:
    """``pip install airflow-provider-gpu`` is Airflow and the local backend; services come with extras."""
    project = _project()
    assert _names(project["dependencies"]) == {"apache-airflow"}
    extras = project["optional-dependencies"]
    # every extra the code names exists, and brings the modules the code checks for
    for extra, (modules, _) in EXTRAS.items():
        assert extra in extras, f"gpu_provider.extras names the extra {extra!r}; pyproject.toml has none"
        wanted = {"airflow.providers.amazon": "apache-airflow-providers-amazon", "boto3": "boto3"}
        wanted["airflow.providers.cncf.kubernetes"] = "apache-airflow-providers-cncf-kubernetes"
        wanted["kubernetes"] = "apache-airflow-providers-cncf-kubernetes"  # the provider requires the client
        wanted.update({"moto": "moto", "flask": "moto"})  # flask: moto[server]
        assert {wanted[m] for m in modules} <= _names(extras[extra]), extra
    backend_extras = set(BACKEND_EXTRAS.values())
    assert _names(extras["all"]) == set().union(*(_names(extras[e]) for e in backend_extras))
    # `make test` installs [dev]: it must hold everything every backend's tests need
    assert _names(extras["all"]) | _names(extras["examples"]) | _names(extras["testing"]) <= _names(extras["dev"])
    assert "moto" not in _names(extras["all"]), "[all] is for deployments: the emulators stay in [testing]"


def test_every_registered_backend_that_needs_a_service_names_its_extra() -> None:
    from gpu_provider.backends.base import _REGISTRY

    for name, path in _REGISTRY.items():
        if name != "local":
            assert name in BACKEND_EXTRAS, f"backend {name!r} ({path}) has no extra in gpu_provider.extras"


def test_a_missing_backend_extra_is_named_when_the_dag_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_provider.operators import GpuJobOperator

    monkeypatch.setitem(sys.modules, "boto3", None)  # as if boto3 were not installed
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'airflow-provider-gpu[batch]'")) as err:
        GpuJobOperator(task_id="t", command=["true"], backend="batch")
    assert "backend='batch' needs the amazon provider and boto3" in str(err.value)
    assert "missing: boto3" in str(err.value)
    with pytest.raises(MissingExtraError, match=re.escape("airflow-provider-gpu[aws]")):
        s3_client_for("s3://bucket/checkpoints")


def test_the_lowest_supported_set_pins_exactly_the_declared_lower_bounds() -> None:
    """``make test-lowest`` installs constraints/lowest/: the set must still be the lower bounds of pyproject."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from lowest_deps import lower_bounds
    finally:
        sys.path.remove(str(REPO / "scripts"))
    files = sorted((REPO / "constraints" / "lowest").glob("py3.*.txt"))
    assert files, "no lowest supported set recorded: make constraints-lowest"
    bounds = lower_bounds()
    assert bounds["apache-airflow"] == "3.3.0"
    for path in files:
        pins = dict(
            line.lower().split("==", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")
        )
        for name, version in bounds.items():
            assert pins.get(name) == version, f"{path.name}: {name}=={pins.get(name)}, pyproject says >={version}"


#: the one relative link the README may have: the GPU page's picture, which GitHub shows from the repository
#: (PyPI shows its alt text: the project declares no public home to make the link absolute with)
README_PICTURE = "docs/gpu-page.png"


def test_the_readme_has_no_link_that_breaks_outside_the_repository() -> None:
    """PyPI shows the README as the project page: a relative link there leads nowhere."""
    text = (REPO / "README.md").read_text()
    links = re.findall(r"(!?)\[[^\]]*\]\(([^)]+)\)", text)
    relative = [
        t for bang, t in links if not t.startswith(("#", "https://", "http://")) and (bang, t) != ("!", README_PICTURE)
    ]
    assert relative == []


def test_the_readme_shows_the_gpu_page_near_the_top_from_the_screenshot_test() -> None:
    """The front page shows the GPU page: the picture the browser test renews (GPU_PAGE_SCREENSHOT), the one
    the docs pages show, before the quick start."""
    text = (REPO / "README.md").read_text()
    picture = f"]({README_PICTURE})"
    assert picture in text and text.index(picture) < text.index("## Quick start")
    assert text[text.rindex("![", 0, text.index(picture)) : text.index(picture)].startswith("![The GPU page")
    png = (REPO / README_PICTURE).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    screenshot_test = (REPO / "tests" / "integration" / "test_ui_page.py").read_text()
    assert f"GPU_PAGE_SCREENSHOT={README_PICTURE}" in screenshot_test
    for page in ("docs/how-to/gpu-page-in-the-ui.md", "docs/reference/gpu-page.md"):
        assert "../gpu-page.png" in (REPO / page).read_text(), page
