"""FrameBuffer: bytes in, raw frames out.

It splits a byte stream into (frame type, channel, payload) triples, checking the frame size
against the negotiated frame_max before anything is decoded, the frame-end octet and the frame
type. It does not decode payloads. One FrameBuffer belongs to one connection and one thread.
"""

from __future__ import annotations

import struct

from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError, frame_error

_HEADER = struct.Struct(">BHI")
_VALID_TYPES = frozenset({c.FRAME_METHOD, c.FRAME_HEADER, c.FRAME_BODY, c.FRAME_HEARTBEAT})

Frame = tuple[int, int, bytes]


class FrameBuffer:
    """Accumulates received bytes and yields whole frames."""

    __slots__ = ("_buf", "max_payload")

    def __init__(self, frame_max: int = c.DEFAULT_FRAME_MAX) -> None:
        self._buf = bytearray()
        self.max_payload = frame_max - c.FRAME_OVERHEAD

    def set_frame_max(self, frame_max: int) -> None:
        self.max_payload = frame_max - c.FRAME_OVERHEAD

    def __len__(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes and return every frame now complete.

        Raises AMQPError (501 FRAME_ERROR) for an oversized frame, a bad frame end or an
        unknown frame type; the frames before the bad one are lost with the connection.
        """
        buf = self._buf
        buf += data
        size_buf = len(buf)
        pos = 0
        frames: list[Frame] = []
        unpack_from = _HEADER.unpack_from
        max_payload = self.max_payload
        while size_buf - pos >= 7:
            frame_type, channel, size = unpack_from(buf, pos)
            if frame_type not in _VALID_TYPES:
                raise frame_error(f"type {frame_type}, all octets = <<>>: unknown_frame")
            if size > max_payload:
                raise frame_error(
                    f"type {frame_type}, all octets = <<>>: "
                    f"{{frame_too_large,{size},{max_payload}}}"
                )
            end = pos + 7 + size
            if end >= size_buf:
                break
            if buf[end] != c.FRAME_END:
                raise frame_error(
                    f"type {frame_type}, all octets = <<>>: {{invalid_frame_end_marker,{buf[end]}}}"
                )
            frames.append((frame_type, channel, bytes(buf[pos + 7 : end])))
            pos = end + 1
        if pos:
            del buf[:pos]
        return frames


def check_heartbeat_channel(channel: int) -> None:
    if channel != 0:
        raise AMQPError(c.UNEXPECTED_FRAME, f"type {c.FRAME_HEARTBEAT}, all octets = <<>>")


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _HEADER.pack(frame_type, channel, len(payload)) + payload + c.FRAME_END_BYTE


HEARTBEAT_FRAME = encode_frame(c.FRAME_HEARTBEAT, 0, b"")
