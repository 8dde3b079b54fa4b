"""The byte layout between the main process and a wire worker: one stream of messages each way.

A message is a 9-byte head, `kind` (u8), `conn` (u32, the connection's id, chosen by the main
process) and `length` (u32), then `length` bytes of payload. The kinds:

- worker to main: DATA (bytes the client sent), FRAMES (bytes the client sent, already split:
  the byte count on the wire, u32, then a `marshal` list of frames and whole publishes, as
  `WireConnection.receive_split` takes them; marshal is safe here because only this
  interpreter's own worker writes it), EOF (the client half-closed: it sends no more, but
  still reads), LOST (the client's socket closed; the payload is the reason, UTF-8, empty for
  a clean close);
- main to worker, without payload: CLOSE and ABORT (close the worker's descriptor: the main
  process is done with the connection), PAUSE_READING and RESUME_READING.

Nothing the clients are sent crosses here: the main process writes to their sockets itself.

Sockets themselves cross on a second Unix socket, as SCM_RIGHTS with a 4-byte conn id
(`pass_socket`, `take_socket`).

It must not know AMQP, sessions or asyncio. Sans-IO except for the two socket helpers.
"""

from __future__ import annotations

import socket
import struct

HEAD = struct.Struct(">BII")
CONN = struct.Struct(">I")
COUNT = struct.Struct(">I")

DATA = 1
LOST = 2
CLOSE = 4
ABORT = 5
PAUSE_READING = 6
RESUME_READING = 7
FRAMES = 8
EOF = 9
KINDS = frozenset((DATA, LOST, CLOSE, ABORT, PAUSE_READING, RESUME_READING, FRAMES, EOF))

MAX_PAYLOAD = 1 << 30  # far above any read or write of one turn; a larger head is corruption


class IPCError(Exception):
    """The other process sent what no Leveret process sends: the stream cannot be trusted."""


def message(kind: int, conn: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    return HEAD.pack(kind, conn, len(payload)) + payload


class Decoder:
    """Bytes in, `(kind, conn, payload)` out, in order, across any split of the stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buffer = self._buffer
        if buffer:  # parse from one immutable copy, so each payload is sliced (copied) once
            buffer += data
            data = bytes(buffer)
            buffer.clear()
        out: list[tuple[int, int, bytes]] = []
        pos = 0
        end = len(data)
        head = HEAD.size
        while end - pos >= head:
            kind, conn, length = HEAD.unpack_from(data, pos)
            if kind not in KINDS or length > MAX_PAYLOAD:
                raise IPCError(f"bad message head: kind {kind}, length {length}")
            start = pos + head
            if end - start < length:
                break
            out.append((kind, conn, data[start:start + length]))
            pos = start + length
        if pos < end:
            buffer += memoryview(data)[pos:]
        return out


def pass_socket(channel: socket.socket, conn: int, sock: socket.socket) -> None:
    """Send an accepted socket's descriptor and its id (the channel is blocking)."""
    socket.send_fds(channel, [CONN.pack(conn)], [sock.fileno()])


def take_socket(channel: socket.socket) -> tuple[int, socket.socket] | None:
    """Receive one socket sent by `pass_socket`; None when the channel is closed."""
    data, fds, _flags, _addr = socket.recv_fds(channel, CONN.size, 1)
    if not data:
        return None
    if len(data) != CONN.size or len(fds) != 1:
        for fd in fds:
            socket.close(fd)
        raise IPCError("a socket message without its id or its descriptor")
    return CONN.unpack(data)[0], socket.socket(fileno=fds[0])
