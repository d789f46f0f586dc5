"""The example job programs as a package: runnable as modules, and clear about a missing numpy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STAGES = ("preprocess", "train", "evaluate", "infer")


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_without_numpy_says_how_to_install_it(stage: str, tmp_path: Path) -> None:
    # sys.modules[name] = None makes `import numpy` raise ModuleNotFoundError, as on a machine without it
    code = (
        "import runpy, sys\n"
        "sys.modules['numpy'] = None\n"
        f"sys.argv = ['{stage}', '--help']\n"
        f"runpy.run_module('gpu_provider.examples.{stage}', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: the example job programs need numpy: pip install 'airflow-provider-gpu[examples]'"
    ), "one clear line, no traceback"


def test_importing_the_examples_package_imports_nothing_heavy(tmp_path: Path) -> None:
    code = "import sys, gpu_provider.examples; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
