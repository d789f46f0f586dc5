"""The Batch backend's options that need more than a text check: secrets (ARNs, never values) and the
team -> fair-share identifier map. Errors name the field and never echo a secret."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gpu_provider.backends.base import provider_config

#: a Batch fair-share identifier of a job (a scheduling policy may add a trailing '*', a job may not)
SHARE_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,255}")
#: what ``team=`` accepts (the operator's rule): the keys of ``share_identifiers``
TEAM = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def secrets(secrets: Any) -> dict[str, str]:
    if secrets is None or secrets == "":
        return {}
    if isinstance(secrets, str):
        try:
            secrets = json.loads(secrets)
        except json.JSONDecodeError:
            raise ValueError(
                "secrets must be a mapping of variable names to Secrets Manager or SSM ARNs "
                '(as a dict, or JSON text like {"HF_TOKEN": "arn:aws:secretsmanager:..."})'
            ) from None
    if not isinstance(secrets, Mapping):
        raise TypeError(f"secrets ({type(secrets).__name__}) must be a mapping of variable names to ARNs")
    out = {}
    for key, value in secrets.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"secrets key {key!r} is not a valid environment variable name")
        if not isinstance(value, str) or not value.startswith("arn:"):
            # an ARN is not secret, but a value passed here by mistake might be: do not echo it
            raise ValueError(
                f"secrets[{key!r}] must be the ARN of a Secrets Manager secret or SSM parameter "
                "(arn:aws:...), not the secret itself"
            )
        out[key] = value
    return out


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
