"""The in-job runtime: what runs *inside* the training container or process.

It imports no Airflow and nothing heavy (``boto3`` only when an ``s3://`` checkpoint is used without
a client), so any job image with this package can use it::

    from gpu_provider.runtime import (
        job_env, install_stop_handler, SpotInterruptionWatcher, resume_checkpoint,
        restore_checkpoint, save_checkpoint, exit_code_for_stop, declare_output,
    )

    env = job_env()
    stop = install_stop_handler()
    with SpotInterruptionWatcher(stop) if env.capacity == "spot" else contextlib.nullcontext():
        resume = resume_checkpoint(env)  # the newest in the store; GPU_PROVIDER_RESUME_FROM is a hint
        state = load(restore_checkpoint(resume)) if resume else fresh()
        ...

A job that writes the checkpoint layout with plain file operations works without this package; it
is a convenience, not a requirement. ``python -m gpu_provider.runtime.launch -- <command>`` runs a
command with the rendezvous variables normalised.
"""

from __future__ import annotations

from gpu_provider.runtime.checkpoint import (
    CheckpointWriter,
    checkpoint_name,
    checkpoint_step,
    latest_checkpoint,
    parse_uri,
    restore_checkpoint,
    save_checkpoint,
    save_checkpoint_files,
)
from gpu_provider.runtime.env import JobEnv, export_torchrun_env, job_env
from gpu_provider.runtime.output import declare_output
from gpu_provider.runtime.resume import resume_checkpoint
from gpu_provider.runtime.signals import StopFlag, exit_code_for_stop, install_stop_handler
from gpu_provider.runtime.spot import SpotInterruptionWatcher, SpotNotice

__all__ = [
    "CheckpointWriter",
    "JobEnv",
    "SpotInterruptionWatcher",
    "SpotNotice",
    "StopFlag",
    "checkpoint_name",
    "checkpoint_step",
    "declare_output",
    "exit_code_for_stop",
    "export_torchrun_env",
    "install_stop_handler",
    "job_env",
    "latest_checkpoint",
    "parse_uri",
    "restore_checkpoint",
    "resume_checkpoint",
    "save_checkpoint",
    "save_checkpoint_files",
]
