"""A blocking raw stream-protocol client for the benchmark: setup commands and two hot loops.

Role: open a connection (PeerProperties, SASL PLAIN, Tune with heartbeats off, Open), create
and delete streams, and run the two measured loops: a publisher that sends Publish frames of
`batch` messages while at most `window` messages wait for their PublishConfirm (as the stream
clients keep a window of unconfirmed messages), and a subscriber that starts with an initial
credit and gives one credit back per chunk it has handled (as rstream, the Java and Go clients
do). Frames are built and split with Leveret's own codec (leveret.broker.streamproto.frames),
the message with its AMQP 1.0 type encoder; only the per-batch stamping of publishing ids and
sequence numbers is done here, with numpy when it is installed.

Messages are one AMQP 1.0 data section whose body follows bench/loadgen/wire.py's layout
(publisher id u32, sequence number u64, send time u64, kind u8, filler), so AMQP 0.9.1
consumers of the same stream check them with bench/loadgen/consume.py.

It must not know scenarios or start brokers; it knows nothing of Leveret but the codec it
imports, so it measures RabbitMQ's stream plugin the same way. Threading contract: one thread
per StreamConnection.
"""

from __future__ import annotations

import socket
import struct
import time
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Any

from leveret.broker.streamproto import amqp10
from leveret.broker.streamproto import amqp10types as t
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f

try:
    import numpy as np
except ImportError:  # the per-message fallback is slower, not different
    np = None

BODY = struct.Struct(">IQQB")  # bench/loadgen/wire.py's body prefix
_KEY = struct.Struct(">HH")
_CHUNK = struct.Struct(">BBHIqQQIIIB3x")  # the osiris chunk header of a Deliver
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CONFIRM_HEAD = struct.Struct(">BI")  # after key and version: publisher id, id count
# Deliver v1: size u32, key u16, version u16, subscription id u8, then the chunk header
_DELIVER_CHUNK_AT = 4 + 4 + 1


class StreamError(Exception):
    """The broker answered with an error code, closed the connection, or went away."""


def message(body_size: int, seq: int = 0, publisher: int = 0) -> bytes:
    """An AMQP 1.0 message of one data section holding a benchmark body of body_size bytes."""
    if body_size < BODY.size:
        raise ValueError(f"bodies need at least {BODY.size} bytes, got {body_size}")
    body = BODY.pack(publisher, seq, 0, 0) + b"x" * (body_size - BODY.size)
    return b"\x00\x53" + bytes((amqp10.DATA,)) + t.encode(("binary", body))


def body_of(msg: bytes) -> bytes:
    """The data section's bytes of an AMQP 1.0 message (stream- or 0.9.1-published)."""
    _, body = amqp10.sections(msg)
    if not body or body[0][0] != amqp10.DATA:
        raise StreamError("a delivered message has no data section")
    return bytes(body[0][1][1])


