"""Checks of ``GpuJobOperator``'s fields, run at parse time for literal values and after rendering."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_provider.backends.base import Backend, backend_class
from gpu_provider.capacity import CapacityPolicy
from gpu_provider.job import MAX_DURATION_S, Checkpoint, GpuResources, is_templated, to_seconds
from gpu_provider.names import ENV_PREFIX, RENDEZVOUS_ENV, SPOT

#: spot without a checkpoint is fine for short jobs; above this max runtime it earns a warning
SPOT_WITHOUT_CHECKPOINT_WARN_S = 3600.0

#: variables the provider sets on every job; ``env=`` may not override them
RESERVED_ENV = frozenset({*RENDEZVOUS_ENV, "CUDA_VISIBLE_DEVICES"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TEAM = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_command(command: Any) -> list[str]:
    if isinstance(command, str):
        raise TypeError(
            "command must be a list of arguments, e.g. ['python', 'train.py', '--epochs', '3'], not a string "
            "(a string would need a shell; pass ['bash', '-c', '...'] if you want one)"
        )
    if not isinstance(command, Sequence) or not command:
        raise TypeError(f"command ({type(command).__name__}) must be a non-empty list of strings")
    out = []
    for i, arg in enumerate(command):
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            arg = str(arg)
        if not isinstance(arg, str):
            raise TypeError(f"command[{i}] is a {type(arg).__name__}; every argument must be a string")
        out.append(arg)
    return out


def validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env={type(env).__name__} must be a mapping of variable names to strings")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ValueError(f"env key {key!r} is not a valid environment variable name (letters, digits, _)")
        if key in RESERVED_ENV or key.startswith(ENV_PREFIX):
            raise ValueError(
                f"env key {key!r} is set by the provider on every job ({ENV_PREFIX}*, "
                f"{', '.join(sorted(RESERVED_ENV))}) and cannot be overridden"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            # never echo the value: it may be a secret
            raise TypeError(f"env[{key!r}] is a {type(value).__name__}; environment values must be strings")
        out[key] = str(value)
    return out


def to_resources(resources: Any) -> GpuResources:
    if resources is None:
        return GpuResources()
    if isinstance(resources, GpuResources):
        return resources
    if isinstance(resources, Mapping):
        try:
            return GpuResources(**resources)
        except TypeError as err:
            raise TypeError(f"resources with keys {sorted(resources)}: {err}") from err
    raise TypeError(f"resources ({type(resources).__name__}) must be GpuResources(...) or a dict")


def to_checkpoint(checkpoint: Any) -> Checkpoint | None:
    if checkpoint is None or isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, str):
        return Checkpoint(uri=checkpoint)
    raise TypeError(f"checkpoint ({type(checkpoint).__name__}) must be Checkpoint(uri=...) or a URI string")


def any_templated(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(is_templated(v) for v in value.values())
    return is_templated(value)


def check_fixed_options(backend: Any) -> None:
    """Refuse a template for a fixed option (``Backend.fixed_options``) at parse time.

    A template can read the trigger form's params, which anyone allowed to trigger the DAG fills in:
    such options must be literals or come from the ``[gpu_provider]`` config.
    """
    if not isinstance(backend, Mapping) or is_templated(backend.get("name")) or not backend.get("name"):
        return
    fixed = backend_class(str(backend["name"]).strip()).fixed_options
    for key, value in backend.items():
        if key in fixed and _has_template(value):
            raise ValueError(
                f"backend option {key!r} of the {backend['name']!r} backend cannot be a template: it is a fixed "
                "option (it chooses who or what the job runs as, where its secrets come from, which account, "
                "endpoint or folder it uses), and templates can take trigger-form params (untrusted input). "
                "Give a literal value, or set it in the config section [gpu_provider]."
            )


def check_rendered_fixed_options(rendered: Any, written: Any) -> None:
    """After rendering: every fixed option of the backend must be written literally in the DAG file.

    ``written`` is ``backend=`` as the DAG file gave it, ``rendered`` the same after Airflow rendered its
    templates. The parse-time check (:func:`check_fixed_options`) cannot see a fixed option whose
    backend's name is a template, nor one inside a whole mapping that a template renders (native
    rendering): such a value can come from the trigger form's params or the run's conf, which anyone
    allowed to trigger the DAG chooses. A fixed option is accepted only when the written mapping holds
    the same literal value under that key; left out, the backend reads it from ``[gpu_provider]``.
    """
    if not isinstance(rendered, Mapping):
        return  # a backend object or a name: its options come from DAG code or the config
    name = rendered.get("name")
    if not isinstance(name, str) or not name.strip():
        return  # resolve_backend names the missing key
    fixed = backend_class(name.strip()).fixed_options
    literal = written if isinstance(written, Mapping) else {}
    for key, value in rendered.items():
        if key not in fixed or value is None or (isinstance(value, str) and not value.strip()):
            continue
        if key in literal and not _has_template(literal[key]) and _same(literal[key], value):
            continue
        # never echo the value: a connection id or a secret's reference is not for the task log
        raise ValueError(
            f"backend option {key!r} of the {name.strip()!r} backend came from a template (it is not written "
            "literally in the DAG file): it is a fixed option, which a template could take from the trigger "
            "form's params or the run's conf (untrusted input). Write it literally in the DAG file, or set it in "
            f"the config section [gpu_provider]. Fixed options of this backend: {', '.join(sorted(fixed))}."
        )


def _has_template(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(_has_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_template(v) for v in value)
    return is_templated(value)


def _same(literal: Any, rendered: Any) -> bool:
    """Whether rendering left a literal alone (native rendering may turn ``"8"`` into ``8``)."""
    if isinstance(literal, Mapping) and isinstance(rendered, Mapping):
        return literal.keys() == rendered.keys() and all(_same(literal[k], rendered[k]) for k in literal)
    if isinstance(literal, (list, tuple)) and isinstance(rendered, (list, tuple)):
        return len(literal) == len(rendered) and all(_same(a, b) for a, b in zip(literal, rendered, strict=True))
    return bool(literal == rendered or str(literal) == str(rendered))


#: a name that says it holds a secret (an environment variable's or an Airflow Variable's)
SECRET_NAME = re.compile(
    r"(^|[_.\-])(PASSWORD|PASSWD|PASSPHRASE|SECRETS?|TOKEN|CREDENTIALS?|(API|ACCESS|PRIVATE|SECRET|AUTH)[_\-]?KEY)([_.\-]|$)",
    re.IGNORECASE,
)
#: a template reading a connection's password or extra (``conn.x.password``, ``conn['x'].extra_dejson``)
_CONN_SECRET = re.compile(
    r"\bconn(?:\.\w+|\[\s*['\"][^'\"]+['\"]\s*\])\.(password|get_password|extra|extra_dejson|get_extra|get_uri)\b"
)
#: a template reading a Variable (``var.value.x``, ``var.json.x``, ``var.value.get('x')``, ``Variable.get('x')``)
_VARIABLE = re.compile(
    r"\bvar\.(?:value|json)(?:\.(?!get\b)(\w+)|\.get\(\s*['\"]([^'\"]+)|\[\s*['\"]([^'\"]+))"
    r"|\bVariable\.get\(\s*(?:key\s*=\s*)?['\"]([^'\"]+)"
)


def secret_in_env(key: str, value: Any) -> str | None:
    """What makes ``env[key]`` look like a secret (a template reading a connection's password or a
    Variable with a secret's name, or any template under a secret's name); ``None`` when nothing does."""
    if not is_templated(value):
        return None
    conn = _CONN_SECRET.search(value)
    if conn:
        return f"a connection's {conn.group(1)}"
    for match in _VARIABLE.finditer(value):
        name = next(g for g in match.groups() if g)
        if SECRET_NAME.search(name):
            return f"the Variable {name!r}"
    if SECRET_NAME.search(key):
        return "a template under a secret's name"
    return None


def _may_run_remote(backend: Any) -> str | None:
    """The backend's name when it is (or, templated, may be) a remote one; ``None`` for the local backend."""
    name = backend.get("name") if isinstance(backend, Mapping) else backend
    if isinstance(backend, Backend):
        name = backend.name
    if name is None or (isinstance(name, str) and name.strip() in ("", "local")):
        return None
    return "templated" if is_templated(name) else str(name).strip()


