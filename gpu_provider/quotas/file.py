"""The team quota file: which teams share the GPUs, how many each gets, and their limits.

A YAML file whose path is ``[gpu_provider] quota_file``::

    teams:
      vision:
        gpus: 8                  # required: GPUs the team may hold at once (its pool's slots), 0 or more
        max_priority: 100        # optional: the highest priority= its tasks may ask for
        monthly_budget_usd: 5000 # optional: spend control's monthly budget for the team
        namespace: vision-jobs   # optional: its Kubernetes namespace (default: the team, '_' -> '-')
        share_identifier: vision # optional: its AWS Batch fair-share identifier (default: the team, '-' -> '_')
      nlp:
        gpus: 16
    kueue:                       # optional: how `quotas render --kueue` names things
      cohort: gpus               # the cohort every team's ClusterQueue joins (borrowing idle GPUs)
      flavor: gpu                # the ResourceFlavor the quotas are in

Validation is strict: an unknown key, a wrong type or an out-of-range value fails with the file, the
field, the value and what is allowed. Reading needs PyYAML (a dependency of Airflow itself).
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: a team name, as ``team=`` accepts it (it names the pool ``gpu_<team>``)
TEAM = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
#: a Kubernetes namespace (DNS-1123 label)
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: an AWS Batch fair-share identifier
SHARE_IDENTIFIER = re.compile(r"^[A-Za-z0-9_]{1,255}$")
#: Kubernetes object names (DNS-1123 subdomain), for the Kueue flavor and cohort
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: the most GPUs one team may be given (a sanity bound: a typo of 80000 instead of 8 fails)
MAX_GPUS = 100_000
#: priorities are Airflow priority weights (32-bit)
MAX_PRIORITY = 2**31 - 1
MAX_BUDGET_USD = 1_000_000_000.0
#: the Airflow pool of a team
POOL_PREFIX = "gpu_"

_TEAM_KEYS = ("gpus", "max_priority", "monthly_budget_usd", "namespace", "share_identifier")
_TOP_KEYS = ("teams", "kueue")
_KUEUE_KEYS = ("cohort", "flavor")


class QuotaFileError(ValueError):
    """The quota file cannot be read or breaks a rule; the message names the file, field and value."""


@dataclass(frozen=True)
class TeamQuota:
    """One team's share of the GPUs."""

    team: str
    gpus: int
    max_priority: int | None = None
    monthly_budget_usd: float | None = None
    namespace: str = ""
    share_identifier: str = ""

    @property
    def pool(self) -> str:
        """The Airflow pool of the team's GPU tasks (``team=`` sets it)."""
        return POOL_PREFIX + self.team


@dataclass(frozen=True)
class Quotas:
    """Every team of a quota file, in the file's order."""

    teams: tuple[TeamQuota, ...]
    source: str = "<quotas>"
    kueue_cohort: str | None = None
    kueue_flavor: str = "gpu"
    _by_name: dict[str, TeamQuota] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({t.team: t for t in self.teams})

    def get(self, team: str) -> TeamQuota | None:
        return self._by_name.get(team)

    @property
    def names(self) -> list[str]:
        return [t.team for t in self.teams]

    def budgets(self) -> dict[str, float]:
        """``{team: USD per month}`` of the teams with a ``monthly_budget_usd``."""
        return {t.team: t.monthly_budget_usd for t in self.teams if t.monthly_budget_usd is not None}

    def check_task(self, team: str, priority: int | None) -> None:
        """Refuse a task of a team the file does not list, or above its team's ``max_priority``."""
        quota = self.get(team)
        if quota is None:
            listed = ", ".join(self.names) or "none"
            raise ValueError(
                f"team={team!r} is not in the quota file {self.source} (teams: {listed}); its tasks would wait "
                f"forever for a pool {POOL_PREFIX}{team} that `gpu-provider pools sync` does not create. Add the "
                "team to the quota file, or use one of the listed teams."
            )
        if priority is not None and quota.max_priority is not None and priority > quota.max_priority:
            raise ValueError(
                f"priority={priority!r} is above team {team!r}'s ceiling max_priority={quota.max_priority} in the "
                f"quota file {self.source}: use a priority of at most {quota.max_priority}."
            )


def _fail(source: str, where: str, value: Any, allowed: str) -> QuotaFileError:
    return QuotaFileError(f"quota file {source}: {where}={value!r}: {allowed}")


