"""The Batch backend's options that need more than a text check: secrets (references, never values), the
fair-share identifiers (the default and the team map) and the job queues of instance types. Errors name the
field and never echo a secret."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import provider_config
from gpu_provider.backends.common import text_option
from gpu_provider.runtime.secrets import check_refs

#: a Batch fair-share identifier of a job (a scheduling policy may add a trailing '*', a job may not)
SHARE_IDENTIFIER = re.compile(r"[A-Za-z0-9_]{1,255}")
#: what ``team=`` accepts (the operator's rule): the keys of ``share_identifiers``
TEAM = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def _mapping(value: Any, where: str, allowed: str) -> Mapping[Any, Any]:
    """``value`` as a mapping (JSON text is parsed), or an error naming ``where`` and what is ``allowed``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where} must be {allowed}; got text that is not JSON") from None
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} must be {allowed}; got JSON {type(value).__name__}")
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} ({type(value).__name__}) must be {allowed}")
    return value


def secrets(secrets: Any) -> dict[str, str]:
    """``secrets=``: variable names to references (one shape on every AWS backend: see
    :func:`gpu_provider.runtime.secrets.check_refs`); Batch resolves them with the execution role."""
    return check_refs(secrets)


def share_identifier(value: Any) -> str:
    """The ``share_identifier`` option, else ``[gpu_provider] batch_share_identifier``, else ``default``."""
    share = text_option("share_identifier", value, config_key="batch_share_identifier", default="default")
    assert share is not None
    if not SHARE_IDENTIFIER.fullmatch(share):
        raise ValueError(
            f"share_identifier={share!r} must be 1-255 letters, digits or underscores (a Batch fair-share identifier)"
        )
    return share


def share_identifiers(value: Any) -> dict[str, str]:
    """The ``share_identifiers`` option (a mapping, or JSON text), else ``[gpu_provider] batch_share_identifiers``."""
    where = "share_identifiers"
    if value is None or (isinstance(value, str) and not value.strip()):
        value, where = provider_config("batch_share_identifiers"), "[gpu_provider] batch_share_identifiers"
        if not value:
            return {}
    allowed = 'a mapping of team names to Batch share identifiers, e.g. {"team-a": "teamA"} (or that as JSON)'
    value = _mapping(value, where, allowed)
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


def queues_by_instance_type(value: Any) -> dict[str, dict[str, str]]:
    """The ``queues_by_instance_type`` option (a mapping, or JSON text), else
    ``[gpu_provider] batch_queues_by_instance_type``: the job queue of each instance type of an ordered
    instance preference, per capacity. A value is one queue for both capacities, or
    ``{"spot": ..., "on-demand": ...}`` (``on_demand`` is accepted too). Returns ``{type: {capacity: queue}}``."""
    where = "queues_by_instance_type"
    if value is None or (isinstance(value, str) and not value.strip()):
        value, where = provider_config("batch_queues_by_instance_type"), "[gpu_provider] batch_queues_by_instance_type"
        if not value:
            return {}
    allowed = (
        'a mapping of instance types to a job queue, or to {"spot": <queue>, "on-demand": <queue>}, e.g. '
        '{"p5.48xlarge": {"spot": "p5-spot", "on-demand": "p5-od"}, "g6e.48xlarge": "g6e"} (or that as JSON)'
    )
    value = _mapping(value, where, allowed)
    out: dict[str, dict[str, str]] = {}
    for instance_type, queues in value.items():
        if not isinstance(instance_type, str) or not instance_type.strip():
            raise ValueError(f"{where} key {instance_type!r} must be an instance type name; {allowed}")
        if isinstance(queues, str):
            queues = {names.SPOT: queues, names.ON_DEMAND: queues}
        if not isinstance(queues, Mapping) or not queues:
            raise ValueError(f"{where}[{instance_type!r}]={queues!r} must be {allowed}")
        per: dict[str, str] = {}
        for capacity, queue in queues.items():
            key = str(capacity).replace("_", "-")
            if key not in names.CAPACITY_TYPES:
                raise ValueError(
                    f"{where}[{instance_type!r}] key {capacity!r} is not a capacity; allowed: "
                    f"{', '.join(names.CAPACITY_TYPES)}"
                )
            if not isinstance(queue, str) or not queue.strip():
                raise ValueError(f"{where}[{instance_type!r}][{capacity!r}]={queue!r} must be a job queue name")
            per[key] = queue.strip()
        out[instance_type.strip()] = per
    return out


def check_instance_queues(instance_types: Sequence[str], queues: Mapping[str, Mapping[str, str]]) -> None:
    """Each type of an ordered instance preference needs its job queues (:func:`queues_by_instance_type`)."""
    for instance_type in instance_types:
        if instance_type not in queues:
            known = ", ".join(sorted(queues)) or "none configured"
            raise ValueError(
                f"resources.instance_types: {instance_type!r} has no Batch job queue; set "
                f"[gpu_provider] batch_queues_by_instance_type (or the backend's queues_by_instance_type) to "
                f'name its queue, e.g. {{"{instance_type}": {{"spot": "<queue>", "on-demand": "<queue>"}}}}; '
                f"allowed now: {known}"
            )
