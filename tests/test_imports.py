"""DAG files import the operator: that must not pull in boto3, botocore, kubernetes, numpy or torch."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("boto3", "botocore", "kubernetes", "kubernetes_asyncio", "numpy", "torch")


def test_parse_time_imports_are_light() -> None:
    code = (
        "import sys, json\n"
        "from gpu_provider import GpuResources, Checkpoint, OnDemand, Spot, SpotFallback\n"
        "from gpu_provider.operators import GpuJobOperator\n"
        "op = GpuJobOperator(task_id='t', command=['true'], backend='local', capacity='spot_fallback',\n"
        "                    checkpoint='file:///tmp/c', resources=GpuResources(gpus=1, nodes=2))\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_a_batch_task_is_validated_at_parse_time_without_importing_boto3() -> None:
    code = (
        "import sys, json\n"
        "from gpu_provider import GpuResources\n"
        "from gpu_provider.operators import GpuJobOperator\n"
        "op = GpuJobOperator(task_id='t', command=['true'], image='img', capacity='spot_fallback',\n"
        "                    backend={'name': 'batch', 'spot_queue': 's', 'on_demand_queue': 'o'})\n"
        "try:\n"
        "    GpuJobOperator(task_id='u', command=['true'], image='img', capacity='spot_fallback',\n"
        "                   backend={'name': 'batch', 'spot_queue': 's', 'on_demand_queue': 'o'},\n"
        "                   resources=GpuResources(gpus=1, nodes=2))\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused: resources.nodes=2 with spot capacity" in out
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_provider_info_lists_everything_and_documents_config() -> None:
    from gpu_provider.get_provider_info import get_provider_info

    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-gpu"
    modules = [
        m for group in ("operators", "sensors", "triggers") for entry in info[group] for m in entry["python-modules"]
    ]
    for module in modules:
        __import__(module)
    for link in info["extra-links"]:
        module, _, name = link.rpartition(".")
        assert hasattr(__import__(module, fromlist=[name]), name)
    options = info["config"]["gpu_provider"]["options"]
    assert {"default_backend", "poll_interval", "local_state_dir", "batch_spot_queue", "batch_on_demand_queue"} <= set(
        options
    )
    for name, option in options.items():
        assert option["description"] and option["type"] and "default" in option, name


def test_airflow_lists_the_provider() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "get", "airflow-provider-gpu", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "airflow-provider-gpu" in out
