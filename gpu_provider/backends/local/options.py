"""Options of the local backend, parsed and checked: values may come as strings from Jinja templates.

Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_provider.backends.base import provider_config
from gpu_provider.job import MAX_DURATION_S, safe_repr

#: user names ``run_as_user`` accepts (what ``useradd`` accepts; no path or option characters)
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def seconds_option(option: str, value: Any, item: Any = None) -> float:
    """One duration in seconds (a number or a numeric string), from 0 to ``MAX_DURATION_S`` (366 days)."""
    shown = value if item is None else item
    seconds: float | None = None
    if _is_number(shown):
        try:
            seconds = float(shown)
        except OverflowError:  # an int past float's range
            seconds = None
    elif isinstance(shown, str):
        try:
            seconds = float(shown.strip())
        except ValueError:
            seconds = None
    if seconds is None or not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:
        what = f"{option}={safe_repr(value)}" + (f": entry {safe_repr(item)}" if item is not None else "")
        raise ValueError(f"{what} is not a number of seconds from 0 to {MAX_DURATION_S:.0f} (366 days)")
    return seconds


def _split_list_text(option: str, value: str, what: str, usage: str) -> list[Any]:
    """A list given as template text: JSON (``"[8, 5]"``) or comma-separated (``"8,5"``)."""
    text = value.strip()
    if not text.startswith("["):
        return [part.strip() for part in text.split(",")]
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, list):
        raise ValueError(f"{option}={value!r} is not a {what}; {usage}")
    return parsed


def parse_simulate_preemptions(value: Any) -> tuple[float, ...]:
    """``[8, 5]``, ``"8,5"``, ``"[8, 5]"``, ``"8"``, ``8`` -> ``(8.0, 5.0)``; ``""``, ``"None"``, ``None`` -> ``()``."""
    usage = "use seconds after start for each spot attempt, e.g. [8, 5] or '8,5' (empty or None: no interruptions)"
    items: list[Any]
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "none", "null"):
            return ()
        items = _split_list_text("simulate_preemptions", value, "list", usage)
    elif _is_number(value):
        items = [value]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise TypeError(f"simulate_preemptions={value!r} ({type(value).__name__}) is not a list of seconds; {usage}")
    try:
        return tuple(seconds_option("simulate_preemptions", value, item) for item in items)
    except ValueError as err:
        raise ValueError(f"{err}; {usage}") from None


def parse_gpus(value: Any) -> str | tuple[int, ...]:
    """``"auto"`` (ask nvidia-smi) or device indices: ``[0, 1]``, ``"0,1"``, ``"[0, 1]"``; ``"none"``, ``[]``: none."""
    usage = "use 'auto' (detect with nvidia-smi) or a list of device indices such as [0, 1] or '0,1' ([] for none)"
    items: list[Any]
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return "auto"
        if text.lower() in ("", "none", "[]"):
            return ()
        items = _split_list_text("gpus", value, "device list", usage)
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        # a bare int is refused: gpus=2 could mean "two GPUs" as well as "device 2"
        raise TypeError(f"gpus={value!r} ({type(value).__name__}) is not a device list; {usage}")
    devices: list[int] = []
    for item in items:
        if isinstance(item, str) and item.strip().isdigit():
            item = int(item.strip())
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise ValueError(f"gpus={value!r}: {item!r} is not a device index (an integer >= 0); {usage}")
        if item in devices:
            raise ValueError(f"gpus={value!r}: device {item} is listed twice; {usage}")
        devices.append(item)
    return tuple(devices)


def parse_run_as_user(value: Any) -> str | None:
    """``"nobody"`` -> ``"nobody"``; ``None``, ``""``, ``"none"`` -> ``None`` (run as the worker's user)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"run_as_user={value!r} ({type(value).__name__}) must be a user name or None")
    text = value.strip()
    if text.lower() in ("", "none"):
        return None
    if not _USER_NAME.fullmatch(text):
        raise ValueError(
            f"run_as_user={value!r} is not a user name (letters, digits, '_', '.', '-', at most 32 characters)"
        )
    return text


def resolve_run_as(user: str | None) -> dict[str, Any] | None:
    """The account the job's processes switch to, or ``None`` to run as the worker's user.

    :raises ValueError: no such user, or the worker cannot switch to it (it does not run as root)
    """
    if user is None:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"run_as_user={user!r}: there is no such user on this machine") from None
    euid = os.geteuid()
    if entry.pw_uid == euid:
        return None  # already that user: nothing to switch
    if euid != 0:
        raise ValueError(
            f"run_as_user={user!r}: the Airflow worker runs as uid {euid}, not as root, so it cannot start "
            "processes as another user. Run the worker as root (as Airflow's own run_as_user impersonation "
            "needs sudo), or leave run_as_user unset"
        )
    return {
        "user": entry.pw_name,
        "uid": entry.pw_uid,
        "gid": entry.pw_gid,
        "groups": sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))),
        "home": entry.pw_dir,
    }


def default_run_as_user() -> str | None:
    """``[gpu_provider] local_run_as_user`` from the Airflow config, else ``None`` (the worker's user)."""
    return provider_config("local_run_as_user") or None


def default_state_dir() -> Path:
    """``[gpu_provider] local_state_dir`` from the Airflow config, else ``$AIRFLOW_HOME/gpu_provider/local``."""
    configured = provider_config("local_state_dir")
    if configured:
        return Path(configured).expanduser().absolute()
    home = os.environ.get("AIRFLOW_HOME") or "~/airflow"
    return (Path(home).expanduser() / "gpu_provider" / "local").absolute()


def fork_server_settings() -> tuple[bool, float]:
    """``[gpu_provider] local_fork_server`` (``true``/``false``, default ``true``) and
    ``local_fork_server_idle_s`` (seconds, default 600): whether jobs' supervisors are forked by a
    per-user fork server, and how long it waits for a request before it exits."""
    text = provider_config("local_fork_server").lower()
    if text in ("", "true", "1", "yes", "on"):
        enabled = True
    elif text in ("false", "0", "no", "off"):
        enabled = False
    else:
        raise ValueError(
            f"[gpu_provider] local_fork_server={text!r} is not a boolean; allowed: true, false (default true)"
        )
    idle = provider_config("local_fork_server_idle_s")
    idle_s = seconds_option("[gpu_provider] local_fork_server_idle_s", idle) if idle else 600.0
    return enabled, idle_s
