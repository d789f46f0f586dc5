"""Which pip extra brings what: each backend's service clients are optional dependencies.

The base install (``pip install airflow-provider-gpu``) is Airflow and the local backend. A backend
that talks to a service needs its extra (``[batch]``, ``[sagemaker]``, ``[kubernetes]``, or ``[all]``);
naming such a backend without it fails with :class:`MissingExtraError`, which names the extra, when
the DAG is parsed. Checked with ``importlib.util.find_spec``: nothing heavy is imported to find out.
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "airflow-provider-gpu"

#: extra -> (modules it provides, what they are in words). Kept in step with pyproject.toml's extras.
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "aws": (("airflow.providers.amazon", "boto3"), "the amazon provider and boto3"),
    "batch": (("airflow.providers.amazon", "boto3"), "the amazon provider and boto3"),
    "sagemaker": (("airflow.providers.amazon", "boto3"), "the amazon provider and boto3"),
    "kubernetes": (("airflow.providers.cncf.kubernetes", "kubernetes"), "the cncf-kubernetes provider"),
    # gpu_provider.testing's emulators: moto in server mode (flask) and boto3. The extra also brings the
    # amazon and cncf-kubernetes providers, which the backends the fixtures point at check for themselves.
    "testing": (("moto", "flask", "boto3"), "moto (with its server) and boto3"),
}

#: extras that ``[all]`` includes (``testing`` is for test environments, not deployments)
IN_ALL: frozenset[str] = frozenset({"aws", "batch", "sagemaker", "kubernetes"})

#: backend name -> the extra it needs; a backend not named here needs only the base install
BACKEND_EXTRAS: dict[str, str] = {"batch": "batch", "sagemaker": "sagemaker", "kubernetes": "kubernetes"}


class MissingExtraError(ImportError):
    """A feature's optional dependencies are not installed; the message names the extra to install."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module blocked in sys.modules
        return False


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    modules, _ = EXTRAS[extra]
    return [module for module in modules if not _installed(module)]


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` when its dependencies are not installed.

    :param what: the feature that needs them, e.g. ``"backend='batch'"``
    """
    missing = missing_modules(extra)
    if missing:
        _, words = EXTRAS[extra]
        alternative = f" (or '{DISTRIBUTION}[all]')" if extra in IN_ALL else ""
        raise MissingExtraError(
            f"{what} needs {words}, which are not installed here (missing: {', '.join(missing)}). "
            f"Install the extra: pip install '{DISTRIBUTION}[{extra}]'{alternative}, "
            "with your Airflow version's constraints file"
        )


def require_backend_extra(backend: str) -> None:
    """Raise :class:`MissingExtraError` when the backend named ``backend`` lacks its extra."""
    extra = BACKEND_EXTRAS.get(backend)
    if extra is not None:
        require_extra(extra, f"backend={backend!r}")
