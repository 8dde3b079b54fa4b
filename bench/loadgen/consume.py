"""The consuming hot path: a minimal frame splitter over basic.deliver, header and body frames.

Role: read deliveries for one consumer, check every message's publisher id and sequence number
(exactly once, in order), ack every `ack_every` deliveries with one pre-encoded multiple ack,
and optionally record publish-to-deliver latency from the send time in each body. Per message
it costs three frame-head unpacks and one body-prefix unpack; nothing is decoded with pamqp
unless it is not a delivery (a cancel or a close, which end the run with an error).

It must not know scenarios or brokers. Threading contract: one thread, one Connection.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen import wire
from loadgen.client import BrokerError, Connection, decode_method

MAX_ERRORS_KEPT = 5


@dataclass
class ConsumeStats:
    received: int = 0  # messages accepted (every one, or only the wanted ones)
    delivered: int = 0  # every delivery, including those a filter let through but not wanted
    bytes: int = 0
    started_ns: int = 0
    finished_ns: int = 0
    errors: list[str] = field(default_factory=list)
    mismatches: int = 0
    latency_ns: array = field(default_factory=lambda: array("q"))
    first_seq: int | None = None  # publisher 0's first sequence number received

    @property
    def seconds(self) -> float:
        return max(self.finished_ns - self.started_ns, 1) / 1e9

    def mismatch(self, text: str) -> None:
        self.mismatches += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(text)


def consume(  # noqa: C901 - one inlined loop per frame: the generator's ceiling depends on it
    conn: Connection,
    expected: int,
    *,
    ack_every: int = 500,
    body_size: int | None = None,
    wanted: Sequence[int] | None = None,
    latency: bool = False,
    idle_timeout: float = 30.0,
    stats: ConsumeStats | None = None,
    first_seq: int | None = 0,
) -> ConsumeStats:
    """Read deliveries until `expected` messages are accepted (a consumer is already started).

    Without `wanted`, every message is accepted and must come as publisher 0's sequence
    numbers 0, 1, 2, ... (several publishers: each one's numbers in order). With `wanted` (a
    sorted list of sequence numbers), only messages of kind KIND_WANTED are accepted, and they
    must be exactly those numbers, in order; the others are acked and counted as delivered.
    A consumer that attached in the middle of a stream expects publisher 0 from first_seq, or
    with first_seq=None from whatever number comes first (RabbitMQ's stream offsets skip one
    number per segment, so offset N need not hold message N); stats.first_seq records it."""
    stats = stats or ConsumeStats()
    stats.started_ns = stats.started_ns or time.monotonic_ns()
    next_seq: dict[int, int] = {0: first_seq} if first_seq else {}
    adopt = first_seq is None
    unpack_head = wire.FRAME_HEAD.unpack_from
    unpack_body = wire.BODY.unpack_from
    u32 = wire.U32.unpack_from
    u64 = wire.U64.unpack_from
    lat_append = stats.latency_ns.append
    send_ack = conn.ack
    received = stats.received
    delivered = stats.delivered
    nbytes = stats.bytes
    since_ack = 0
    tag = 0
    body_left = 0
    first_body = False
    wanted_index = 0
    conn.sock.settimeout(idle_timeout)
    buf = conn.buf
    try:
        fresh = False  # the setup RPCs may have read deliveries already: parse those first
        while received < expected:
            if fresh:
                data = conn.recv()
                buf = buf + data if buf else data
            fresh = True
            now = time.monotonic_ns()
            pos, n = 0, len(buf)
            while n - pos >= 8 and received < expected:
                ftype, _channel, size = unpack_head(buf, pos)
                end = pos + 7 + size
                if end >= n:
                    break
                if (
                    ftype == 1
                    and wanted is None
                    and n - end > 16
                    and u32(buf, pos + 7)[0] == wire.BASIC_DELIVER
                ):
                    # fast path: deliver, header and one body frame, all in the buffer
                    hpos = end + 1
                    htype, _channel, hsize = unpack_head(buf, hpos)
                    bpos = hpos + 8 + hsize
                    if htype == 2 and n - bpos >= 8:
                        btype, _channel, bsize = unpack_head(buf, bpos)
                        bend = bpos + 7 + bsize
                        if (
                            btype == 3
                            and bend < n
                            and u64(buf, hpos + 11)[0] == bsize
                            and buf[end] == buf[bpos - 1] == buf[bend] == 0xCE
                        ):
                            tag = u64(buf, pos + 12 + buf[pos + 11])[0]
                            pid, seq, ts, kind = unpack_body(buf, bpos + 7)
                            if seq != next_seq.get(pid, seq if adopt else 0):
                                stats.mismatch(
                                    f"publisher {pid}: got seq {seq}, expected {next_seq.get(pid)}"
                                )
                            next_seq[pid] = seq + 1
                            if latency:
                                lat_append(now - ts)
                            if body_size is not None and bsize != body_size:
                                stats.mismatch(f"body of {bsize} bytes, expected {body_size}")
                            received += 1
                            delivered += 1
                            nbytes += bsize
                            since_ack += 1
                            if since_ack >= ack_every:
                                send_ack(tag)
                                since_ack = 0
                            pos = bend + 1
                            continue
                if ftype == 3:  # body
                    if first_body:
                        first_body = False
                        pid, seq, ts, kind = unpack_body(buf, pos + 7)
                        if wanted is None:
                            if seq != next_seq.get(pid, seq if adopt else 0):
                                stats.mismatch(
                                    f"publisher {pid}: got seq {seq}, expected {next_seq.get(pid)}"
                                )
                            next_seq[pid] = seq + 1
                            received += 1
                            if latency:
                                lat_append(now - ts)
                        elif kind == wire.KIND_WANTED:
                            if wanted_index >= len(wanted) or seq != wanted[wanted_index]:
                                stats.mismatch(f"wanted message {wanted_index}: got seq {seq}")
                            wanted_index += 1
                            received += 1
                            if latency:
                                lat_append(now - ts)
                    body_left -= size
                    nbytes += size
                    if body_left <= 0:
                        delivered += 1
                        since_ack += 1
                        if since_ack >= ack_every:
                            send_ack(tag)
                            since_ack = 0
                elif ftype == 1:  # method
                    if u32(buf, pos + 7)[0] == wire.BASIC_DELIVER:
                        tag = u64(buf, pos + 12 + buf[pos + 11])[0]
                    else:
                        method = decode_method(bytes(buf[pos + 7 : end]))
                        raise BrokerError(f"{method.name} while consuming: {_why(method)}")
                elif ftype == 2:  # content header
                    body_left = u64(buf, pos + 11)[0]
                    first_body = True
                    if body_size is not None and body_left != body_size:
                        stats.mismatch(f"body of {body_left} bytes, expected {body_size}")
                    if body_left == 0:
                        delivered += 1
                        since_ack += 1
                        stats.mismatch("an empty body")
                if buf[end] != 0xCE:
                    raise BrokerError(f"bad frame end octet after a frame of type {ftype}")
                pos = end + 1
            buf = buf[pos:]
        if since_ack and tag:
            send_ack(tag)
    except TimeoutError:
        stats.errors.append(
            f"stalled: no delivery for {idle_timeout:.0f}s after {received} of {expected} messages"
        )
    except (OSError, BrokerError) as exc:
        stats.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.sock.settimeout(conn.timeout)
    conn.buf = buf
    stats.finished_ns = time.monotonic_ns()
    stats.received = received
    stats.delivered = delivered
    if wanted is None and not stats.mismatches and list(next_seq) == [0]:
        stats.first_seq = next_seq[0] - received  # one publisher, every number consecutive
    stats.bytes = nbytes
    if received != expected and not stats.errors:
        stats.errors.append(f"received {received} of {expected} messages")
    return stats


def _why(method: object) -> str:
    code = getattr(method, "reply_code", None)
    if code is not None:
        return f"{code} {getattr(method, 'reply_text', '')}"
    return str(getattr(method, "consumer_tag", ""))
