"""A backend module as a third-party backend without its extra looks: importing it fails naming the extra
(registered by tests/dags/test_gpu_reaper.py only, in a child process)."""

from gpu_provider.extras import MissingExtraError

raise MissingExtraError(
    "backend='needs_extra' needs the acme client, which is not installed here (missing: acme). "
    "Install the extra: pip install 'acme-gpu[client]'"
)
