"""Airflow plugins shipped with the provider (the GPU page, the priority weight strategy)."""
