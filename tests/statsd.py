"""A StatsD server stand-in: a UDP socket on 127.0.0.1 that Airflow's stats client sends metrics to.

Fixture ``statsd`` (registered in ``tests/conftest.py``): point ``[metrics] statsd_port`` at
``statsd.getsockname()[1]`` with ``statsd_on = True``, then read what arrived with :func:`datagrams`.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def statsd() -> Iterator[socket.socket]:
    """A UDP socket standing in for a StatsD server; reads time out after 0.2 s of silence."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    try:
        yield sock
    finally:
        sock.close()


def datagrams(sock: socket.socket) -> list[str]:
    """Every metric line received so far (until 0.2 s pass with nothing new)."""
    lines: list[str] = []
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return lines
        lines.extend(data.decode().splitlines())
