"""What every backend module may use: options read with their ``[gpu_provider]`` fallback, calls
made from a signal handler, the attempt number in a job's name and the owner-try check of ``mark``.

Each backend parses its own options (their rules differ), but reading one from its argument, then
its config key, and naming the field in the error is the same everywhere.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from gpu_provider import names
from gpu_provider.backends.base import provider_config

log = logging.getLogger(__name__)

#: the end-of-log entry (POSIX sh) the multi-node entries exec into: it runs the command as a child, passes
#: SIGTERM and SIGINT on, and when the command exits prints the end-of-log marker
#: (:data:`gpu_provider.names.END_OF_LOG`) and exits with its status. A ``wait`` cut short by a trapped
#: signal returns early, hence the loop while the child lives. Kept under SageMaker's 256 characters per
#: argument, so it is an argument of its own.
END_OF_LOG_ENTRY = (
    "trap 'kill -TERM $p' TERM;trap 'kill -INT $p' INT;"
    '"$@"& p=$!;wait $p;r=$?;while kill -0 $p;do wait $p;r=$?;done 2>/dev/null;'
    # a wait cut short by a forwarded signal says 128+N; if the command then ended before the loop looked, the
    # shell holds its real status: ask once more (127: nothing left to ask for, the status above stands)
    "wait $p;q=$?;[ $q = 127 ]||r=$q;"
    f'echo "{names.END_OF_LOG} node=${{NODE_RANK:-0}} nnodes=${{NNODES:-1}} exit=$r";exit $r'
)
#: the words in front of a command that run it through :data:`END_OF_LOG_ENTRY`
END_OF_LOG_COMMAND = ("/bin/sh", "-c", END_OF_LOG_ENTRY, "gpu-provider-end")

#: how long :func:`run_bounded` callers (``cancel()``) wait before returning; the call goes on
#: in the background (below Airflow's 5 s between SIGTERM and SIGKILL of a task process)
CANCEL_WAIT_S = 4.0


def text_option(option: str, value: Any, *, config_key: str | None = None, default: str | None = None) -> str | None:
    """A text option, stripped; when empty, ``[gpu_provider] <config_key>``; when that is empty too, ``default``."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{option}={value!r} ({type(value).__name__}) must be a string")
    text = (value or "").strip()
    if not text and config_key:
        text = provider_config(config_key)
    return text or default


def json_option(option: str, value: Any, *, config_key: str, kind: type, allowed: str) -> tuple[Any, str]:
    """An option given as a ``kind`` (``dict``, ``list``) or as JSON text of one, else its config key.

    :return: the value (``None`` when neither is set) and where it came from, for the caller's own
        checks to name (``option`` or ``[gpu_provider] <config_key>``)
    """
    where = option
    if value is None or (isinstance(value, str) and not value.strip()):
        value, where = provider_config(config_key), f"[gpu_provider] {config_key}"
        if not value:
            return None, where
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where} must be {allowed}; got text that is not JSON") from None
    if not isinstance(value, kind):
        raise ValueError(f"{where} must be {allowed}; got {type(value).__name__}")
    return value, where


