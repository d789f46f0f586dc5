"""The docs' example test file for the example pipeline (docs/how-to/test-your-pipelines.md), run as written: its test
functions are called with the plugin's fixtures they name.

All but the Batch one: the whole pipeline on the Batch emulator with a reclaimed spot host is what
tests/dags/test_gpu_ml_pipeline.py::test_pipeline_runs_on_batch_with_a_reclaimed_spot_host runs already, through
the same runner and emulator; running it twice would cost this suite minutes on a busy machine."""

from __future__ import annotations

import inspect
import re
from types import FunctionType
from typing import Any

import pytest

from tests.harness import REPO


def example_tests() -> dict[str, FunctionType]:
    text = (REPO / "docs" / "how-to" / "test-your-pipelines.md").read_text()
    section = text.split("## An example test file", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the docs' example test file is gone"
    # as if the file were tests/test_gpu_ml_pipeline.py of this repository: DAG is dags/gpu_ml_pipeline.py
    namespace: dict[str, Any] = {"__file__": str(REPO / "tests" / "test_gpu_ml_pipeline.py"), "__name__": "example"}
    exec(compile(code.group(1), "docs/how-to/test-your-pipelines.md example", "exec"), namespace)
    return {name: f for name, f in namespace.items() if name.startswith("test_") and isinstance(f, FunctionType)}


def test_the_example_names_the_example_dag_and_tests_each_fixture() -> None:
    tests = example_tests()
    assert len(tests) == 4
    used = {name for f in tests.values() for name in inspect.signature(f).parameters}
    assert {"run_gpu_dag", "gpu_aws", "gpu_check"} <= used
    assert set(tests) >= COVERED_ELSEWHERE


#: run elsewhere (see the module's docstring)
COVERED_ELSEWHERE = {"test_on_batch_a_reclaimed_spot_host_falls_back_to_the_on_demand_queue"}


@pytest.mark.parametrize("name", sorted(set(example_tests()) - COVERED_ELSEWHERE))
def test_the_readme_example(name: str, request: pytest.FixtureRequest) -> None:
    function = example_tests()[name]
    fixtures = {arg: request.getfixturevalue(arg) for arg in inspect.signature(function).parameters}
    function(**fixtures)
