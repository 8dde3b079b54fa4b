"""Node-to-node link frames: bytes in, frames out, with no I/O (the sans-IO half of link.py).

Role: the byte layout of the cluster link (docs/FORMAT.md, section 9). A frame is a 9-byte
header, `u32 length | u8 type | u32 CRC-32C`, then `length` bytes of payload; the CRC covers the
first five header bytes and the payload. Control frames carry compact JSON objects; a CHUNK
frame carries a small struct (epoch, stream reference) and then raw bytes, passed on untouched.
`FrameDecoder` splits a byte stream into `Frame`s. It checks the length against its maximum and
the type against the known ones as soon as a header is in, before any of the payload is
buffered, and the CRC once the frame is whole. Any of these errors means the stream has lost
sync: the decoder keeps the typed `FrameError`, returns the frames before it, and drops all
later input (the shape of leveret.amqp.frames.FrameBuffer).

It must not know AMQP, queues, etcd or asyncio: it deals in bytes, JSON objects and errors.

Threading: none of its own. One decoder belongs to one link, used from one thread.
"""

from __future__ import annotations

import json
import struct
from enum import IntEnum
from typing import Any, NamedTuple, TypeVar

from leveret.storage.chunk import crc32c

HEADER = struct.Struct(">IBI")
HEADER_SIZE = HEADER.size  # 9
_PREFIX = struct.Struct(">IB")  # the CRC'd part of the header: length and type
_CHUNK_HEAD = struct.Struct(">QH")  # epoch, length of the stream reference
DEFAULT_MAX_PAYLOAD = 16 * 1024 * 1024 + 64 * 1024  # a 16 MiB chunk plus room for its head
T = TypeVar("T")


class FrameType(IntEnum):
    HELLO = 1  # handshake: version, cluster, node, nonce (and, from the server, its proof)
    AUTH = 2  # handshake: the client's proof
    READY = 3  # handshake: the server accepts the client
    CLOSE = 4  # refusal or clean close: code and message
    REQUEST = 5  # id, kind, body: answered by one REPLY with the same id
    REPLY = 6  # id and body, or id and error
    MESSAGE = 7  # one-way: kind and body
    CHUNK = 8  # one-way raw bytes: epoch, stream reference, data
    HEARTBEAT = 9  # empty
    TUNNEL = 10  # one-way raw bytes of a tunnel: u32 tunnel id, then its bytes (empty: closed)


KNOWN_TYPES = frozenset(int(t) for t in FrameType)


class Frame(NamedTuple):
    type: FrameType
    payload: bytes


class FrameError(Exception):
    """The byte stream broke the link's framing; the link is out of sync and must close."""


class FrameTooLarge(FrameError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame payload of {length} bytes exceeds the limit of {limit}")
        self.length = length
        self.limit = limit


class UnknownFrameType(FrameError):
    def __init__(self, frame_type: int) -> None:
        super().__init__(f"unknown frame type {frame_type}")
        self.frame_type = frame_type


class BadCrc(FrameError):
    def __init__(self, frame_type: int, expected: int, actual: int) -> None:
        super().__init__(
            f"bad CRC on a frame of type {frame_type}: header says {expected:#010x}, "
            f"content gives {actual:#010x}")
        self.expected = expected
        self.actual = actual


class MalformedPayload(FrameError):
    """A frame whose CRC is right but whose payload does not parse as its type's layout."""


class UnexpectedFrame(FrameError):
    """A well-formed frame of a type the link cannot take in its present state."""


def frame_crc(frame_type: int, payload: bytes | memoryview) -> int:
    return int(crc32c(payload, crc32c(_PREFIX.pack(len(payload), frame_type))))


def encode(frame_type: FrameType, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), frame_type, frame_crc(frame_type, payload)) + payload


def encode_json(frame_type: FrameType, obj: dict[str, Any]) -> bytes:
    return encode(frame_type, json.dumps(obj, separators=(",", ":")).encode())


