"""The Batch backend's options that need more than a text check: secrets (references, never values) and the
team -> fair-share identifier map. Errors name the field and never echo a secret."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpu_provider.backends.base import provider_config
from gpu_provider.runtime.secrets import check_refs

#: a Batch fair-share identifier of a job (a scheduling policy may add a trailing '*', a job may not)
SHARE_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,255}")
#: what ``team=`` accepts (the operator's rule): the keys of ``share_identifiers``
TEAM = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def secrets(secrets: Any) -> dict[str, str]:
    """``secrets=``: variable names to references (one shape on every AWS backend: see
    :func:`gpu_provider.runtime.secrets.check_refs`); Batch resolves them with the execution role."""
    return check_refs(secrets)


def share_identifiers(value: Any) -> dict[str, str]:
    """The ``share_identifiers`` option (a mapping, or JSON text), else ``[gpu_provider] batch_share_identifiers``."""
    where = "share_identifiers"
    if value is None or (isinstance(value, str) and not value.strip()):
        value, where = provider_config("batch_share_identifiers"), "[gpu_provider] batch_share_identifiers"
        if not value:
            return {}
    allowed = 'a mapping of team names to Batch share identifiers, e.g. {"team-a": "teamA"} (or that as JSON)'
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where} must be {allowed}; got text that is not JSON") from None
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} must be {allowed}; got JSON {type(value).__name__}")
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} ({type(value).__name__}) must be {allowed}")
    out: dict[str, str] = {}
    for team, share in value.items():
        if not isinstance(team, str) or not TEAM.fullmatch(team):
            raise ValueError(
                f"{where} key {team!r} is not a team name (what team= accepts: lower-case letters, digits, '-' "
                "or '_', 1-63 characters)"
            )
        if not isinstance(share, str) or not SHARE_IDENTIFIER.fullmatch(share):
            raise ValueError(
                f"{where}[{team!r}]={share!r} must be 1-255 letters, digits or underscores (a Batch fair-share "
                "identifier, as in the queue's scheduling policy)"
            )
        out[team] = share
    return out
