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

`Workload` is what both kinds of queue share: declare once through a node, start the clients,
`stop()` (stop sending, wait a bounded time for confirms still in flight, close everything),
delete. `decode` turns a stored record back into the id it carries (the checker's view of the
log). The quorum-queue workload (queue_workload.py) is a `Workload` too, with the Publisher,
its own consumer (a `_Subscriber`), `decode` and final drain.

Must not know: namespaces, nemeses, how the cluster is started; it gets `{node: (host, port)}`.
Threading: each client runs its own pika ioloop in its own thread and appends to the shared
History under a lock; `start`/`stop` are called from the test's thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

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
            self.channel.basic_publish(*self.outgoing(publish))
        except (pika.exceptions.AMQPError, AttributeError) as exc:
            self.note(f"publish failed: {exc!r}")
            self.close()

    def outgoing(self, publish: Publish) -> tuple[str, str, bytes, pika.BasicProperties]:
        """basic.publish's exchange, routing key, body and properties for a new id: persistent,
        to the queue through the default exchange (a delayed publisher's differ)."""
        return "", self.queue, body_of(publish.id), pika.BasicProperties(delivery_mode=2)

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


class _Subscriber(_Client):
    """A consumer of `queue` with a prefetch: basic.qos, then `subscribe`; a basic.cancel from
    the broker closes the connection (and the client connects and subscribes again)."""

    def __init__(self, *args: Any, queue: str, prefetch: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue, self.prefetch = queue, prefetch

    def channel_ready(self, channel: Any) -> None:
        channel.add_on_cancel_callback(self._cancelled)
        channel.basic_qos(prefetch_count=self.prefetch, callback=self._qos_ok)

    def _qos_ok(self, _frame: Any) -> None:
        if self.channel is not None:
            self.subscribe(self.channel)

    def _cancelled(self, _frame: Any) -> None:
        self.note("consumer cancelled by the broker")
        self.close()

    def subscribe(self, channel: Any) -> None: ...


class Consumer(_Subscriber):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.next_offset: int | None = None

    def subscribe(self, channel: Any) -> None:
        start: Any = "first" if self.next_offset is None else self.next_offset
        channel.basic_consume(self.queue, self._delivered, arguments={"x-stream-offset": start})

    def _delivered(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        offset = int((properties.headers or {}).get("x-stream-offset", -1))
        with self.lock:
            self.history.deliveries.append(
                Delivery(self.client, self.node, offset, id_of(body), self.clock()))
        if offset >= 0:
            self.next_offset = offset + 1
        channel.basic_ack(method.delivery_tag)


class Workload:
    """What a round needs of a workload, the same for every kind of queue: `{node: (host,
    port)}`, the queue, the history its clients append to (under `lock`) and the clients,
    made by `make_clients` when the round starts them. A kind says its `arguments` and how it
    reads a stored record (`decode`)."""

    kind: str

    def __init__(self, endpoints: dict[str, tuple[str, int]], queue: str, history: History,
                 clock: Callable[[], float]) -> None:
        self.endpoints, self.queue = endpoints, queue
        self.history = history
        self.lock = threading.Lock()
        self.clock = clock
        self.clients: list[_Client] = []
        self.declared_on: str | None = None

    def arguments(self) -> dict[str, Any]:
        raise NotImplementedError

    def make_clients(self) -> list[_Client]:
        raise NotImplementedError

    def decode(self, record: bytes) -> str | None:
        raise NotImplementedError

    def common(self) -> dict[str, Any]:
        """What every client of the workload is given."""
        return {"history": self.history, "lock": self.lock, "clock": self.clock}

    def paths(self) -> str:
        """Who publishes and consumes through which node, for the report."""
        return ", ".join(f"{c.client}@{c.node}" for c in self.clients)

    def declare(self, via: str) -> None:
        """Declare the queue once, durable, through node `via` (its first leader: a replicated
        queue is placed client-local), with the kind's `arguments`."""
        self.declared_on = via
        self._on(via, lambda channel: channel.queue_declare(
            self.queue, durable=True, arguments=self.arguments()))

    def delete(self, via: str) -> None:
        self._on(via, lambda channel: channel.queue_delete(self.queue))

    def _on(self, via: str, action: Callable[[Any], Any]) -> None:
        """`action` on a channel of a fresh connection through node `via`."""
        conn = pika.BlockingConnection(parameters(*self.endpoints[via]))
        try:
            action(conn.channel())
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()

    def start(self) -> None:
        self.clients = self.make_clients()
        for client in self.clients:
            client.start()

    def stop(self, timeout: float = 20.0) -> History:
        """Stop sending, give confirms in flight a bounded time, close; the history so far."""
        for client in self.clients:
            client.stopping.set()
        deadline = time.monotonic() + timeout
        for client in self.clients:
            client.join(max(0.1, deadline - time.monotonic()))
            if client.is_alive():
                self.history.notes.append(f"{client.client} did not stop in {timeout} s")
        return self.history


class StreamWorkload(Workload):
    """A replicated stream with a publisher and a consumer on every node."""

    kind = "stream"
    decode = staticmethod(decode)

    def __init__(self, endpoints: dict[str, tuple[str, int]], queue: str, *,
                 rate: float = 150.0, window: int = 20, prefetch: int = 100,
                 drain_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(endpoints, queue, History(), clock)
        self.rate, self.window, self.prefetch, self.drain_s = rate, window, prefetch, drain_s

    def arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "stream", "x-initial-cluster-size": len(self.endpoints)}

    def make_clients(self) -> list[_Client]:
        clients: list[_Client] = []
        for node, address in sorted(self.endpoints.items()):
            clients.append(Publisher(f"p{node}", node, address, queue=self.queue,
                                     rate=self.rate, window=self.window, drain_s=self.drain_s,
                                     **self.common()))
            clients.append(Consumer(f"c{node}", node, address, queue=self.queue,
                                    prefetch=self.prefetch, **self.common()))
        return clients
