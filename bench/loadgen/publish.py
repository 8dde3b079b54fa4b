"""The publishing hot path: bursts of pre-encoded messages under a confirm window.

Role: send whole bursts built from a PublishTemplate with one sendall, parse basic.ack and
basic.nack with struct, and keep the window (published - confirmed <= window) full. Confirm
latency is accounted per burst (every message of a burst carries the burst's send time), so
the cost per message is one struct.pack_into. A paced variant sends at a fixed rate.

It must not know scenarios or brokers. Threading contract: one thread, one Connection.
"""

from __future__ import annotations

import select
import time
from collections import deque
from dataclasses import dataclass, field

from loadgen import wire
from loadgen.client import BrokerError, Connection, decode_method


@dataclass
class PublishStats:
    published: int = 0
    confirmed: int = 0
    nacked: int = 0
    started_ns: int = 0
    finished_ns: int = 0
    errors: list[str] = field(default_factory=list)
    # confirm latency as weighted samples: (nanoseconds, how many messages)
    latency_ns: list[int] = field(default_factory=list)
    latency_weight: list[int] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(self.finished_ns - self.started_ns, 1) / 1e9

    @property
    def ok(self) -> bool:
        return not self.errors and self.nacked == 0 and self.confirmed == self.published


class ConfirmTracker:
    """Delivery tags confirmed so far on one channel, with per-burst latency samples."""

    def __init__(self, conn: Connection, stats: PublishStats) -> None:
        self.conn = conn
        self.stats = stats
        self.upto = conn.published  # every tag <= upto is confirmed (acked or nacked)
        self.singles: set[int] = set()  # tags above upto confirmed one by one
        self.bursts: deque[tuple[int, int]] = deque()  # (last tag, send time)
        self.accounted = conn.published

    @property
    def outstanding(self) -> int:
        return self.conn.published - self.upto - len(self.singles)

    def sent(self, count: int, ts_ns: int) -> None:
        self.conn.published += count
        self.stats.published += count
        self.bursts.append((self.conn.published, ts_ns))

    def feed(self, data: bytes) -> None:
        """Parse what arrived: confirms update the window; anything else is an error."""
        buf = self.conn.buf + data if self.conn.buf else data
        pos, n = 0, len(buf)
        unpack_head = wire.FRAME_HEAD.unpack_from
        while n - pos >= 8:
            ftype, _channel, size = unpack_head(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == wire.FRAME_METHOD:
                index = wire.U32.unpack_from(buf, pos + 7)[0]
                if index == wire.BASIC_ACK or index == wire.BASIC_NACK:
                    self.confirm_frame(index, buf, pos)
                else:
                    method = decode_method(bytes(buf[pos + 7 : end]))
                    if method.name in ("Connection.Close", "Channel.Close"):
                        raise BrokerError(f"{method.name}: {method.reply_code} {method.reply_text}")
                    if method.name != "Basic.Return":
                        self.stats.errors.append(f"unexpected {method.name} while publishing")
            pos = end + 1
        self.conn.buf = buf[pos:]
        self.account(time.monotonic_ns())

    def confirm_frame(self, index: int, buf: bytes | bytearray, pos: int) -> None:
        """A basic.ack or basic.nack (method `index`) whose frame starts at buf[pos]; for a
        caller that splits frames itself (several kinds arrive on one connection)."""
        tag, multiple = wire.parse_confirm(pos + 7, buf)
        if index == wire.BASIC_NACK:
            self.stats.nacked += self._count(tag, multiple)
        self._confirm(tag, multiple)

    def _count(self, tag: int, multiple: bool) -> int:
        if not multiple:
            return 1
        return tag - self.upto - sum(1 for t in self.singles if t <= tag)

    def _confirm(self, tag: int, multiple: bool) -> None:
        if multiple:
            if tag > self.upto:
                self.upto = tag
                self.singles = {t for t in self.singles if t > tag}
        elif tag == self.upto + 1:
            self.upto = tag
            while self.upto + 1 in self.singles:
                self.upto += 1
                self.singles.discard(self.upto)
        elif tag > self.upto:
            self.singles.add(tag)

    def account(self, now: int) -> None:
        """Turn the bursts confirmed so far into latency samples (call after feeding)."""
        upto = self.upto
        while self.bursts and self.accounted < upto:
            last, ts = self.bursts[0]
            reach = min(last, upto)
            self.stats.latency_ns.append(now - ts)
            self.stats.latency_weight.append(reach - self.accounted)
            self.accounted = reach
            if reach == last:
                self.bursts.popleft()


def _drain(tracker: ConfirmTracker, conn: Connection, timeout: float) -> None:
    conn.sock.settimeout(timeout)
    try:
        while tracker.outstanding > 0:
            tracker.feed(conn.recv())
    except TimeoutError:
        tracker.stats.errors.append(
            f"{tracker.outstanding} publishes unconfirmed after waiting {timeout:.0f}s"
        )
    finally:
        conn.sock.settimeout(conn.timeout)


def publish_confirmed(
    conn: Connection,
    template: wire.PublishTemplate,
    *,
    first_seq: int = 0,
    count: int | None = None,
    duration_s: float | None = None,
    window: int = 1000,
    max_burst: int = 1000,
    confirm_timeout: float = 60.0,
    stats: PublishStats | None = None,
) -> PublishStats:
    """Publish until `count` messages or `duration_s` seconds, window-limited, then wait for
    every confirm. Sequence numbers run from first_seq. Stats accumulate into `stats`."""
    stats = stats or PublishStats()
    tracker = ConfirmTracker(conn, stats)
    start = time.monotonic_ns()
    if not stats.started_ns:
        stats.started_ns = start
    deadline = start + int(duration_s * 1e9) if duration_s is not None else None
    limit = count if count is not None else 1 << 62
    sent = 0
    send, recv, feed = conn.send, conn.recv, tracker.feed
    burst = template.burst
    confirmed_before = tracker.upto
    try:
        while True:
            now = time.monotonic_ns()
            if sent < limit and (deadline is None or now < deadline):
                room = window - tracker.outstanding
                if room > 0:
                    n = min(room, limit - sent, max_burst)
                    send(burst(first_seq + sent, n, now))
                    sent += n
                    tracker.sent(n, now)
                    if tracker.outstanding < window and sent < limit:
                        continue
                feed(recv())
            else:
                break
        _drain(tracker, conn, confirm_timeout)
    except (OSError, BrokerError) as exc:
        stats.errors.append(f"{type(exc).__name__}: {exc}")
    stats.finished_ns = time.monotonic_ns()
    stats.confirmed += (tracker.upto - confirmed_before) + len(tracker.singles)
    return stats


def publish_paced(
    conn: Connection,
    template: wire.PublishTemplate,
    *,
    rate: float,
    count: int,
    window: int = 1000,
    tick_s: float = 0.001,
    confirm_timeout: float = 60.0,
) -> PublishStats:
    """Publish `count` messages at `rate` messages per second: each tick sends whatever is due
    (every message stamped with its real send time), confirms are read between ticks."""
    stats = PublishStats()
    tracker = ConfirmTracker(conn, stats)
    start = time.monotonic_ns()
    stats.started_ns = start
    confirmed_before = tracker.upto
    sent = 0
    sock = conn.sock
    try:
        while sent < count:
            now = time.monotonic_ns()
            due = min(count, int((now - start) * rate / 1e9) + 1)
            room = window - tracker.outstanding
            n = min(due - sent, room)
            if n > 0:
                conn.send(template.burst(sent, n, now))
                sent += n
                tracker.sent(n, now)
            if tracker.outstanding >= window:
                wait = 1.0  # window full: only a confirm lets the next message go
            else:
                next_due = start + int((sent + 1) * 1e9 / rate)
                wait = max((next_due - time.monotonic_ns()) / 1e9, tick_s)
            readable, _, _ = select.select([sock], [], [], wait)
            if readable:
                tracker.feed(conn.recv())
        _drain(tracker, conn, confirm_timeout)
    except (OSError, BrokerError) as exc:
        stats.errors.append(f"{type(exc).__name__}: {exc}")
    stats.finished_ns = time.monotonic_ns()
    stats.confirmed += (tracker.upto - confirmed_before) + len(tracker.singles)
    return stats
