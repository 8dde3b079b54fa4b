"""A wire worker's first pass over what a client sends: frames split, publishes gathered.

`Splitter.feed(data)` returns the messages for the main process (ipc.py): the 8-byte protocol
header as DATA, then FRAMES, each one read's whole frames with every basic.publish whose
content header and single body frame came in the same read gathered into one item (the shape
`WireConnection.receive_split` takes), so that the main process spends no time on framing. It
decides nothing: whether a frame is allowed, on which channel, at which frame_max, is the main
process's. Framing that cannot be right (a frame larger than the broker's frame_max, a wrong
frame end) turns the splitter off for that client: from the first byte of that frame on,
everything goes as DATA, and the main process's own frame buffer gives the client the
error it gives today.

It must not know sessions or sockets. One Splitter per client, one thread.
"""

from __future__ import annotations

import marshal
from typing import Any

from leveret.amqp import constants as c
from leveret.amqp.frames import FrameBuffer
from leveret.broker.workers import ipc

PROTOCOL_HEADER_SIZE = 8
PUBLISH = c.BASIC_PUBLISH.to_bytes(4, "big")
# Frames per FRAMES message. A big read leaves in pieces, each sent at once (worker.py), so that
# the main process works on the first while this one splits the next.
PIECE = 384


class Splitter:
    def __init__(self, frame_max: int) -> None:
        self.frames = FrameBuffer(frame_max)
        self.header_left = PROTOCOL_HEADER_SIZE
        self.raw = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """(kind, payload) messages for the main process, in order."""
        out: list[tuple[int, bytes]] = []
        if self.raw:
            return [(ipc.DATA, data)]
        if self.header_left:
            head, data = data[:self.header_left], data[self.header_left:]
            self.header_left -= len(head)
            out.append((ipc.DATA, head))
            if not data:
                return out
        frames = self.frames.feed(data)
        for start in range(0, len(frames), PIECE):
            piece = frames[start:start + PIECE]
            size = sum(len(frame[2]) for frame in piece) + c.FRAME_OVERHEAD * len(piece)
            out.append((ipc.FRAMES, ipc.COUNT.pack(size) + marshal.dumps(gather(piece))))
        if self.frames.error is not None:
            self.raw = True
            rest = self.frames.take_rest()
            if rest:
                out.append((ipc.DATA, rest))
        return out


def gather(frames: list[tuple[int, int, bytes]]) -> list[Any]:
    """Frames as items: a publish, its header and its body frame on one channel become one."""
    items: list[Any] = []
    append = items.append
    i = 0
    count = len(frames)
    while i < count:
        frame = frames[i]
        if (frame[0] == c.FRAME_METHOD and frame[2][:4] == PUBLISH and i + 2 < count):
            number = frame[1]
            header, body = frames[i + 1], frames[i + 2]
            if (header[0] == c.FRAME_HEADER and body[0] == c.FRAME_BODY
                    and header[1] == number and body[1] == number):
                append((number, frame[2], header[2], body[2]))
                i += 3
                continue
        append(frame)
        i += 1
    return items
