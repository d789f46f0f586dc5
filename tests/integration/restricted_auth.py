"""Airflow's simple auth manager with users limited to some DAGs and no pools, for the GPU page's
browser test (the simple auth manager's roles read every DAG and every pool).

``GPU_PAGE_TEST_RESTRICTED='{"vision": ["pretrain_vit"]}'``: user ``vision`` may read the DAG
``pretrain_vit`` only (its task instances too) and no pool; every other user is as the simple auth
manager says. Set ``[core] auth_manager`` to this module's :class:`RestrictedAuthManager`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


def _restricted() -> dict[str, set[str]]:
    return {user: set(dags) for user, dags in json.loads(os.environ.get("GPU_PAGE_TEST_RESTRICTED", "{}")).items()}


class RestrictedAuthManager(SimpleAuthManager):  # type: ignore[misc]
    def get_authorized_dag_ids(self, *, user: Any, method: Any = "GET", **kwargs: Any) -> set[str]:
        limited = _restricted().get(user.username)
        found: set[str] = super().get_authorized_dag_ids(user=user, method=method, **kwargs)
        return found if limited is None else found & limited

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        limited = _restricted().get(user.username)
        if limited is not None and method == "GET":
            # no DAG named (a list, or the GPU page): allowed, and the list is cut to their DAGs
            return details is None or details.id is None or details.id in limited
        allowed: bool = super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
        return allowed

    def is_authorized_pool(self, *, method: Any, user: Any, details: Any = None) -> bool:
        if user.username in _restricted():
            return False
        allowed: bool = super().is_authorized_pool(method=method, user=user, details=details)
        return allowed
