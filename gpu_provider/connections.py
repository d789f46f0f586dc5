"""Airflow connections, read the way Airflow reads them wherever the code runs.

In a task, the Task SDK's lookup (``BaseHook.get_connection``): environment variables, secrets backends, and
the connections of the metadata DB through the API server. Outside a task (the ``gpu-provider`` command line,
a script), the Task SDK has no API server to ask, so a connection made with ``airflow connections add`` would
not be found: there Airflow's own lookup runs, which reads environment variables, secrets backends and the
metadata DB.
"""

from __future__ import annotations

import warnings
from typing import Any

from airflow.sdk.exceptions import AirflowNotFoundException


class ConnectionNotFoundError(AirflowNotFoundException):
    """No connection of that id where Airflow looks; the message says how to make one."""


def get_connection(conn_id: str) -> Any:
    """The Airflow connection ``conn_id`` (``host``, ``port``, ``login``, ``password``, ``extra_dejson``...).

    :raises ConnectionNotFoundError: neither lookup knows it
    """
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        pass
    try:
        with warnings.catch_warnings():
            # Airflow 3 marks the core lookup deprecated for tasks; outside a task it is the one that reads the DB
            warnings.simplefilter("ignore", DeprecationWarning)
            from airflow.models.connection import Connection

            return Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        pass
    variable = "AIRFLOW_CONN_" + conn_id.upper()
    raise ConnectionNotFoundError(
        f"Airflow connection {conn_id!r} is not defined (looked in the environment, the secrets backends and the "
        f"metadata DB): create it with `airflow connections add {conn_id} --conn-uri http://HOST:PORT`, or set "
        f"{variable}"
    )
