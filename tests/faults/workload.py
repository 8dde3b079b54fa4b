"""The stream workload: publishers and consumers on every node, recording what they saw.

Role: drive real AMQP clients (pika) against a replicated stream during a round and hand the
checker a `History`. Per node, one publisher and one consumer, each a pika SelectConnection in
a thread of its own:

- A publisher keeps up to `window` publishes in flight with confirms on, at about `rate`
  messages a second. Every message carries an id (`<publisher>-<channel>-<seq>`) that is sent
  exactly once: a basic.nack makes it `nacked`, a connection lost with it in flight makes it
  `unconfirmed`, and neither is ever sent again. After a lost connection it connects again (a
  new channel number) and goes on with new ids.
- A consumer reads the stream from `first` (x-stream-offset, prefetch, an ack per delivery) and
  records each delivery with its `x-stream-offset`. After a lost connection or a basic.cancel
  it subscribes again at the offset after the last one it got.

`StreamWorkload.stop()` stops sending, waits a bounded time for confirms still in flight, and
closes everything. `decode` turns a stored record back into the id it carries (the checker's
view of the log). The quorum-queue workload (queue_workload.py) reuses the Publisher and
`_Client`, with its own consumer, `decode` and final drain.

Must not know: namespaces, nemeses, how the cluster is started; it gets `{node: (host, port)}`.
Threading: each client runs its own pika ioloop in its own thread and appends to the shared
History under a lock; `start`/`stop` are called from the test's thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import pika
import pika.exceptions
from faults.checker import CONFIRMED, NACKED, Delivery, History, Publish

from leveret.amqp.stored import decode_record

TICK_S = 0.01
RECONNECT_S = 0.5
MAGIC = b"lvf|"
FILLER = b"." * 80  # bodies of about 100 bytes


def body_of(id_: str) -> bytes:
    return MAGIC + id_.encode() + b"|" + FILLER


def id_of(body: bytes) -> str | None:
    """The id a body carries, or None for a body that is not the workload's."""
    if not body.startswith(MAGIC):
        return None
    return body[len(MAGIC):].split(b"|", 1)[0].decode(errors="replace")


def decode(record: bytes) -> str | None:
    """The id of a stream record (a stored AMQP 0.9.1 message, amqp/stored.py)."""
    try:
        return id_of(bytes(decode_record(record).body))
    except (IndexError, ValueError):
        return None


def parameters(host: str, port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host=host, port=port, credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=3, stack_timeout=6,
        blocked_connection_timeout=None)


class _Client(threading.Thread):
    """A pika SelectConnection in a thread, connecting again until stopped."""

    def __init__(self, name: str, node: str, address: tuple[str, int], history: History,
                 lock: threading.Lock, clock: Callable[[], float]) -> None:
        super().__init__(name=f"faults-{name}", daemon=True)
        self.client, self.node, self.address = name, node, address
        self.history, self.lock, self.clock = history, lock, clock
        self.stopping = threading.Event()
        self.channel_no = 0
        self.conn: pika.SelectConnection | None = None
        self.channel: Any = None
        self.close_asked_at: float | None = None

    def note(self, text: str) -> None:
        with self.lock:
            self.history.notes.append(f"{self.clock():.3f} {self.client}@{self.node}: {text}")

    def run(self) -> None:
        while not self.stopping.is_set():
            self.channel_no += 1
            self.channel, self.close_asked_at = None, None
            try:
                self.conn = pika.SelectConnection(
                    parameters(*self.address), on_open_callback=self._opened,
                    on_open_error_callback=self._open_failed, on_close_callback=self._closed)
                self.conn.ioloop.call_later(TICK_S, self._tick)
                self.conn.ioloop.start()
            except (pika.exceptions.AMQPError, OSError) as exc:
                self.note(f"connection error {exc!r}")
            self.connection_ended()
            self.stopping.wait(RECONNECT_S)

    def _opened(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._channel_opened)

    def _open_failed(self, conn: Any, error: BaseException) -> None:
        self.note(f"cannot connect: {error!r}")
        conn.ioloop.stop()

    def _closed(self, conn: Any, reason: BaseException) -> None:
        if not self.stopping.is_set():
            self.note(f"connection closed: {reason!r}")
        conn.ioloop.stop()

    def _channel_opened(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._channel_closed)
        self.channel_ready(channel)

    def _channel_closed(self, _channel: Any, reason: BaseException) -> None:
        self.channel = None
        if not self.stopping.is_set():
            self.note(f"channel closed: {reason!r}")
        self.close()

    def close(self) -> None:
        conn = self.conn
        if conn is None:
            return
        if self.close_asked_at is None:
            self.close_asked_at = self.clock()
        if conn.is_open:
            conn.close()
        elif not conn.is_closing:
            conn.ioloop.stop()  # still connecting: give up on it

    def _tick(self) -> None:
        conn = self.conn
        if conn is None:
            return
        if self.close_asked_at is not None and self.clock() - self.close_asked_at > 5:
            self.note("no close-ok within 5 s: dropping the connection")
            conn.ioloop.stop()
            return
        if self.stopping.is_set():
            if self.may_close():
                self.close()
        elif self.channel is not None:
            self.work()
        conn.ioloop.call_later(TICK_S, self._tick)

    # what a kind of client does
    def channel_ready(self, channel: Any) -> None: ...
    def work(self) -> None: ...
    def may_close(self) -> bool:
        return True
    def connection_ended(self) -> None: ...


