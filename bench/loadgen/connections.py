"""Scenario (j): many connections, each publishing with confirms into its own classic queue and
consuming from it, multiplexed over a few load processes with `selectors`.

Role: each load process opens its share of the connections with the blocking client (handshake,
confirm.select, qos, a non-durable exclusive queue, basic.consume), turns their sockets
non-blocking, meets the others at the barrier, then runs one selector loop: whatever a socket
brings is split into frames (confirms go to publish.py's ConfirmTracker, deliveries are checked
here: this connection's publisher id, sequence numbers 0, 1, 2, ... once and in order), and the
connection answers with one send: a multiple ack for the deliveries just read and a burst that
tops its window up again. A connection has at most `conn_window` messages in flight (published
and not yet both confirmed and delivered). After `duration` seconds nobody publishes; the loop
ends when every connection has every confirm and every delivery (or the idle timeout passed).
The parent reads broker CPU and RSS at the end of the publishing window, while every connection
is still open.

Why non-durable queues and transient messages: RabbitMQ 3.10 confirms a transient message in a
classic queue once the queue process holds it, without touching the disk, so this measures
what the scenario is about (a thousand connections, channels, queues and consumers at once) on
both brokers alike; durable queues and persistent messages are scenario (e)'s subject, where
both fsync before confirming. Exclusive, so a connection's close deletes its queue.

It must not know any broker. Threading contract: main thread; it forks workers (workers.py),
and each worker runs its selector loop on its own main thread.
"""

from __future__ import annotations

import selectors
import time
from array import array

from loadgen import wire, workers
from loadgen.client import BrokerError, Connection, decode_method
from loadgen.common import Options, errors_of, mb, result, span, template_for
from loadgen.measure import BrokerProbe, SelfCpu, percentiles, weighted_percentiles
from loadgen.publish import ConfirmTracker, PublishStats

READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
MAX_ERRORS_KEPT = 5