def check_secrets_in_env(task_id: str, env: Any, backend: Any) -> None:
    """Warn (or refuse, with ``[gpu_provider] refuse_secrets_in_env``) when ``env=`` passes a secret to a
    remote backend: ``env=`` travels in the job's request, readable by anyone allowed to describe the job."""
    name = _may_run_remote(backend)
    if name is None or env is None:
        return
    items = env.items() if isinstance(env, Mapping) else [("env", env)]
    found = [(str(key), what) for key, value in items if (what := secret_in_env(str(key), value))]
    if not found:
        return
    from airflow.configuration import conf

    which = "a remote backend (its name is a template)" if name == "templated" else f"the {name!r} backend"
    message = (
        f"task {task_id!r}: "
        + "; ".join(f"env[{key!r}] passes {what}" for key, what in found)
        + f" to {which}. env= values travel in the job's request and are readable by anyone allowed to describe "
        "the job (DescribeJobs, DescribeTrainingJob, the pod spec). Pass a reference instead, with the backend's "
        "secrets= option (a Secrets Manager ARN or SSM parameter on Batch and SageMaker, 'secret/key' on "
        "Kubernetes): the job reads the value when it starts."
    )
    if conf.getboolean("gpu_provider", "refuse_secrets_in_env", fallback=False):
        raise ValueError(message + " ([gpu_provider] refuse_secrets_in_env is on.)")
    warnings.warn(
        message + " ([gpu_provider] refuse_secrets_in_env = True refuses such DAGs.)", UserWarning, stacklevel=4
    )


