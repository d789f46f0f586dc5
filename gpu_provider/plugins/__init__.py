"""Airflow plugins shipped with the provider (the GPU page, the priority weight strategy): entry points in the ``airflow.plugins`` group."""