class Link:
    """One connection of the loop: its publisher (window, confirms) and its consumer (checks)."""

    def __init__(self, conn: Connection, template: wire.PublishTemplate, pid: int) -> None:
        self.conn = conn
        self.sock = conn.sock
        self.pid = pid
        self.template = template
        self.stats = PublishStats()
        self.tracker = ConfirmTracker(conn, self.stats)
        self.next_seq = 0
        self.received = 0
        self.first_body = False
        self.tag = 0  # the last delivery tag read
        self.acked = 0  # the last delivery tag acked
        self.out = b""  # bytes the socket has not taken yet
        self.events = READ

    @property
    def done(self) -> bool:
        return self.tracker.outstanding == 0 and self.received == self.stats.published

    def mismatch(self, text: str) -> None:
        if len(self.stats.errors) < MAX_ERRORS_KEPT:
            self.stats.errors.append(f"connection {self.pid}: {text}")

    def feed(self, data: bytes, now: int, latency: array, body_size: int) -> None:
        """Split what arrived into frames: confirms, deliveries (checked, timed), or an error."""
        conn = self.conn
        buf = conn.buf + data if conn.buf else data
        pos, n = 0, len(buf)
        unpack_head = wire.FRAME_HEAD.unpack_from
        while n - pos >= 8:
            ftype, _channel, size = unpack_head(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != wire.FRAME_END:
                raise BrokerError(f"bad frame end octet after a frame of type {ftype}")
            if ftype == wire.FRAME_METHOD:
                index = wire.U32.unpack_from(buf, pos + 7)[0]
                if index == wire.BASIC_DELIVER:
                    self.tag = wire.deliver_tag(pos + 7, buf)
                elif index == wire.BASIC_ACK or index == wire.BASIC_NACK:
                    self.tracker.confirm_frame(index, buf, pos)
                else:
                    method = decode_method(bytes(buf[pos + 7 : end]))
                    code = getattr(method, "reply_code", "")
                    text = getattr(method, "reply_text", "")
                    raise BrokerError(f"connection {self.pid}: {method.name} {code} {text}")
            elif ftype == wire.FRAME_HEADER:
                self.first_body = True
                size_announced = wire.U64.unpack_from(buf, pos + 11)[0]
                if size_announced != body_size:
                    self.mismatch(f"body of {size_announced} bytes, expected {body_size}")
            elif ftype == wire.FRAME_BODY and self.first_body:
                self.first_body = False
                pid, seq, ts, _kind = wire.BODY.unpack_from(buf, pos + 7)
                if pid != self.pid or seq != self.next_seq:
                    self.mismatch(
                        f"got publisher {pid} seq {seq}, expected {self.pid} seq {self.next_seq}"
                    )
                self.next_seq = seq + 1
                self.received += 1
                latency.append(now - ts)
            pos = end + 1
        conn.buf = buf[pos:]
        self.tracker.account(now)

    def pump(self, now: int, window: int, publishing: bool) -> None:
        """Queue an ack for what was delivered and, while publishing, a burst that fills the
        window (in flight: max(unconfirmed, published and not delivered))."""
        out = self.out
        if self.tag > self.acked:
            out += wire.ack_frame(self.conn.channel, self.tag, True)
            self.acked = self.tag
        if publishing and not self.out:
            in_flight = max(self.tracker.outstanding, self.stats.published - self.received)
            room = window - in_flight
            if room > 0:
                out += self.template.burst(self.stats.published, room, now)
                self.tracker.sent(room, now)
        self.out = out

    def flush(self, sel: selectors.BaseSelector) -> None:
        """Send what the socket takes now; wait for it to be writable if something is left."""
        if self.out:
            try:
                sent = self.sock.send(self.out)
            except BlockingIOError:
                sent = 0
            self.out = self.out[sent:]
        events = READ | WRITE if self.out else READ
        if events != self.events:
            sel.modify(self.sock, events, self)
            self.events = events


def _open(opts: Options, prefix: str, ids: list[int]) -> list[Link]:
    links = []
    try:
        for i in ids:
            conn = opts.connect()
            conn.confirm_select()
            conn.qos(opts.prefetch)
            queue = f"{prefix}.{i}"
            conn.declare_queue(queue, durable=False, exclusive=True)
            conn.consume(queue)
            links.append(Link(conn, template_for(opts, conn, queue, i), i))
    except (OSError, BrokerError) as exc:
        for link in links:
            link.sock.close()
        raise RuntimeError(
            f"opened {len(links)} of {len(ids)} connections: {type(exc).__name__}: {exc}"
        ) from None
    return links


def _loop(
    opts: Options, links: list[Link], sel: selectors.BaseSelector, latency: array
) -> list[str]:
    """Publish for opts.duration seconds, then drain; the errors of the loop itself."""
    window, body = opts.conn_window, opts.body
    start = time.monotonic_ns()
    deadline = start + int(opts.duration * 1e9)
    idle_ns = int(opts.idle_timeout * 1e9)
    for link in links:
        link.pump(start, window, True)
        link.flush(sel)
    publishing = True
    last_read = start
    while True:
        now = time.monotonic_ns()
        if publishing and now >= deadline:
            publishing = False
        if not publishing and all(link.done for link in links):
            return []
        if now - last_read > idle_ns:
            waiting = sum(1 for link in links if not link.done)
            return [
                f"stalled: nothing arrived for {opts.idle_timeout:.0f}s, "
                f"{waiting} of {len(links)} connections still waiting"
            ]
        timeout = 0.1 if not publishing else max(min((deadline - now) / 1e9, 0.1), 0)
        events = sel.select(timeout)
        now = time.monotonic_ns()
        for key, mask in events:
            link = key.data
            if mask & READ:
                try:
                    data = link.sock.recv(1 << 16)
                except BlockingIOError:
                    data = None
                if data == b"":
                    raise BrokerError(
                        f"connection {link.pid}: the broker closed the TCP connection"
                    )
                if data:
                    last_read = now
                    link.feed(data, now, latency, body)
            link.pump(now, window, publishing)
            link.flush(sel)


def _worker(opts: Options, prefix: str, ids: list[int], ready: workers.Ready) -> dict:
    t0 = time.monotonic()
    links = _open(opts, prefix, ids)
    open_s = time.monotonic() - t0
    sel = selectors.DefaultSelector()
    for link in links:
        link.sock.setblocking(False)
        sel.register(link.sock, READ, link)
    latency = array("q")
    ready()
    cpu = SelfCpu()
    cpu.start()
    started = time.monotonic_ns()
    try:
        errors = _loop(opts, links, sel, latency)
    except (OSError, BrokerError) as exc:
        errors = [f"{type(exc).__name__}: {exc}"]
    finished = time.monotonic_ns()
    loadgen_cpu = cpu.pct()
    sel.close()
    for link in links:
        link.sock.setblocking(True)
        link.conn.close(timeout=2)
    published = sum(link.stats.published for link in links)
    confirmed = sum(link.tracker.upto + len(link.tracker.singles) for link in links)
    nacked = sum(link.stats.nacked for link in links)
    received = sum(link.received for link in links)
    errors += [e for link in links for e in link.stats.errors][:MAX_ERRORS_KEPT]
    if not errors and (confirmed != published or nacked or received != published):
        errors.append(
            f"{confirmed} confirms ({nacked} nacks) and {received} deliveries "
            f"for {published} publishes"
        )
    return {
        "published": published,
        "confirmed": confirmed,
        "received": received,
        "started_ns": started,
        "finished_ns": finished,
        "errors": errors,
        "lat": latency.tobytes(),
        "conf_lat": [v for link in links for v in link.stats.latency_ns],
        "conf_w": [v for link in links for v in link.stats.latency_weight],
        "cpu": loadgen_cpu,
        "open_s": open_s,
        "connections": len(links),
    }


def scenario_j(opts: Options, probe: BrokerProbe) -> list[dict]:
    n = opts.connections
    if n < 1 or opts.conn_window < 1:
        raise ValueError("scenario j needs at least one connection and a window of at least 1")
    procs = max(1, min(opts.mux_processes, n))
    prefix = opts.queue_name("j")
    shares = [list(range(k, n, procs)) for k in range(procs)]
    rss0 = probe.rss_kb()
    seen: dict[str, float | int | None] = {}

    def on_start() -> None:
        seen["rss_open"] = probe.rss_kb()
        probe.start()

    def parent() -> None:
        time.sleep(opts.duration)  # broker CPU and RSS over the publishing window only
        seen.update(cpu=probe.cpu_pct(), machine=probe.machine_pct(), rss=probe.rss_kb())

    def worker(ids: list[int], ready: workers.Ready) -> dict:
        return _worker(opts, prefix, ids, ready)

    # forked even when procs == 1: the parent measures while the worker runs
    res, _ = workers.run(worker, shares, on_start, parent=parent)
    latency = array("q")
    for r in res:
        latency.frombytes(r.get("lat", b""))
    p50, p99, p999 = percentiles(latency, (50, 99, 99.9))
    c50, c99 = weighted_percentiles(
        [v for r in res for v in r.get("conf_lat", [])],
        [v for r in res for v in r.get("conf_w", [])],
        (50, 99),
    )
    rss_open = seen.get("rss_open")
    opened = sum(r.get("connections", 0) for r in res)
    return [
        result(
            opts,
            "j",
            messages=sum(r.get("received", 0) for r in res),
            seconds=span(res),
            errors=errors_of(res),
            cpu=seen.get("cpu"),
            machine=seen.get("machine"),
            loadgen_cpu=sum(r.get("cpu", 0) for r in res),
            p50=p50,
            p99=p99,
            p999_ms=p999,
            latency="publish-to-deliver",
            confirm_p50_ms=c50,
            confirm_p99_ms=c99,
            connections=opened,
            window=opts.conn_window,
            load_processes=procs,
            published=sum(r.get("published", 0) for r in res),
            confirmed=sum(r.get("confirmed", 0) for r in res),
            open_s=round(max((r.get("open_s", 0) for r in res), default=0), 2),
            broker_rss_mb_before=mb(rss0),
            broker_rss_mb=mb(seen.get("rss")),  # type: ignore[arg-type]
            kb_per_connection=(
                round((rss_open - rss0) / opened, 1) if rss0 and rss_open and opened else None
            ),
        )
    ]
