"""The anchors' aiobotocore, next to the project's pinned botocore (an overlay built at bench time), and the
connection environments both sides of a benchmark use.

The amazon provider's deferrable triggers (``BatchJobTrigger``, ``SageMakerTrigger``) need
aiobotocore, and no aiobotocore release accepts the botocore 1.44 that ``constraints/`` pins
(aiobotocore 3.10.0 wants botocore >=1.43.115,<1.43.118). So the benchmarks install aiobotocore 3.10.0
with botocore and boto3 1.43.117 from PyPI into a folder under /tmp (``pip install --target``, no
dependencies: everything else, the amazon provider included, comes from the project's virtualenv),
and put that folder first on the anchor triggerer's ``PYTHONPATH``. Built once, reused while it is
there. Never used by tests (no test may reach the network).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PINS = ("aiobotocore==3.10.0", "aioitertools==0.13.0", "botocore==1.43.117", "boto3==1.43.117")
OVERLAY = Path(tempfile.gettempdir()) / (
    "gpu-provider-bench-aiobotocore-" + "-".join(p.split("==")[1] for p in PINS[:1] + PINS[2:3])
)


def anchor_pythonpath() -> str:
    """The overlay folder (built from PyPI on first use); put it first on the anchor process's path."""
    stamp = OVERLAY / ".complete"
    if not stamp.exists():
        print(f"building the anchors' aiobotocore overlay in {OVERLAY} ({', '.join(PINS)}) ...", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
                str(OVERLAY),
                "--upgrade",
                *PINS,
            ],
            check=True,
        )
        stamp.touch()
    return str(OVERLAY)


def aws_env(endpoint_url: str, region: str) -> dict[str, str]:
    """The environment that points ``aws_default`` (ours and the anchors') at an emulator, dummy credentials."""
    extra = {"endpoint_url": endpoint_url, "region_name": region}
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": extra}),
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": region,
    }


def kubernetes_env(kubeconfig: Path) -> dict[str, str]:
    """The environment that points ``kubernetes_default`` (ours and the anchors') at a kubeconfig."""
    extra = {"kube_config_path": str(kubeconfig)}
    return {"AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps({"conn_type": "kubernetes", "extra": extra})}


def kubernetes_pod_trigger(name: str, namespace: str, interval: float) -> Any:
    """``KubernetesPodOperator(deferrable=True)``'s trigger for one pod, as the anchor defers it: polls every
    ``interval`` s, no startup or schedule budget to run out, no logs, container ``main`` (the name our fake
    API server gives the first container's status)."""
    from datetime import datetime, timezone

    from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

    return KubernetesPodTrigger(
        pod_name=name,
        pod_namespace=namespace,
        trigger_start_time=datetime.now(timezone.utc),
        base_container_name="main",
        kubernetes_conn_id="kubernetes_default",
        poll_interval=interval,
        startup_check_interval=interval,
        startup_timeout=10**6,
        schedule_timeout=10**6,
        get_logs=False,
    )
