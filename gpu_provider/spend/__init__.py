"""Spend control: prices, the cost of each attempt, budget guards, metrics, and the reaper.

Nothing here imports boto3 at module level: the operator imports :mod:`gpu_provider.spend.budget`
at parse time. Live AWS prices are read only when ``[gpu_provider] live_prices`` turns them on.
"""
