"""The public names: what ``gpu_provider.__all__`` promises imports (lazily: importing the package stays cheap),
and every ``from gpu_provider... import ...`` the README and the docs show imports from where they say."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gpu_provider

REPO = Path(__file__).resolve().parent.parent
#: ``from gpu_provider.x import A, B`` or ``from gpu_provider import (A,\n B,\n)``, in prose or code blocks
IMPORT = re.compile(r"from\s+(gpu_provider(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n`]*)")
NAME = re.compile(r"[A-Za-z_]\w*")


def documented_imports() -> dict[tuple[str, str], list[str]]:
    """``(module, name) -> [where it is shown]`` from README.md and docs/**/*.md."""
    found: dict[tuple[str, str], list[str]] = {}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        if not doc.is_file():
            continue
        text = doc.read_text()
        for match in IMPORT.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            names = re.sub(r"#[^\n]*", "", match.group(2)).strip("()")
            for part in names.split(","):
                name = part.strip().split(" as ")[0].strip()
                if NAME.fullmatch(name):
                    found.setdefault((match.group(1), name), []).append(f"{doc.relative_to(REPO)}:{line}")
    return found


def test_the_docs_show_imports_this_test_reads() -> None:
    found = documented_imports()
    assert ("gpu_provider.operators", "GpuJobOperator") in found or ("gpu_provider", "GpuJobOperator") in found
    assert len(found) >= 5, found


def test_every_name_the_docs_import_imports() -> None:
    found = documented_imports()
    pairs = sorted(found)
    code = (
        "import importlib, json\n"
        f"pairs = {pairs!r}\n"
        "bad = []\n"
        "for module, name in pairs:\n"
        "    try:\n"
        "        getattr(importlib.import_module(module), name)\n"
        "    except Exception as err:\n"
        "        bad.append([module, name, f'{type(err).__name__}: {err}'])\n"
        "print(json.dumps(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    bad = json.loads(done.stdout.strip().splitlines()[-1])
    assert not bad, [f"from {m} import {n} ({', '.join(found[(m, n)])}): {e}" for m, n, e in bad]


def test_the_public_names_import_from_the_package() -> None:
    for name in gpu_provider.__all__:
        assert getattr(gpu_provider, name) is not None, name
    from gpu_provider import GpuJobOperator, JobIdentity, TaskKey
    from gpu_provider.backends.base import JobIdentity as Base
    from gpu_provider.operators import GpuJobOperator as Operator

    assert JobIdentity is Base and GpuJobOperator is Operator
    assert JobIdentity(TaskKey("d", "t", "r"), 1, 1, "spot").name.startswith("gp-d-t-")
    assert set(gpu_provider.__all__) <= set(dir(gpu_provider))
    assert set(gpu_provider._LAZY) <= set(gpu_provider.__all__), "a lazy name missing from __all__"


def test_an_unknown_name_says_so() -> None:
    try:
        gpu_provider.NoSuchThing  # noqa: B018
    except AttributeError as err:
        assert "has no attribute 'NoSuchThing'" in str(err)
    else:
        raise AssertionError("gpu_provider.NoSuchThing did not raise AttributeError")


def test_importing_the_package_imports_no_airflow() -> None:
    """The lazy names cost nothing until used: DAG files and the in-job runtime import the package."""
    code = (
        "import json, sys\nimport gpu_provider\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('airflow', 'boto3', 'botocore', 'kubernetes', 'numpy', 'torch') or m == 'gpu_provider.operators')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
