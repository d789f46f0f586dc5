"""Checks of ``GpuJobOperator``'s fields, run at parse time for literal values and after rendering."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_provider.backends.base import backend_class
from gpu_provider.job import Checkpoint, GpuResources, is_templated
from gpu_provider.names import ENV_PREFIX, RENDEZVOUS_ENV

#: variables the provider sets on every job; ``env=`` may not override them
RESERVED_ENV = frozenset({*RENDEZVOUS_ENV, "CUDA_VISIBLE_DEVICES"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TEAM = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_command(command: Any) -> list[str]:
    if isinstance(command, str):
        raise TypeError(
            "command must be a list of arguments, e.g. ['python', 'train.py', '--epochs', '3'], not a string "
            "(a string would need a shell; pass ['bash', '-c', '...'] if you want one)"
        )
    if not isinstance(command, Sequence) or not command:
        raise TypeError(f"command ({type(command).__name__}) must be a non-empty list of strings")
    out = []
    for i, arg in enumerate(command):
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            arg = str(arg)
        if not isinstance(arg, str):
            raise TypeError(f"command[{i}] is a {type(arg).__name__}; every argument must be a string")
        out.append(arg)
    return out


def validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env={type(env).__name__} must be a mapping of variable names to strings")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ValueError(f"env key {key!r} is not a valid environment variable name (letters, digits, _)")
        if key in RESERVED_ENV or key.startswith(ENV_PREFIX):
            raise ValueError(
                f"env key {key!r} is set by the provider on every job ({ENV_PREFIX}*, "
                f"{', '.join(sorted(RESERVED_ENV))}) and cannot be overridden"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            # never echo the value: it may be a secret
            raise TypeError(f"env[{key!r}] is a {type(value).__name__}; environment values must be strings")
        out[key] = str(value)
    return out


def to_resources(resources: Any) -> GpuResources:
    if resources is None:
        return GpuResources()
    if isinstance(resources, GpuResources):
        return resources
    if isinstance(resources, Mapping):
        try:
            return GpuResources(**resources)
        except TypeError as err:
            raise TypeError(f"resources with keys {sorted(resources)}: {err}") from err
    raise TypeError(f"resources ({type(resources).__name__}) must be GpuResources(...) or a dict")


def to_checkpoint(checkpoint: Any) -> Checkpoint | None:
    if checkpoint is None or isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, str):
        return Checkpoint(uri=checkpoint)
    raise TypeError(f"checkpoint ({type(checkpoint).__name__}) must be Checkpoint(uri=...) or a URI string")


def any_templated(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(is_templated(v) for v in value.values())
    return is_templated(value)


def check_fixed_options(backend: Any) -> None:
    """Refuse a template for an option that picks an executable or a place on disk.

    A template can read the trigger form's params, which anyone allowed to trigger the DAG fills in:
    such options must be literals or come from the ``[gpu_provider]`` config.
    """
    if not isinstance(backend, Mapping) or is_templated(backend.get("name")) or not backend.get("name"):
        return
    fixed = backend_class(str(backend["name"]).strip()).fixed_options
    for key, value in backend.items():
        if key in fixed and is_templated(value):
            raise ValueError(
                f"backend option {key!r} of the {backend['name']!r} backend cannot be a template: it chooses an "
                "executable or a place on disk, and templates can take trigger-form params (untrusted input). "
                "Give a literal value, or set it in the [gpu_provider] config."
            )
