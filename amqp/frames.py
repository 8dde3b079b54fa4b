"""FrameBuffer: bytes in, raw frames out.

It splits a byte stream into (frame type, channel, payload) triples. It checks the payload size
against the negotiated frame_max as soon as a frame header is in (before the payload is even
buffered, let alone decoded), and the frame-end octet once the frame is complete. Both errors
mean the stream has lost sync: they are 501 FRAME_ERROR, the buffer keeps the error and drops
all later input. It does not decode payloads, and it passes frames of any type on: an unknown
type is a frame-level error that the connection reports (RabbitMQ reads such a frame whole and
stays in sync). One FrameBuffer belongs to one connection and one thread.
"""

from __future__ import annotations

import struct

from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError, frame_error, frame_explanation

_HEADER = struct.Struct(">BHI")
VALID_TYPES = frozenset({c.FRAME_METHOD, c.FRAME_HEADER, c.FRAME_BODY, c.FRAME_HEARTBEAT})

Frame = tuple[int, int, bytes]


class FrameBuffer:
    """Accumulates received bytes and yields whole frames."""

    __slots__ = ("_buf", "error", "frame_max")

    def __init__(self, frame_max: int = c.MIN_FRAME_MAX) -> None:
        self._buf = bytearray()
        self.frame_max = frame_max
        self.error: AMQPError | None = None

    def set_frame_max(self, frame_max: int) -> None:
        self.frame_max = frame_max

    def __len__(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes, max_frames: int = 0) -> list[Frame]:
        """Add received bytes and return every frame now complete (at most `max_frames` of
        them, if given: the rest stay buffered for the next call).

        On an oversized frame or a bad frame end, the frames before it are still returned, and
        `error` holds the 501 FRAME_ERROR to close the connection with. From then on the buffer
        is out of sync with the peer, and feed() drops whatever it is given.
        """
        if self.error is not None:
            return []
        buf = self._buf
        if buf:  # parse from one immutable copy, so each payload is sliced (copied) once
            buf += data
            data = bytes(buf)
            buf.clear()
        size_buf = len(data)
        pos = 0
        frames: list[Frame] = []
        unpack_from = _HEADER.unpack_from
        # RabbitMQ lets a payload reach frame_max itself: clients often forget the 8 bytes of
        # frame overhead, so it allows them as slack. The error still quotes frame_max - 8.
        # A frame_max of 0 means no limit.
        frame_max = self.frame_max or 0xFFFFFFFF
        limit = max_frames or -1  # -1: never reached
        while size_buf - pos >= 7 and len(frames) != limit:
            frame_type, channel, size = unpack_from(data, pos)
            if size > frame_max:
                self._fail(
                    frame_explanation(
                        frame_type, b"", "frame_too_large", size, frame_max - c.FRAME_OVERHEAD
                    )
                )
                break
            end = pos + 7 + size
            if end >= size_buf:
                break
            if data[end] != c.FRAME_END:
                payload = data[pos + 7 : end]
                self._fail(
                    frame_explanation(frame_type, payload, "invalid_frame_end_marker", data[end])
                )
                break
            frames.append((frame_type, channel, data[pos + 7 : end]))
            pos = end + 1
        if pos < size_buf:  # the incomplete frame waits for more bytes (or is what failed)
            buf += memoryview(data)[pos:]
        return frames

    def take_rest(self) -> bytes:
        """The bytes not returned as frames: an incomplete frame, or everything from the frame
        that failed on (a wire worker passes them on as they came: docs/WORKERS.md)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    def _fail(self, explanation: str) -> None:
        self.error = frame_error(explanation)


def unknown_frame(frame_type: int, payload: bytes) -> AMQPError:
    """501 for a frame RabbitMQ cannot even analyze: an unknown type, a method frame shorter
    than its class and method ids, a content header shorter than its fixed part, a heartbeat
    with a payload."""
    return frame_error(frame_explanation(frame_type, payload, "unknown_frame"))


def unexpected_frame_type(frame_type: int, payload: bytes) -> AMQPError:
    """505 for a frame of a type the channel or connection cannot take here."""
    return AMQPError(c.UNEXPECTED_FRAME, frame_explanation(frame_type, payload))


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _HEADER.pack(frame_type, channel, len(payload)) + payload + c.FRAME_END_BYTE


HEARTBEAT_FRAME = encode_frame(c.FRAME_HEARTBEAT, 0, b"")