def _check_keys(source: str, where: str, data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        name = f"{where}." if where else ""
        raise QuotaFileError(
            f"quota file {source}: unknown key(s) {', '.join(name + k for k in unknown)}; "
            f"allowed{' in ' + where if where else ''}: {', '.join(allowed)}"
        )


def _whole(source: str, where: str, value: Any, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(source, where, value, f"must be a whole number {what} from {low} to {high}")
    return value


def _team(source: str, name: Any, data: Any) -> TeamQuota:
    where = f"teams.{name}"
    if not isinstance(name, str) or not TEAM.match(name):
        raise _fail(source, "teams key", name, "a team is 1-63 lower-case letters, digits, '-' or '_' (e.g. 'vision')")
    if not isinstance(data, Mapping):
        raise _fail(source, where, data, "must be a mapping with at least 'gpus' (e.g. {gpus: 8})")
    _check_keys(source, where, data, _TEAM_KEYS)
    if "gpus" not in data:
        raise QuotaFileError(f"quota file {source}: {where}.gpus is missing: give the team's GPUs (0 or more)")
    gpus = _whole(source, f"{where}.gpus", data["gpus"], 0, MAX_GPUS, "of GPUs")
    ceiling = data.get("max_priority")
    if ceiling is not None:
        ceiling = _whole(source, f"{where}.max_priority", ceiling, -MAX_PRIORITY, MAX_PRIORITY, "(a priority)")
    budget = data.get("monthly_budget_usd")
    if budget is not None:
        if (
            isinstance(budget, bool)
            or not isinstance(budget, (int, float))
            or not math.isfinite(budget)
            or not 0 <= budget <= MAX_BUDGET_USD
        ):
            raise _fail(
                source, f"{where}.monthly_budget_usd", budget, f"must be US dollars from 0 to {MAX_BUDGET_USD:g}"
            )
        budget = float(budget)
    namespace = data.get("namespace", name.replace("_", "-"))
    if not isinstance(namespace, str) or not NAMESPACE.match(namespace):
        raise _fail(
            source,
            f"{where}.namespace",
            namespace,
            "must be a Kubernetes namespace: 1-63 lower-case letters, digits or '-', starting and ending with a "
            "letter or digit",
        )
    share = data.get("share_identifier", name.replace("-", "_"))
    if not isinstance(share, str) or not SHARE_IDENTIFIER.match(share):
        raise _fail(source, f"{where}.share_identifier", share, "must be 1-255 letters, digits or '_' (AWS Batch)")
    return TeamQuota(
        team=name,
        gpus=gpus,
        max_priority=ceiling,
        monthly_budget_usd=budget,
        namespace=namespace,
        share_identifier=share,
    )


def parse_quotas(data: Any, source: str = "<quotas>") -> Quotas:
    """Validate a quota file's parsed content."""
    if not isinstance(data, Mapping):
        raise _fail(source, "top level", data, "must be a mapping with a 'teams' key")
    _check_keys(source, "", data, _TOP_KEYS)
    teams = data.get("teams")
    if not isinstance(teams, Mapping) or not teams:
        raise _fail(source, "teams", teams, "must map each team to its quota, e.g. teams: {vision: {gpus: 8}}")
    parsed = [_team(source, name, quota) for name, quota in teams.items()]
    for attr, what in (("namespace", "Kubernetes namespace"), ("share_identifier", "Batch share identifier")):
        seen: dict[str, str] = {}
        for quota in parsed:
            value = getattr(quota, attr)
            if value in seen:
                raise _fail(
                    source,
                    f"teams.{quota.team}.{attr}",
                    value,
                    f"is team {seen[value]!r}'s {what} too; each team needs its own",
                )
            seen[value] = quota.team
    kueue = data.get("kueue") or {}
    if not isinstance(kueue, Mapping):
        raise _fail(source, "kueue", kueue, "must be a mapping with optional 'cohort' and 'flavor'")
    _check_keys(source, "kueue", kueue, _KUEUE_KEYS)
    for key in _KUEUE_KEYS:
        value = kueue.get(key)
        if value is not None and (not isinstance(value, str) or not DNS_SUBDOMAIN.match(value)):
            raise _fail(source, f"kueue.{key}", value, "must be a Kubernetes object name (DNS-1123 subdomain)")
    return Quotas(
        teams=tuple(parsed),
        source=source,
        kueue_cohort=kueue.get("cohort"),
        kueue_flavor=kueue.get("flavor") or "gpu",
    )


def load_quotas(path: str | os.PathLike[str]) -> Quotas:
    """Read and validate the quota file at ``path``."""
    import yaml

    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise QuotaFileError(f"quota file {source} cannot be read: {err.strerror or err}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise QuotaFileError(f"quota file {source} is not valid YAML: {err}") from None
    return parse_quotas(data, source)


_CACHE: dict[str, tuple[tuple[int, int], Quotas]] = {}
_CACHE_LOCK = threading.Lock()


def configured_quota_file() -> str:
    """``[gpu_provider] quota_file``, or ``""`` when unset."""
    from gpu_provider.backends.base import provider_config

    return provider_config("quota_file")


def configured_quotas() -> Quotas | None:
    """The quota file of ``[gpu_provider] quota_file`` (read again only when it changed), or None if unset."""
    path = configured_quota_file()
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError as err:
        raise QuotaFileError(
            f"[gpu_provider] quota_file={path!r} cannot be read: {err.strerror or err}. Point it at the team "
            "quota file, or leave it empty to use no quota file."
        ) from err
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _CACHE_LOCK:
        cached = _CACHE.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    quotas = load_quotas(path)
    with _CACHE_LOCK:
        _CACHE[path] = (stamp, quotas)
    return quotas