class StreamConnection:
    """A TCP connection to a stream port, opened on a vhost."""

    def __init__(self, host: str, port: int, user: str = "guest", password: str = "guest",
                 vhost: str = "/", timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.frames = f.FrameBuffer(0)
        self.pending: list[bytes] = []  # frames read and not yet handled
        self.corr = 0
        self.server_properties: dict[str, str] = {}
        self._handshake(user, password, vhost)

    # -- frames in and out ------------------------------------------------------------------

    def recv(self) -> list[bytes]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise StreamError("the broker closed the TCP connection")
        return self.frames.feed(data)

    def next_frame(self) -> bytes:
        while not self.pending:
            self.pending = self.recv()
        return self.pending.pop(0)

    def send(self, data: bytes | bytearray) -> None:
        self.sock.sendall(data)

    def request(self, key: int, body: bytes) -> int:
        self.corr += 1
        self.send(f.request(key, self.corr, body))
        return self.corr

    def response(self, key: int, corr: int) -> f.Decoder:
        """The response to request `corr`, its code checked; a Decoder after the code."""
        while True:
            frame = self.next_frame()
            got, _version = _KEY.unpack_from(frame, 0)
            if got == k.CLOSE:
                d = f.Decoder(frame, 4)
                close_corr, code, reason = d.u32(), d.u16(), d.string()
                self.send(f.response(k.CLOSE, close_corr, k.OK))
                raise StreamError(f"the broker closed the connection: {code} {reason}")
            if got == key | k.RESPONSE:
                d = f.Decoder(frame, 4)
                if d.u32() == corr:
                    code = d.u16()
                    if code != k.OK:
                        raise StreamError(f"command {key:#x} answered code {code:#x}")
                    return d

    def call(self, key: int, body: bytes) -> f.Decoder:
        return self.response(key, self.request(key, body))

    def _handshake(self, user: str, password: str, vhost: str) -> None:
        d = self.call(k.PEER_PROPERTIES, f.enc_map({"product": "leveret-bench"}))
        self.server_properties = d.map()
        self.call(k.SASL_HANDSHAKE, b"")
        self.call(k.SASL_AUTHENTICATE, f.enc_string("PLAIN")
                  + f.enc_bytes(f"\0{user}\0{password}".encode()))
        while True:
            frame = self.next_frame()
            if _KEY.unpack_from(frame, 0)[0] == k.TUNE:
                frame_max = _U32.unpack_from(frame, 4)[0]
                break
        self.frame_max = frame_max
        self.send(f.frame(k.TUNE, 1, f.u32(frame_max) + f.u32(0)))  # heartbeats off
        self.call(k.OPEN, f.enc_string(vhost))

    # -- setup commands ---------------------------------------------------------------------

    def create(self, stream: str, arguments: dict[str, str] | None = None) -> None:
        self.call(k.CREATE, f.enc_string(stream) + f.enc_map(arguments or {}))

    def delete(self, stream: str) -> None:
        self.call(k.DELETE, f.enc_string(stream))

    def declare_publisher(self, pid: int, stream: str, reference: str = "") -> None:
        self.call(k.DECLARE_PUBLISHER, f.u8(pid) + f.enc_string(reference)
                  + f.enc_string(stream))

    def subscribe(self, sid: int, stream: str, credit: int, offset: int | None = None) -> None:
        """Subscribe from `first`, or from `offset`."""
        spec = f.u16(k.OFFSET_FIRST) if offset is None else f.u16(k.OFFSET_OFFSET) + f.u64(offset)
        self.call(k.SUBSCRIBE, f.u8(sid) + f.enc_string(stream) + spec + f.u16(credit)
                  + f.enc_map({}))

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.sock.settimeout(timeout)
            corr = self.request(k.CLOSE, f.u16(k.OK) + f.enc_string("bye"))
            self.response(k.CLOSE, corr)
        except (OSError, StreamError, f.FrameError):
            pass
        finally:
            self.sock.close()


# -- publishing ---------------------------------------------------------------------------------


class PublishBatch:
    """One Publish frame of `count` messages with blank publishing ids and sequence numbers;
    stamp() numbers them from a first id (publishing id = sequence number = message number)."""

    def __init__(self, pid: int, count: int, body_size: int) -> None:
        msg = message(body_size)
        entry = f.u64(0) + f.u32(len(msg)) + msg
        self.data = bytearray(f.frame(k.PUBLISH, 1, f.u8(pid) + f.i32(count) + entry * count))
        self.count = count
        head = 4 + 4 + 1 + 4
        self.id_at = [head + i * len(entry) for i in range(count)]
        body_at = len(entry) - body_size  # where the body starts inside an entry
        self.seq_at = [at + body_at + 4 for at in self.id_at]
        self._arrays: Any = None
        if np is not None:
            stride = len(entry)
            ids = np.ndarray((count,), dtype=">u8", buffer=self.data, offset=head,
                             strides=(stride,))
            seqs = np.ndarray((count,), dtype=">u8", buffer=self.data, offset=self.seq_at[0],
                              strides=(stride,))
            self._arrays = (ids, seqs, np.arange(count, dtype=np.uint64))

    def stamp(self, first: int) -> bytearray:
        if self._arrays is not None:
            ids, seqs, steps = self._arrays
            values = steps + np.uint64(first)
            ids[:] = values
            seqs[:] = values
        else:
            pack = _U64.pack_into
            for i, (id_at, seq_at) in enumerate(zip(self.id_at, self.seq_at, strict=True)):
                pack(self.data, id_at, first + i)
                pack(self.data, seq_at, first + i)
        return self.data


@dataclass
class PublishStats:
    published: int = 0
    confirmed: int = 0
    errors: list[str] = field(default_factory=list)
    started_ns: int = 0
    finished_ns: int = 0
    latency_ns: array = field(default_factory=lambda: array("q"))  # per confirmed batch part
    latency_weight: array = field(default_factory=lambda: array("q"))

    @property
    def seconds(self) -> float:
        return max(self.finished_ns - self.started_ns, 1) / 1e9

    @property
    def ok(self) -> bool:
        return not self.errors and self.confirmed == self.published


def publish(  # noqa: C901 - one inlined loop: the generator's ceiling depends on it
        conn: StreamConnection, pid: int, *, body_size: int, batch: int, window: int,
            count: int | None = None, duration_s: float | None = None,
            idle_timeout: float = 30.0, first_id: int = 0) -> PublishStats:
    """Publish `count` messages (or for duration_s seconds) in frames of `batch`, keeping at
    most `window` unconfirmed; then wait for every confirm. Latency: each batch's send time
    to the confirm of each of its messages."""
    stats = PublishStats()
    template = PublishBatch(pid, batch, body_size)
    sent_ns = array("q")  # send time of batch i (ids first_id + i * batch ...)
    sock = conn.sock
    sock.settimeout(idle_timeout)
    feed = conn.frames.feed
    confirm_key = k.PUBLISH_CONFIRM
    stats.started_ns = time.monotonic_ns()
    deadline = stats.started_ns + int((duration_s or 0) * 1e9)
    limit = count if count is not None else 1 << 62
    next_id = first_id
    lat, weight = stats.latency_ns, stats.latency_weight
    try:
        while True:
            now = time.monotonic_ns()
            done_sending = next_id - first_id >= limit or (duration_s is not None
                                                            and now >= deadline)
            if done_sending and stats.confirmed >= stats.published:
                break
            burst = []
            while (not done_sending and stats.published - stats.confirmed + batch <= window
                   and next_id - first_id < limit):
                n = min(batch, limit - (next_id - first_id))
                if n != batch:
                    template = PublishBatch(pid, n, body_size)
                burst.append(bytes(template.stamp(next_id)))
                sent_ns.append(now)
                next_id += n
                stats.published += n
                if len(burst) >= 8:
                    break
            if burst:
                sock.sendall(b"".join(burst))
                continue
            data = sock.recv(1 << 20)
            if not data:
                raise StreamError("the broker closed the TCP connection")
            now = time.monotonic_ns()
            for frame in feed(data):
                key = _KEY.unpack_from(frame, 0)[0]
                if key == confirm_key:
                    _pid, n = _CONFIRM_HEAD.unpack_from(frame, 4)
                    stats.confirmed += n
                    ids = struct.unpack_from(f">{n}Q", frame, 9)
                    first_batch = (ids[0] - first_id) // batch
                    if (ids[-1] - first_id) // batch == first_batch:
                        lat.append(now - sent_ns[first_batch])
                        weight.append(n)
                    else:
                        for i in ids:
                            lat.append(now - sent_ns[(i - first_id) // batch])
                            weight.append(1)
                elif key == k.PUBLISH_ERROR:
                    _pid, n = _CONFIRM_HEAD.unpack_from(frame, 4)
                    code = struct.unpack_from(">H", frame, 9 + 8)[0]
                    stats.errors.append(f"PublishError for {n} messages, code {code:#x}")
                    stats.published -= n
                elif key == k.CLOSE:
                    raise StreamError("the broker closed the connection while publishing")
                # heartbeats and metadata updates are not expected; anything else is dropped
    except TimeoutError:
        stats.errors.append(f"stalled: no confirm for {idle_timeout:.0f}s, "
                            f"{stats.confirmed} of {stats.published} confirmed")
    except (OSError, StreamError) as exc:
        stats.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        sock.settimeout(conn.timeout)
        stats.finished_ns = time.monotonic_ns()
    if stats.confirmed != stats.published and not stats.errors:
        stats.errors.append(f"{stats.confirmed} confirms for {stats.published} messages")
    return stats


# -- consuming ----------------------------------------------------------------------------------


@dataclass
class ConsumeStats:
    received: int = 0
    chunks: int = 0
    bytes: int = 0
    started_ns: int = 0
    finished_ns: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(self.finished_ns - self.started_ns, 1) / 1e9

    def error(self, text: str) -> None:
        if len(self.errors) < 5:
            self.errors.append(text)


def consume(  # noqa: C901 - one inlined loop: the generator's ceiling depends on it
        conn: StreamConnection, sid: int, expected: int, *, initial_credit: int,
            check_crc: bool = True, idle_timeout: float = 30.0,
            stats: ConsumeStats | None = None) -> ConsumeStats:
    """Read Deliver frames of a subscription (already subscribed with initial_credit) until
    `expected` messages have arrived, giving one credit back per chunk, sent once the chunks
    of one read are handled. Each chunk is checked as the clients check it (CRC-32 of its
    data), its first offset must follow the previous chunk's last, and its first message's
    sequence number must be the count of messages before it (exactly once, in order)."""
    stats = stats or ConsumeStats()
    stats.started_ns = stats.started_ns or time.monotonic_ns()
    sock = conn.sock
    sock.settimeout(idle_timeout)
    feed = conn.frames.feed
    credit_frame = f.frame(k.CREDIT, 1, f.u8(sid) + f.u16(1))
    unpack_chunk = _CHUNK.unpack_from
    unpack_key = _KEY.unpack_from
    crc32 = zlib.crc32
    received = 0
    chunks = 0
    nbytes = 0
    next_offset: int | None = None
    frames = conn.pending
    conn.pending = []
    try:
        while received < expected:
            if not frames:
                data = sock.recv(1 << 20)
                if not data:
                    raise StreamError("the broker closed the TCP connection")
                frames = feed(data)
            credits = 0
            for frame in frames:
                key = unpack_key(frame, 0)[0]
                if key != k.DELIVER:
                    if key == k.CLOSE:
                        raise StreamError("the broker closed the connection while delivering")
                    if key == k.METADATA_UPDATE:
                        raise StreamError("the stream went away (MetadataUpdate)")
                    continue
                (_magic, _type, _entries, records, _ts, _epoch, first, crc, size, _trailer,
                 _bloom) = unpack_chunk(frame, 5)
                data_at = 5 + _CHUNK.size
                if check_crc and crc32(memoryview(frame)[data_at : data_at + size]) != crc:
                    stats.error(f"chunk at offset {first}: CRC mismatch")
                if next_offset is not None and first != next_offset:
                    stats.error(f"chunk at offset {first}, expected {next_offset}")
                next_offset = first + records
                msg_size = _U32.unpack_from(frame, data_at)[0]
                if msg_size & 0x80000000:
                    stats.error("a sub-entry batch (none was published)")
                else:
                    body = body_of(frame[data_at + 4 : data_at + 4 + msg_size])
                    seq = BODY.unpack_from(body, 0)[1]
                    if seq != received:
                        stats.error(f"chunk at offset {first}: message {seq}, "
                                    f"expected {received}")
                received += records
                chunks += 1
                credits += 1
                nbytes += size
            frames = []
            if credits and received < expected:
                sock.sendall(credit_frame * credits)
    except TimeoutError:
        stats.error(f"stalled: no chunk for {idle_timeout:.0f}s after {received} of "
                    f"{expected} messages")
    except (OSError, StreamError, struct.error) as exc:
        stats.error(f"{type(exc).__name__}: {exc}")
    finally:
        sock.settimeout(conn.timeout)
    stats.finished_ns = time.monotonic_ns()
    stats.received = received
    stats.chunks = chunks
    stats.bytes = nbytes
    if received < expected and not stats.errors:
        stats.errors.append(f"received {received} of {expected} messages")
    return stats
