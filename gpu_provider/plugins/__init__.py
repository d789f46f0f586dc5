"""Airflow plugins of the provider (entry points in the ``airflow.plugins`` group)."""
