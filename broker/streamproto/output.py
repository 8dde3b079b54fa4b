"""How a stream connection's output reaches its socket without copying Deliver data.

A turn's output is a list of pieces: small frames, and the entries of whole chunks (views of
the bytes a reader read, hundreds of KB each). Joining them copies every chunk once more before
the kernel copies it again, so `Writer.write` sends them with one `os.writev` on the socket
when it can: a plain TCP socket of asyncio's selector event loop (no TLS) whose transport has
nothing buffered, so the bytes still go out in order. What the socket does not take then goes
through `transport.write` (the transport copies only that rest and sends it when the socket is
writable, pausing the protocol as usual). Otherwise (TLS, uvloop, a buffered transport) big
pieces go to `transport.write` one by one and small ones joined.

Must not know: frames, subscriptions. Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
import os
from asyncio import selector_events
from collections.abc import Sequence

# pieces this big (a Deliver's entries) are never copied into a join
WRITE_ALONE_BYTES = 16 * 1024
_IOV_MAX = 1024  # Linux's limit on one writev's pieces
_PLAIN_TRANSPORT = getattr(selector_events, "_SelectorSocketTransport", None)

Piece = bytes | bytearray | memoryview


class Writer:
    """The output side of one connection's transport."""

    __slots__ = ("fd", "transport")

    def __init__(self, transport: asyncio.Transport, tls: bool) -> None:
        self.transport = transport
        self.fd = -1  # the socket's descriptor when writev may be used
        if (not tls and _PLAIN_TRANSPORT is not None and isinstance(transport, _PLAIN_TRANSPORT)
                and transport.get_extra_info("sslcontext") is None):
            sock = transport.get_extra_info("socket")
            if sock is not None:
                self.fd = sock.fileno()

    def write(self, out: Sequence[Piece]) -> int:
        """Send `out` in order; return how many bytes that is."""
        transport = self.transport
        if len(out) == 1:
            transport.write(out[0])
            return len(out[0])
        if self.fd >= 0 and len(out) <= _IOV_MAX and not transport.get_write_buffer_size():
            return self._writev(out)
        return self._write_pieces(out)

    def _writev(self, out: Sequence[Piece]) -> int:
        total = sum(map(len, out))
        try:
            sent = os.writev(self.fd, out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the transport's own write meets the error and reports it
            return self._write_pieces(out)
        if sent < total:
            self.transport.write(b"".join(_rest(out, sent)))
        return total

    def _write_pieces(self, out: Sequence[Piece]) -> int:
        """Big pieces as they are, runs of small ones joined."""
        transport = self.transport
        small: list[Piece] = []
        total = 0
        for piece in out:
            total += len(piece)
            if len(piece) < WRITE_ALONE_BYTES:
                small.append(piece)
                continue
            if small:
                transport.write(b"".join(small))
                small = []
            transport.write(piece)
        if small:
            transport.write(b"".join(small))
        return total


def _rest(out: Sequence[Piece], sent: int) -> list[Piece]:
    """The pieces of `out` after its first `sent` bytes."""
    for i, piece in enumerate(out):
        if sent < len(piece):
            return [memoryview(piece)[sent:], *out[i + 1:]]
        sent -= len(piece)
    return []
