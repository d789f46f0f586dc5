"""Run one Airflow *try* of a GpuJobOperator task in this process, with a chosen try number.

``dag.test()`` re-runs a task under the same try number, so it cannot show what happens when
Airflow replaces a try that lost its heartbeat with the next one while the old worker still runs
(a zombie). This script stands in for Airflow's task runner only: the real operator, the real
local backend and its processes run; the try's context holds the try number, a task state store
kept in a JSON file (shared by the tries, like Airflow's), and SIGTERM calls ``on_kill`` as
Airflow's task runner does.

Usage: run_try.py SPEC_JSON OUT_JSON — the spec gives state_dir, command, try_number, store,
run_id and poll_interval; optionally ``backend`` (a backend in mapping form, ``Backend.spec()``,
instead of the local backend on ``state_dir``), ``image``, ``checkpoint`` and ``ladder`` (a capacity
ladder's rungs, ``LadderRung`` arguments, instead of ``backend``). It writes ``OUT_JSON.pid-ready`` once
the SIGTERM handler is in place.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class FileStore:
    """The task state store of one task instance, in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, key: str) -> Any:
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        return data.get(key)

    def set(self, key: str, value: Any) -> None:
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)


class TryInstance:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.dag_id, self.task_id, self.run_id = "zombie_dag", "job", spec["run_id"]
        self.try_number, self.map_index = int(spec["try_number"]), -1
        self.start_date = datetime.now(timezone.utc)
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def main() -> None:
    spec, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    from gpu_provider.backends.local import LocalBackend
    from gpu_provider.operators import GpuJobOperator

    backend = spec.get("backend") or LocalBackend(state_dir=spec["state_dir"], grace_period=1)
    capacity = None
    if spec.get("ladder"):  # a capacity ladder: its rungs name the backends
        from gpu_provider import Ladder, LadderRung

        capacity, backend = Ladder(*[LadderRung(**rung) for rung in spec["ladder"]], backoff=0), None
    op = GpuJobOperator(
        task_id="job",
        backend=backend,
        capacity=capacity,
        checkpoint=spec.get("checkpoint"),
        command=spec["command"],
        image=spec.get("image"),
        poll_interval=spec["poll_interval"],
        deferrable=False,
    )
    context = {"ti": TryInstance(spec), "task_state_store": FileStore(Path(spec["store"]))}
    signal.signal(signal.SIGTERM, lambda *_: op.on_kill())
    out.with_name(out.name + ".pid-ready").write_text(str(os.getpid()))
    try:
        result = {"state": "success", "xcom": op.execute(context)}  # type: ignore[arg-type]
    except BaseException as err:
        result = {"state": "failed", "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
    out.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