def team_pool(team: Any, pool: Any, resources: GpuResources) -> dict[str, Any]:
    """``team=`` -> the ``pool`` (``gpu_<team>``) and ``pool_slots`` (total GPUs rounded up) it sets."""
    if team is None:
        return {}
    if not isinstance(team, str) or not TEAM.match(team):
        raise ValueError(
            f"team={team!r} must be lower-case letters, digits, '-' or '_' (1-63 chars, e.g. 'vision'); "
            "it names the pool gpu_<team> (map it to a differently spelt service-side name in the "
            "backend's options, e.g. Batch share_identifiers)"
        )
    wanted = f"gpu_{team}"
    if pool not in (None, wanted):
        raise ValueError(f"team={team!r} sets pool={wanted!r}; do not also pass pool={pool!r}")
    return {"pool": wanted, "pool_slots": resources.pool_slots}


#: the gpu_provider_priority plugin's weight rules, by name (gpu_provider.plugins.priority: importing it
#: at DAG parse time would import Airflow's plugin manager)
ABSOLUTE_RULE = "gpu_provider.plugins.priority.GpuAbsolutePriority"
DOWNSTREAM_RULE = "gpu_provider.plugins.priority.GpuDownstreamPriority"


def check_team_quota(team: str | None, priority: int | None) -> None:
    """With a quota file configured: the team must be in it, and ``priority=`` within its ceiling."""
    if team is None:
        return
    from gpu_provider.quotas.file import configured_quotas

    quotas = configured_quotas()
    if quotas is not None:
        quotas.check_task(team, priority)


def priority_weight(priority: Any, weight_rule: Any = None) -> dict[str, Any]:
    """``priority=`` -> Airflow's ``priority_weight`` with the plugin's weight rule that puts backfill
    runs last: absolute with ``priority=``, downstream (Airflow's default) without; a ``weight_rule``
    the task sets itself is kept when no ``priority=`` is given."""
    if priority is None:
        return {} if weight_rule is not None else {"weight_rule": DOWNSTREAM_RULE}
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority={priority!r} ({type(priority).__name__}) must be an integer")
    if abs(priority) > 2**31 - 1:
        raise ValueError(f"priority={priority!r} must be between -2147483647 and 2147483647")
    return {"priority_weight": priority, "weight_rule": ABSOLUTE_RULE}