def decode_json(frame: Frame) -> dict[str, Any]:
    """The JSON object of a control frame; MalformedPayload if it is not one."""
    try:
        obj = json.loads(frame.payload)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep to parse
        raise MalformedPayload(f"{frame.type.name} payload is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise MalformedPayload(f"{frame.type.name} payload is not a JSON object")
    return obj


def field(obj: dict[str, Any], name: str, kind: type[T], frame_type: FrameType) -> T:
    """obj[name], checked to be of type `kind`; MalformedPayload otherwise."""
    value = obj.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedPayload(f"{frame_type.name} frame lacks a valid {name!r}")
    return value


class Chunk(NamedTuple):
    epoch: int
    stream: str
    data: bytes


def encode_chunk(epoch: int, stream: str, data: bytes | memoryview) -> bytes:
    ref = stream.encode()
    head = _CHUNK_HEAD.pack(epoch, len(ref)) + ref
    size = len(head) + len(data)
    crc = crc32c(data, crc32c(head, crc32c(_PREFIX.pack(size, FrameType.CHUNK))))
    return b"".join((HEADER.pack(size, FrameType.CHUNK, crc), head, data))


def decode_chunk(payload: bytes) -> Chunk:
    if len(payload) < _CHUNK_HEAD.size:
        raise MalformedPayload("CHUNK payload shorter than its head")
    epoch, ref_len = _CHUNK_HEAD.unpack_from(payload)
    start = _CHUNK_HEAD.size + ref_len
    if start > len(payload):
        raise MalformedPayload("CHUNK stream reference runs past the payload")
    try:
        stream = payload[_CHUNK_HEAD.size:start].decode()
    except UnicodeDecodeError:
        raise MalformedPayload("CHUNK stream reference is not UTF-8") from None
    return Chunk(epoch, stream, payload[start:])


_TUNNEL_ID = struct.Struct(">I")
TUNNEL_FROM_OPENER = 0x80000000  # the id's top bit: sent by the side that opened the tunnel


def encode_tunnel(tunnel_id: int, data: bytes | memoryview) -> bytes:
    """A TUNNEL frame: the tunnel's id (its top bit says which side sent it) and its bytes,
    which the link passes on untouched. Empty bytes close the tunnel."""
    head = _TUNNEL_ID.pack(tunnel_id)
    size = len(head) + len(data)
    crc = crc32c(data, crc32c(head, crc32c(_PREFIX.pack(size, FrameType.TUNNEL))))
    return b"".join((HEADER.pack(size, FrameType.TUNNEL, crc), head, data))


def decode_tunnel(payload: bytes) -> tuple[int, bytes]:
    if len(payload) < _TUNNEL_ID.size:
        raise MalformedPayload("TUNNEL payload shorter than its tunnel id")
    return int(_TUNNEL_ID.unpack_from(payload)[0]), payload[_TUNNEL_ID.size:]


class FrameDecoder:
    """Accumulates received bytes and yields whole, CRC-checked frames.

    Its buffer never holds more than one frame's header and payload plus the last bytes fed:
    the length is checked before the payload is waited for.
    """

    __slots__ = ("_buf", "_need", "error", "max_payload")

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._buf = bytearray()
        self._need = HEADER_SIZE  # bytes the buffer must hold before parsing is worth trying
        self.max_payload = max_payload
        self.error: FrameError | None = None

    def __len__(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add received bytes and return every frame now complete. On a framing error the
        frames before it are still returned, `error` holds it, and later input is dropped."""
        if self.error is not None:
            return []
        buf = self._buf
        buf += data
        if len(buf) < self._need:
            return []
        frames: list[Frame] = []
        with memoryview(buf) as view:  # released before the buffer is trimmed
            pos = self._parse(view, frames)
        if self.error is None:
            del buf[:pos]
        return frames

    def _parse(self, view: memoryview, frames: list[Frame]) -> int:
        """Append the whole frames in `view` to `frames`; the position parsing stopped at."""
        pos = 0
        size = len(view)
        while size - pos >= HEADER_SIZE:
            length, frame_type, crc = HEADER.unpack_from(view, pos)
            if length > self.max_payload:
                self._fail(FrameTooLarge(length, self.max_payload))
                return pos
            if frame_type not in KNOWN_TYPES:
                self._fail(UnknownFrameType(frame_type))
                return pos
            end = pos + HEADER_SIZE + length
            if end > size:
                self._need = end - pos
                return pos
            payload = bytes(view[pos + HEADER_SIZE:end])
            actual = frame_crc(frame_type, payload)
            if actual != crc:
                self._fail(BadCrc(frame_type, crc, actual))
                return pos
            frames.append(Frame(FrameType(frame_type), payload))
            pos = end
        self._need = HEADER_SIZE
        return pos

    def _fail(self, error: FrameError) -> None:
        self.error = error
        self._buf = bytearray()
