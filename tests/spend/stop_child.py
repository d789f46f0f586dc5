"""Stops a local job the way the reaper or a deferred task's killed trigger does, in a process of its own
(Airflow's stats client there is set up from the ``[metrics]`` environment the test gives it), and prints
the reaper's report as JSON.

``python -m tests.spend.stop_child reap STATE_DIR API_URL`` or
``python -m tests.spend.stop_child trigger STATE_DIR HANDLE_JSON SPEND_JSON``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from gpu_provider.backends.local import LocalBackend


def main(argv: list[str]) -> None:
    mode, state_dir = argv[0], argv[1]
    backend = LocalBackend(state_dir=state_dir)
    if mode == "reap":
        from gpu_provider.spend.prices import PriceBook
        from gpu_provider.spend.reaper import AirflowApi, reap

        api = AirflowApi(argv[2], username="reaper", password="s3cret")
        report = reap([backend], api, dry_run=False, grace_period_s=0, book=PriceBook(local_gpu_hour_usd=36.0))
        print(json.dumps(report.to_dict()))
        return
    from gpu_provider.triggers.gpu_job import GpuJobTrigger

    trigger = GpuJobTrigger(
        backend=backend.spec(),
        handle=json.loads(argv[2]),
        task_label="Airflow task killed_dag.job of run manual__1",
        try_number=1,
        spend=json.loads(argv[3]),
    )
    asyncio.run(trigger.on_kill())
    print(json.dumps({"killed": True}))


if __name__ == "__main__":
    main(sys.argv[1:])
