"""The stream protocol's framing and primitive types: bytes in, frames out, and back.

A frame is `u32 size` and then `size` bytes: `u16 key`, `u16 version`, the command's fields.
Integers are big-endian; a string is an i16 length and UTF-8 bytes (-1: null); bytes are an
i32 length and the bytes; arrays and maps are an i32 count and their items. FrameBuffer splits
a byte stream into frames and checks each declared size against frame_max before the frame's
bytes are gathered, as rabbit_stream_core does. Decoder reads fields from one frame; the
`enc_*` helpers build them.

Pure: no I/O, nothing of the broker or the model. A malformed field raises FrameError.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">IHH")
_HEAD_CORR = struct.Struct(">IHHI")


class FrameError(Exception):
    """A frame that cannot be decoded (truncated, or a field out of range)."""


class FrameTooLarge(Exception):
    """A frame declared a size above frame_max."""

    def __init__(self, size: int, frame_max: int) -> None:
        super().__init__(f"frame size {size} exceeds maximum {frame_max}")
        self.size = size
        self.frame_max = frame_max


class FrameBuffer:
    """Bytes in, whole frames (without their size prefix) out."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max  # 0: unlimited
        self._buf = bytearray()
        self.failed = False

    def feed(self, data: bytes) -> list[bytes]:
        """The frames completed by `data`, in order; FrameTooLarge once a size is over the max
        (the frames before it are lost with it: the connection is closing)."""
        if self.failed:
            return []
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            size = _U32.unpack_from(buf, pos)[0]
            if self.frame_max and size > self.frame_max:
                self.failed = True
                del buf[:]
                raise FrameTooLarge(size, self.frame_max)
            if end - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames


class Decoder:
    """Reads a frame's fields in order."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def _take(self, st: struct.Struct) -> int:
        try:
            value: int = st.unpack_from(self.data, self.pos)[0]
        except struct.error:
            raise FrameError("truncated frame") from None
        self.pos += st.size
        return value

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def i16(self) -> int:
        return self._take(_I16)

    def u32(self) -> int:
        return self._take(_U32)

    def i32(self) -> int:
        return self._take(_I32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def raw(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise FrameError("truncated frame")
        value = self.data[self.pos : self.pos + size]
        self.pos += size
        return value

    def string(self) -> str:
        size = self.i16()
        if size < 0:
            return ""
        try:
            return self.raw(size).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("a string is not UTF-8") from None

    def bytes_(self) -> bytes:
        size = self.i32()
        return b"" if size < 0 else self.raw(size)

    def count(self) -> int:
        size = self.i32()
        if size < 0 or size > len(self.data):
            raise FrameError("bad array size")
        return size

    def strings(self) -> list[str]:
        return [self.string() for _ in range(self.count())]

    def map(self) -> dict[str, str]:
        return {self.string(): self.string() for _ in range(self.count())}

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def done(self) -> None:
        """Fields past the end of a command are a malformed frame, as RabbitMQ parses it."""
        if self.pos != len(self.data):
            raise FrameError("trailing bytes in frame")


def enc_string(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff"
    raw = value.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def enc_bytes(value: bytes | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    return _I32.pack(len(value)) + value


def enc_strings(values: Iterable[str]) -> bytes:
    items = [enc_string(v) for v in values]
    return _I32.pack(len(items)) + b"".join(items)


def enc_map(values: Mapping[str, str]) -> bytes:
    return _I32.pack(len(values)) + b"".join(
        enc_string(k) + enc_string(v) for k, v in values.items()
    )


def frame(key: int, version: int, body: bytes) -> bytes:
    """A whole frame: the size, key, version and the command's fields."""
    return _HEAD.pack(4 + len(body), key, version) + body


def response(key: int, correlation_id: int, code: int, body: bytes = b"") -> bytes:
    """The response to a request: the key with its high bit, the correlation id, the code."""
    return _HEAD_CORR.pack(10 + len(body), key | 0x8000, 1, correlation_id) + (
        _U16.pack(code) + body
    )


def request(key: int, correlation_id: int, body: bytes) -> bytes:
    """A request the server sends (Close, ConsumerUpdate)."""
    return _HEAD_CORR.pack(8 + len(body), key, 1, correlation_id) + body


u8 = _U8.pack
u16 = _U16.pack
u32 = _U32.pack
i32 = _I32.pack
u64 = _U64.pack
i64 = _I64.pack
