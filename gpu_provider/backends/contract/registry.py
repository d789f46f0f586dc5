"""The backend registry: names to import paths (nothing imported until used), and ``backend=`` resolution."""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import Any

from gpu_provider.backends.contract.backend import Backend
from gpu_provider.extras import require_backend_extra

DEFAULT_BACKEND = "local"

_REGISTRY: dict[str, str] = {
    "local": "gpu_provider.backends.local.LocalBackend",
    "batch": "gpu_provider.backends.batch.BatchBackend",
    "kubernetes": "gpu_provider.backends.kubernetes.KubernetesBackend",
    "sagemaker": "gpu_provider.backends.sagemaker.SageMakerBackend",
}


def register_backend(name: str, import_path: str, *, replace: bool = False) -> None:
    """Register a backend class by import path (imported only when used).

    :param replace: allow overriding an existing name; without it a collision is an error
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"backend name {name!r} must be lower-case letters, digits and underscores")
    if name in _REGISTRY and _REGISTRY[name] != import_path and not replace:
        raise ValueError(
            f"backend name {name!r} is already registered to {_REGISTRY[name]}; pass replace=True to override"
        )
    _REGISTRY[name] = import_path


def registered_backends() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name``. A backend whose pip extra is missing raises
    :class:`~gpu_provider.extras.MissingExtraError` naming the extra (``gpu_provider.extras.BACKEND_EXTRAS``)."""
    try:
        path = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"backend={name!r} is not a known backend; valid names: {', '.join(registered_backends())}"
        ) from None
    require_backend_extra(name)
    module_name, _, attr = path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"backend {name!r} is registered to {path}, which is not a Backend subclass")
    return cls


def backend_options(cls: type[Backend]) -> list[str]:
    """The option names a backend class takes (its keyword-only constructor parameters)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def check_backend_name(name: str) -> None:
    """Fail with the list of valid names, without importing the backend (parse-time check)."""
    if name not in _REGISTRY:
        backend_class(name)
    require_backend_extra(name)


def resolve_backend(value: Backend | str | Mapping[str, Any] | None) -> Backend:
    """Turn what a DAG author passed as ``backend=`` into a backend object.

    Accepts a backend object, a registered name, ``None`` (the default, ``local``), or a mapping
    ``{"name": "local", "simulate_preemptions": [8]}`` whose other keys are the backend's options.
    An option whose value is ``None`` or an empty string (a template that rendered to nothing) is
    treated as not given, so one templated mapping can serve several backends.
    """
    if value is None or value == "":
        value = DEFAULT_BACKEND
    if isinstance(value, Backend):
        return value
    if isinstance(value, str):
        return backend_class(value.strip()).from_options()
    if isinstance(value, Mapping):
        options = {k: v for k, v in value.items() if v is not None and not (isinstance(v, str) and not v.strip())}
        name = options.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"backend mapping with keys {sorted(map(str, value))}: it needs a 'name' key naming the backend "
                f"({', '.join(registered_backends())})"
            )
        cls = backend_class(name.strip())
        unknown = sorted(set(options) - set(backend_options(cls)))
        if unknown:
            # option values may be secrets: name the keys only
            raise ValueError(
                f"backend={name!r}: unknown option(s) {', '.join(map(repr, unknown))}; "
                f"the {name} backend takes: {', '.join(backend_options(cls))}"
            )
        try:
            return cls.from_options(**options)
        except TypeError as err:
            raise ValueError(f"backend={name!r}: bad options for the {name!r} backend: {err}") from err
    raise TypeError(
        f"backend={value!r} ({type(value).__name__}) must be a Backend object, a backend name "
        f"({', '.join(registered_backends())}) or a mapping with a 'name' key"
    )