class Publisher(_Client):
    def __init__(self, *args: Any, queue: str, rate: float, window: int, drain_s: float,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue, self.rate, self.window, self.drain_s = queue, rate, window, drain_s
        self.seq = 0
        self.inflight: dict[int, Publish] = {}
        self.tag = 0
        self.ready = False
        self.tokens, self.last = 0.0, 0.0
        self.stop_at: float | None = None

    def channel_ready(self, channel: Any) -> None:
        channel.confirm_delivery(ack_nack_callback=self._confirmed, callback=self._selected)

    def _selected(self, _frame: Any) -> None:
        self.ready, self.tag, self.tokens, self.last = True, 0, 1.0, self.clock()

    def work(self) -> None:
        if not self.ready:
            return
        now = self.clock()
        self.tokens = min(float(self.window), self.tokens + self.rate * (now - self.last))
        self.last = now
        while self.tokens >= 1 and len(self.inflight) < self.window:
            self.tokens -= 1
            self._send()

    def _send(self) -> None:
        self.seq += 1
        id_ = f"{self.client}-{self.channel_no}-{self.seq}"
        publish = Publish(id_, self.client, self.seq, self.channel_no, self.node, self.clock())
        with self.lock:
            self.history.publishes.append(publish)
        self.tag += 1
        self.inflight[self.tag] = publish
        try:
            self.channel.basic_publish("", self.queue, body_of(id_),
                                       pika.BasicProperties(delivery_mode=2))
        except (pika.exceptions.AMQPError, AttributeError) as exc:
            self.note(f"publish failed: {exc!r}")
            self.close()

    def _confirmed(self, frame: Any) -> None:
        method = frame.method
        outcome = CONFIRMED if isinstance(method, pika.spec.Basic.Ack) else NACKED
        tags = ([t for t in self.inflight if t <= method.delivery_tag] if method.multiple
                else [method.delivery_tag])
        now = self.clock()
        for tag in tags:
            publish = self.inflight.pop(tag, None)
            if publish is None:
                self.note(f"{outcome} for unknown delivery tag {tag}")
                continue
            publish.outcome, publish.settled_at = outcome, now

    def may_close(self) -> bool:
        if self.stop_at is None:
            self.stop_at = self.clock()
        return not self.inflight or self.clock() - self.stop_at > self.drain_s

    def connection_ended(self) -> None:
        self.inflight.clear()  # their outcome stays `unconfirmed`: never sent again
        self.ready = False


class Consumer(_Client):
    def __init__(self, *args: Any, queue: str, prefetch: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue, self.prefetch = queue, prefetch
        self.next_offset: int | None = None

    def channel_ready(self, channel: Any) -> None:
        channel.add_on_cancel_callback(self._cancelled)
        channel.basic_qos(prefetch_count=self.prefetch, callback=self._qos_ok)

    def _qos_ok(self, _frame: Any) -> None:
        start: Any = "first" if self.next_offset is None else self.next_offset
        self.channel.basic_consume(self.queue, self._delivered,
                                   arguments={"x-stream-offset": start})

    def _cancelled(self, _frame: Any) -> None:
        self.note("consumer cancelled by the broker")
        self.close()

    def _delivered(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        offset = int((properties.headers or {}).get("x-stream-offset", -1))
        with self.lock:
            self.history.deliveries.append(
                Delivery(self.client, self.node, offset, id_of(body), self.clock()))
        if offset >= 0:
            self.next_offset = offset + 1
        channel.basic_ack(method.delivery_tag)


class Workload(Protocol):
    """What a round needs of a workload: a queue kind whose members each keep a log under the
    queue's storage folder (a replicated stream; quorum queues have queue_rounds.py's own)."""

    kind: str

    def declare(self, via: str) -> None: ...
    def start(self) -> None: ...
    def stop(self, timeout: float = 20.0) -> History: ...
    def delete(self, via: str) -> None: ...
    def decode(self, record: bytes) -> str | None: ...


class StreamWorkload:
    """A replicated stream with a publisher and a consumer on every node."""

    kind = "stream"
    decode = staticmethod(decode)

    def __init__(self, endpoints: dict[str, tuple[str, int]], queue: str, *,
                 rate: float = 150.0, window: int = 20, prefetch: int = 100,
                 drain_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints, self.queue = endpoints, queue
        self.history = History()
        self.lock = threading.Lock()
        self.clock = clock
        common = {"history": self.history, "lock": self.lock, "clock": clock}
        self.clients: list[_Client] = []
        for node, address in sorted(endpoints.items()):
            self.clients.append(Publisher(f"p{node}", node, address, queue=queue, rate=rate,
                                          window=window, drain_s=drain_s, **common))
            self.clients.append(Consumer(f"c{node}", node, address, queue=queue,
                                         prefetch=prefetch, **common))

    def declare(self, via: str) -> None:
        """Declare the stream once, through node `via` (its leader, client-local)."""
        conn = pika.BlockingConnection(parameters(*self.endpoints[via]))
        try:
            conn.channel().queue_declare(self.queue, durable=True, arguments={
                "x-queue-type": "stream", "x-initial-cluster-size": len(self.endpoints)})
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    def delete(self, via: str) -> None:
        conn = pika.BlockingConnection(parameters(*self.endpoints[via]))
        try:
            conn.channel().queue_delete(self.queue)
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    def start(self) -> None:
        for client in self.clients:
            client.start()

    def confirms(self) -> list[Publish]:
        with self.lock:
            return [p for p in self.history.publishes if p.outcome == CONFIRMED]

    def stop(self, timeout: float = 20.0) -> History:
        """Stop sending, give confirms in flight a bounded time, close; the History."""
        for client in self.clients:
            client.stopping.set()
        deadline = time.monotonic() + timeout
        for client in self.clients:
            client.join(max(0.1, deadline - time.monotonic()))
            if client.is_alive():
                self.history.notes.append(f"{client.client} did not stop in {timeout} s")
        return self.history
