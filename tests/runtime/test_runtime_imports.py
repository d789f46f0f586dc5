"""The runtime runs inside job images: importing and using it must not pull in Airflow or heavy clients."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

HEAVY = (
    "airflow aiobotocore boto3 botocore s3transfer kubernetes numpy pandas torch "
    "requests urllib3 sqlalchemy pydantic pendulum jinja2 yaml"
)

CHECK = f"""
import sys
import gpu_provider.runtime, gpu_provider.runtime.launch
heavy = set({HEAVY.split()!r})
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in heavy)
print(loaded())
# using it on file:// (save, clean-up of leftovers, find, resume, restore) stays as light
from gpu_provider.runtime import job_env, restore_checkpoint, resume_checkpoint, save_checkpoint_files
uri = sys.argv[1]
save_checkpoint_files(uri, 1, {{"m": b"1"}})
save_checkpoint_files(uri, 2, {{"m": b"2"}})
resume = resume_checkpoint(job_env({{"GPU_PROVIDER_CHECKPOINT_URI": uri}}))
assert (restore_checkpoint(resume) / "m").read_bytes() == b"2", resume
print(loaded())
"""


def test_import_and_file_checkpoints_are_light(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    child_env: Callable[..., dict[str, str]],
    tmp_path: Path,
) -> None:
    result = run_python(["-c", CHECK, (tmp_path / "ckpts").as_uri()], env=child_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "[]"]
