"""A wire worker's first pass over what a client sends: frames split, publishes gathered.

`Splitter.feed(data)` returns the messages for the main process (ipc.py): the 8-byte protocol
header as DATA, then FRAMES: a read's whole frames, in pieces of at most PIECE frames, with
each basic.publish whose content header and single body frame came in the same piece made one
item, and the publishes alike that follow it on the same channel made one run with it (the
shape `WireConnection.receive_split` takes), so that the main process spends no time on
framing, and checks and routes a run once. It decides nothing: whether a frame is allowed, on
which channel, at which frame_max, is the main process's. Framing that cannot be right (a
frame larger than the main process allows at that point of the connection, which the splitter
follows through the client's tune-ok, or a wrong frame end) turns the splitter off for that
client: from the first byte of that frame on, everything goes as DATA, and the main process's
own frame buffer gives the client the error it gives today.

It must not know sessions or sockets. One Splitter per client, one thread.
"""

from __future__ import annotations

import marshal
import struct
from collections.abc import Iterator
from typing import Any

from leveret.amqp import constants as c
from leveret.amqp.frames import FrameBuffer
from leveret.broker.workers import ipc

PROTOCOL_HEADER_SIZE = 8
PUBLISH = c.BASIC_PUBLISH.to_bytes(4, "big")
TUNE_OK = (0x000A001F).to_bytes(4, "big")  # connection.tune-ok
TUNE_OK_FIELDS = struct.Struct(">IHIH")  # class and method, channel_max, frame_max, heartbeat
# Frames per FRAMES message. A big read leaves in pieces, each sent at once (worker.py), so that
# the main process works on the first while this one splits the next.
PIECE = 384


class Splitter:
    __slots__ = ("frame_max", "frames", "header_left", "raw", "tuned")

    def __init__(self, frame_max: int) -> None:
        # The main process's frame buffer's limit, followed: the protocol minimum until the
        # client's tune-ok, then what it asked for (so that a frame too large is refused on
        # its header, not waited for)
        self.frames = FrameBuffer(min(frame_max, c.MIN_FRAME_MAX) if frame_max else 0)
        self.frame_max = frame_max
        self.tuned = False
        self.header_left = PROTOCOL_HEADER_SIZE
        self.raw = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """(kind, payload) messages for the main process, in order."""
        return list(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """The same messages, each split only when the one before it has been taken: the
        worker sends a piece to the main process before it splits the next."""
        if self.raw:
            yield ipc.DATA, data
            return
        if self.header_left:
            head, data = data[:self.header_left], data[self.header_left:]
            self.header_left -= len(head)
            yield ipc.DATA, head
            if not data:
                return
        if not self.tuned:
            # Before the tune-ok, the whole read at the protocol minimum, as the main process
            # frames it: the tune-ok's frame_max applies from the next read on.
            frames = self.frames.feed(data)
            self._follow_tune_ok(frames)
            for start in range(0, len(frames), PIECE):
                yield self._message(frames[start:start + PIECE])
        else:
            frames = self.frames.feed(data, PIECE)
            while frames:
                yield self._message(frames)
                if len(frames) < PIECE:
                    break
                frames = self.frames.feed(b"", PIECE)
        if self.frames.error is not None:
            self.raw = True
            rest = self.frames.take_rest()
            if rest:
                yield ipc.DATA, rest

    @staticmethod
    def _message(piece: list[tuple[int, int, bytes]]) -> tuple[int, bytes]:
        size = sum(len(frame[2]) for frame in piece) + c.FRAME_OVERHEAD * len(piece)
        return ipc.FRAMES, ipc.COUNT.pack(size) + marshal.dumps(gather(piece))

    def _follow_tune_ok(self, frames: list[tuple[int, int, bytes]]) -> None:
        for frame_type, channel, payload in frames:
            if frame_type == c.FRAME_METHOD and channel == 0 and payload[:4] == TUNE_OK:
                self.tuned = True
                if len(payload) >= TUNE_OK_FIELDS.size:
                    _ids, _channel_max, asked, _heartbeat = TUNE_OK_FIELDS.unpack_from(payload)
                    if asked >= c.MIN_FRAME_MAX and (not self.frame_max or asked <= self.frame_max):
                        self.frames.set_frame_max(asked)
                # else the main process refuses the tune-ok and closes the connection
                return


def gather(frames: list[tuple[int, int, bytes]]) -> list[Any]:
    """Frames as items. A publish, its header and its body frame on one channel become one
    item, `[channel, method payload, header, body]`; the publishes right after it on the same
    channel with the same method payload (exchange, routing key, flags) join it as more
    `header, body` pairs, so that the main process checks and routes the run once. Any other
    frame stays a `(type, channel, payload)` tuple."""
    items: list[Any] = []
    append = items.append
    run: list[Any] | None = None  # the last item, while it is a run that may go on
    i = 0
    count = len(frames)
    while i < count:
        frame = frames[i]
        if (frame[0] == c.FRAME_METHOD and frame[2][:4] == PUBLISH and i + 2 < count):
            number = frame[1]
            header, body = frames[i + 1], frames[i + 2]
            if (header[0] == c.FRAME_HEADER and body[0] == c.FRAME_BODY
                    and header[1] == number and body[1] == number):
                if run is not None and run[0] == number and run[1] == frame[2]:
                    run += (header[2], body[2])
                else:
                    run = [number, frame[2], header[2], body[2]]
                    append(run)
                i += 3
                continue
        append(frame)
        run = None
        i += 1
    return items
