"""What the package says about itself matches what it has: provider metadata, backends, dependencies."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import gpu_provider
from gpu_provider.backends import registered_backends
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