def positive_seconds(field: str, value: Any, maximum: float = MAX_DURATION_S) -> float | None:
    """A duration that, when given, is more than 0 seconds (``None``: not given)."""
    seconds = to_seconds(field, value, maximum=maximum)
    if seconds == 0:
        raise ValueError(f"{field}={value!r} must be > 0 seconds (None for the default)")
    return seconds


def configured_poll_interval(backend: Backend, maximum: float) -> float:
    """``[gpu_provider] poll_interval``, else the backend's own default."""
    from airflow.configuration import conf

    raw = conf.get("gpu_provider", "poll_interval", fallback="") or ""
    if raw.strip():
        value = to_seconds("[gpu_provider] poll_interval", raw, allow_none=False, maximum=maximum)
        if value:
            return value
    return backend.default_poll_interval


def configured_max_attempt_records() -> int:
    """``[gpu_provider] max_attempt_records`` (default :data:`gpu_provider.records.DEFAULT_MAX_ATTEMPT_RECORDS`)."""
    from airflow.configuration import conf

    from gpu_provider.records import DEFAULT_MAX_ATTEMPT_RECORDS

    raw = str(conf.get("gpu_provider", "max_attempt_records", fallback="") or "").strip()
    if not raw:
        return DEFAULT_MAX_ATTEMPT_RECORDS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 2:
        raise ValueError(
            f"[gpu_provider] max_attempt_records={raw!r} must be a whole number, 2 or more "
            f"(default {DEFAULT_MAX_ATTEMPT_RECORDS})"
        )
    return value


def check_spot_return_checkpoint(capacity: CapacityPolicy, checkpoint_uri: str | None, *, rendered: bool) -> None:
    """Refuse ``spot_return=SpotReturn(...)`` on a task with no checkpoint: each move back to spot is a stop the
    provider chooses, and without a checkpoint the next attempt starts from the beginning (up to ``max_moves``
    times). At parse time a templated ``checkpoint=`` passes (it is checked again once rendered, ``rendered``)."""
    spot_return = capacity.spot_return
    if spot_return is None or spot_return.max_moves == 0 or checkpoint_uri:
        return
    given = "a checkpoint= that rendered empty" if rendered else "no checkpoint="
    raise ValueError(
        f"capacity.spot_return=SpotReturn(max_moves={spot_return.max_moves}) on a task with {given}: each move "
        "back to spot stops the job at the provider's choice, and without a "
        f"checkpoint the next attempt would start from the beginning, up to {spot_return.max_moves} time(s) per "
        "run. Allowed: spot_return with a checkpoint (checkpoint=Checkpoint(uri='s3://bucket/prefix/{{ run_id | "
        "path_segment }}') or a URI string), or spot_return=None (or SpotReturn(max_moves=0)). Next step: give the "
        "task a checkpoint= that its job writes, or remove spot_return."
    )


def warn_spot_without_checkpoint(
    task_id: str, capacity: CapacityPolicy, checkpoint_uri: str | None, max_runtime_s: float | None
) -> None:
    if SPOT not in capacity.may_use or checkpoint_uri:
        return
    if max_runtime_s is None or max_runtime_s > SPOT_WITHOUT_CHECKPOINT_WARN_S:
        limit = "no max_runtime" if max_runtime_s is None else f"max_runtime={max_runtime_s:.0f}s"
        warnings.warn(
            f"task {task_id!r}: capacity={capacity!r} may run on spot, but the job has no "
            f"checkpoint= and {limit} (> {SPOT_WITHOUT_CHECKPOINT_WARN_S:.0f}s): every interruption restarts "
            "it from the beginning. Add checkpoint=Checkpoint(uri=...) or use capacity='on_demand'.",
            UserWarning,
            stacklevel=4,
        )