def list_option(option: str, value: Any, *, config_key: str, pattern: re.Pattern[str], what: str) -> list[str]:
    """A list of ids from a list, comma-separated text or JSON list text; else the config key."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value, option = provider_config(config_key), f"[gpu_provider] {config_key}"
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"{option}={text!r} is neither a JSON list nor comma-separated {what}") from None
        else:
            value = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{option}={value!r} must be a list of {what} (or comma-separated text)")
    items = [str(v).strip() for v in value]
    for item in items:
        if not pattern.fullmatch(item):
            raise ValueError(f"{option}: {item!r} is not one of {what} (expected e.g. {pattern.pattern})")
    return items


def run_bounded(what: str, fn: Callable[[], None], *, timeout: float = CANCEL_WAIT_S) -> None:
    """Run ``fn`` in a new thread and wait for it at most ``timeout`` seconds; re-raise its error.

    For calls made from a signal handler (``cancel()`` from ``on_kill``): the code the handler
    interrupted may hold a lock ``fn`` needs, ours or a library's (Airflow's connection lookup,
    urllib3's connection pool). Waiting for it on the interrupted thread would never end; a
    separate thread simply goes on once the handler has returned and the interrupted code has let
    go. The thread is not a daemon: the interpreter waits for it at exit, so a task process that
    ends normally still sends the call.

    :param what: the call, for the log
    """
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # handed to the caller below
            outcome.append(err)
        else:
            outcome.append(None)

    thread = threading.Thread(target=target, name=f"gpu-provider-{what}", daemon=False)
    thread.start()
    thread.join(timeout)
    if not outcome:
        log.warning(
            "%s did not finish within %.0fs (the service is slow or throttling, or the interrupted code holds "
            "something it needs); it goes on in the background.",
            what,
            timeout,
        )
        return
    error = outcome[0]
    if error is not None:
        raise error


def keep_bounded(cache: dict[Any, Any], key: Any, value: Any, *, limit: int) -> None:
    """``cache[key] = value``, then forget the oldest entries past ``limit``: a backend object may live
    as long as its process (a triggerer's poller, a long-lived worker), so no cache of it grows without end.
    Plain dict operations, no lock (callers may run in a signal handler)."""
    cache.pop(key, None)
    cache[key] = value  # newest last
    while len(cache) > limit:
        try:
            cache.pop(next(iter(cache)))
        except (StopIteration, KeyError, RuntimeError):  # emptied or changed meanwhile: bounded all the same
            return


def config_flag(key: str, *, default: bool) -> bool:
    """``[gpu_provider] <key>`` as a boolean (true/false, yes/no, on/off, 1/0); ``default`` when unset."""
    raw = provider_config(key).lower()
    if not raw:
        return default
    if raw in ("true", "yes", "on", "1"):
        return True
    if raw in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"[gpu_provider] {key}={raw!r}: must be true or false")


def port_option(option: str, value: Any) -> int:
    """A TCP port option (``master_port``) given as a number or text; a ``ValueError`` naming it otherwise."""
    try:
        port = int(str(value).strip())
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"{option}={value!r} must be a TCP port number (1-65535)")
    return port


def check_owner_try(owner_try: Any) -> int:
    """``owner_try`` of :meth:`~gpu_provider.backends.base.Backend.mark`, checked: an Airflow try number."""
    if isinstance(owner_try, bool) or not isinstance(owner_try, int) or owner_try < 1:
        raise ValueError(f"owner_try={owner_try!r} must be an Airflow try number (an integer, 1 or more)")
    return owner_try


def mark_tags(owner_try: int | None, collected: bool) -> dict[str, str]:
    """The tags (or labels) :meth:`~gpu_provider.backends.base.Backend.mark` writes: the owner try, checked
    (:func:`check_owner_try`), and the collected flag; ``{}`` when there is nothing to write."""
    tags: dict[str, str] = {}
    if owner_try is not None:
        tags[names.TAG_OWNER_TRY] = str(check_owner_try(owner_try))
    if collected:
        tags[names.TAG_COLLECTED] = "true"
    return tags


#: the end of an attempt's name, ``-t<try>-a<attempt>`` (:attr:`gpu_provider.backends.base.JobIdentity.name`)
ATTEMPT_NAME_END = re.compile(r"-t(\d+)-a(\d+)$")


def attempt_in_name(name: str) -> int | None:
    """The attempt number at the end of a job's name (``...-t2-a3`` -> 3); ``None`` for another name."""
    match = ATTEMPT_NAME_END.search(name)
    return int(match.group(2)) if match else None


def try_in_name(name: str) -> int | None:
    """The Airflow try number at the end of a job's name (``...-t2-a3`` -> 2); ``None`` for another name."""
    match = ATTEMPT_NAME_END.search(name)
    return int(match.group(1)) if match else None
