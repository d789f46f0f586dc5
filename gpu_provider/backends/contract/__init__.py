"""The backend contract, one module per concern: states, identity, jobs (requests, handles, statuses),
logs, events, the :class:`~gpu_provider.backends.base.Backend` class, config and the registry.

Import its names from :mod:`gpu_provider.backends.base`, which re-exports them all. Nothing is imported
here, so a module of this package can be loaded on its own.
"""
