"""The backend registry: default, lazy import paths, collision checks, clear errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_provider.backends import base
from gpu_provider.backends.base import register_backend, registered_backends, resolve_backend
from gpu_provider.backends.local import LocalBackend


@pytest.fixture
def clean_registry() -> Iterator[None]:
    saved = dict(base._REGISTRY)
    yield
    base._REGISTRY.clear()
    base._REGISTRY.update(saved)


def test_default_is_local() -> None:
    assert isinstance(resolve_backend(None), LocalBackend)
    assert isinstance(resolve_backend(""), LocalBackend)
    assert "local" in registered_backends()


@pytest.mark.usefixtures("clean_registry")
def test_collisions_need_replace_and_names_are_checked() -> None:
    with pytest.raises(
        ValueError, match=r"'local' is already registered to gpu_provider\.backends\.local\.LocalBackend"
    ):
        register_backend("local", "somewhere.Else")
    register_backend("local", "gpu_provider.backends.local.LocalBackend")  # the same path again is fine
    register_backend("mine", "gpu_provider.backends.local.LocalBackend")
    assert "mine" in registered_backends()
    with pytest.raises(ValueError, match="backend name 'My Backend' must be lower-case"):
        register_backend("My Backend", "x.Y")


@pytest.mark.usefixtures("clean_registry")
def test_a_registered_path_that_is_not_a_backend_is_refused() -> None:
    register_backend("broken", "gpu_provider.job.GpuResources")
    with pytest.raises(TypeError, match="not a Backend subclass"):
        resolve_backend("broken")


def test_mapping_form_drops_empty_options_and_names_bad_ones() -> None:
    backend = resolve_backend({"name": "local", "simulate_preemptions": "", "grace_period": "2"})
    assert isinstance(backend, LocalBackend)
    assert backend.simulate_preemptions == () and backend.grace_period == 2.0
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'region'; the local backend takes: state_dir"):
        resolve_backend({"name": "local", "region": "us-east-1"})
