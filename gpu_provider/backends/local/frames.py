"""The fork server's messages: length-prefixed JSON objects over a Unix socket, and the peer's uid.

Each message is a 4-byte big-endian length and that many bytes of UTF-8 JSON (an object); both ends of
:mod:`gpu_provider.backends.local.forkserver` (the worker asking and the server or its forked child
answering) speak it.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

#: the most bytes of one message (a request, a reply, the job's environment)
MAX_FRAME = 64 * 1024 * 1024


def send(conn: socket.socket, data: Mapping[str, Any]) -> None:
    raw = json.dumps(data).encode("utf-8")
    conn.sendall(struct.pack(">I", len(raw)) + raw)


def recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        piece = conn.recv(min(size - len(chunks), 1 << 20))
        if not piece:
            raise EOFError(f"the connection closed after {len(chunks)} of {size} bytes")
        chunks += piece
    return bytes(chunks)


def recv(conn: socket.socket) -> dict[str, Any]:
    (size,) = struct.unpack(">I", recv_exact(conn, 4))
    if size > MAX_FRAME:
        raise ValueError(f"a message of {size} bytes (at most {MAX_FRAME})")
    data = json.loads(recv_exact(conn, size))
    if not isinstance(data, dict):
        raise ValueError("a message that is not a JSON object")
    return data


def peer_uid(conn: socket.socket) -> int:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])
