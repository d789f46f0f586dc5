"""Contract (of the backend and its world): two multi-node jobs running at once rendezvous each among its own nodes.

On a real service every job has hosts (nodes, pods) of its own, so two jobs may both use ``MASTER_PORT`` 29500. The
emulators run every host on this machine: each job gets a port of its own there, the same for all its nodes
(`gpu_provider/testing/emulators/core.py::own_rendezvous_port`); the local backend picks a free port per job. Before,
two test workers' two-node SageMaker jobs at once met on 127.0.0.1:29500 and failed ("rank 1 disagrees on the run").
"""

from __future__ import annotations

import re
import time

import pytest

from gpu_provider.backends.base import JobState
from tests.backends.contract.worlds import BackendWorld, marked, poll_one, py, read_until, worlds_where

MULTI_NODE_WORLDS = worlds_where(lambda caps: caps.multi_node)
PORT = re.compile(r"rendezvous-port job=(\w+) rank=(\d) port=(\d+)")


def _job(label: str) -> tuple[str, ...]:
    return py(
        f"""
        import os, time
        print('rendezvous-port job={label} rank=' + os.environ['NODE_RANK'] + ' port=' + os.environ['MASTER_PORT'],
              flush=True)
        time.sleep(1.0 if os.environ['NODE_RANK'] == '0' else 0.5)  # both jobs run at once
        """
    )


@pytest.mark.parametrize("world", MULTI_NODE_WORLDS, indirect=True)
def test_two_multi_node_jobs_at_once_each_rendezvous_on_a_port_of_their_own(world: BackendWorld) -> None:
    backend = world.backend()
    handles = {label: backend.submit(world.request(f"rdv-{label}", _job(label), nodes=2)) for label in ("a", "b")}
    deadline = time.monotonic() + 60
    while not all(poll_one(backend, h).state.terminal for h in handles.values()):
        assert time.monotonic() < deadline, "the two jobs did not end within 60 s"
        time.sleep(0.2)
    ports: dict[str, set[str]] = {}
    for label, handle in handles.items():
        assert poll_one(backend, handle).state is JobState.SUCCEEDED
        lines = read_until(backend, handle, lambda got: len(marked(got, PORT)) >= 2)
        seen = {(m.group(1), m.group(2)): m.group(3) for m in marked(lines, PORT)}
        assert set(seen) == {(label, "0"), (label, "1")}, seen
        ports[label] = set(seen.values())
    assert len(ports["a"]) == 1 and len(ports["b"]) == 1, ports  # one port per job, shared by its nodes
    assert ports["a"] != ports["b"], ports  # and never another running job's
