"""Every ``airflow-provider-gpu==X`` pin the README and the docs show (the training image's snippet, install
lines) names the package's own version, so a copied snippet installs the runtime this provider talks to."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

import gpu_provider

REPO = Path(__file__).resolve().parent.parent
PIN = re.compile(r"airflow-provider-gpu(?:\[[^\]]*\])?\s*==\s*([0-9][0-9A-Za-z.+-]*)")


def test_the_package_version_is_one() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert gpu_provider.__version__ == declared


def test_every_documented_pin_names_the_package_version() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    pins = [
        (f"{doc.relative_to(REPO)}:{doc.read_text()[: m.start()].count(chr(10)) + 1}", m.group(1))
        for doc in docs
        if doc.is_file()
        for m in PIN.finditer(doc.read_text())
    ]
    stale = [(where, version) for where, version in pins if version != gpu_provider.__version__]
    assert not stale, f"pins other than {gpu_provider.__version__}: {stale}"


def test_the_pattern_finds_pins_as_written() -> None:
    text = "RUN pip install --no-deps airflow-provider-gpu==0.3.0 # x\npip install 'airflow-provider-gpu[all]==1.2.3'"
    assert [m.group(1) for m in PIN.finditer(text)] == ["0.3.0", "1.2.3"]
