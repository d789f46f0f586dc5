"""The runtime runs inside job images: importing it must not pull in Airflow or heavy clients."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

CHECK = """
import sys
import gpu_provider.runtime, gpu_provider.runtime.launch
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"airflow", "boto3", "botocore", "numpy", "torch"})
print(heavy)
"""


def test_import_is_light(
    run_python: Callable[..., subprocess.CompletedProcess[str]], child_env: Callable[..., dict[str, str]]
) -> None:
    result = run_python(["-c", CHECK], env=child_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
