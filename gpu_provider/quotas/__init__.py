"""Team GPU quotas: one YAML file ([gpu_provider] quota_file) -> Airflow pools and the backends' quota objects.

- :mod:`gpu_provider.quotas.file`: the file, read and validated (:class:`~gpu_provider.quotas.file.Quotas`)
- :mod:`gpu_provider.quotas.pools`: ``gpu-provider pools sync`` (one pool ``gpu_<team>`` per team)
- :mod:`gpu_provider.quotas.render`: AWS Batch fair-share policy, Kubernetes ResourceQuota, Kueue queues
"""
