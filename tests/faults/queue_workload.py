"""The quorum-queue workload: publishers with confirms and consumers with acks, then a drain.

Role: drive real AMQP clients (pika) against a quorum queue during a round and hand the
total-queue checker (queue_checker.py) a `QueueHistory`. It is a `workload.Workload` (declared,
started, stopped and deleted as a stream's), and its publishers are the stream workload's
(workload.Publisher: each id sent once, a nack or a lost connection leaves it `nacked` or
`unconfirmed`, never re-sent). A consumer subscribes with a prefetch, records each delivery
(its id, whether it came `redelivered`) and only then acks it; after a lost connection, a
closed channel or a basic.cancel it connects again and subscribes again.

Two shapes:

- `QuorumWorkload(...)`: a publisher and a consumer on every node (the fault suite's);
  consumers take fewer messages a second than publishers send (60 against 100 each, by
  default), so the queue holds a backlog when the nemesis strikes, which a new leader must
  rebuild from its log and the final drain must empty;
- `QuorumWorkload(..., single_path=True)`: one publisher through one node and one consumer
  through another, neither of them the node the queue was declared through (its first leader),
  so that the order of first deliveries is the queue's order and can be checked.

After the round, `drain()` empties the queue through every node in turn (basic.consume with
acks, until the queue reports no ready message and nothing more arrives), recording what it got
as `DRAIN` deliveries: Jepsen's final drain.

Must not know: namespaces, nemeses, how the cluster is started; it gets `{node: (host, port)}`.
Threading: each client runs its own pika ioloop in its own thread and appends to the shared
history under a lock; `declare`, `start`, `stop`, `drain`, `delete` run on the test's thread.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from faults.queue_checker import DRAIN, RUN, Dequeue, QueueHistory
from faults.workload import Publisher, Workload, _Client, _Subscriber, id_of, parameters

from leveret.amqp.stored import decode_record
from leveret.broker.model.durable import _HEAD

QUORUM = "quorum"


def decode(record: bytes) -> str | None:
    """The id of a quorum queue's message record (the durable queue's head, then the stored
    AMQP 0.9.1 message: broker/model/durable.py)."""
    try:
        return id_of(bytes(decode_record(record, _HEAD.size).body))
    except (IndexError, ValueError):
        return None


class QueueConsumer(_Subscriber):
    """basic.consume with a prefetch; record, then ack, each delivery, at most `rate` a second
    (None: as they come). Deliveries beyond the rate wait in the client, unacked: a lost
    connection gives them back to the queue unrecorded, as a crashed client would."""

    def __init__(self, *args: Any, rate: float | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rate = rate
        self.waiting: collections.deque[tuple[int, bool, bytes]] = collections.deque()
        self.tokens, self.last = 0.0, 0.0

    def subscribe(self, channel: Any) -> None:
        self.tokens, self.last = 1.0, self.clock()
        channel.basic_consume(self.queue, self._delivered)

    def _delivered(self, _channel: Any, method: Any, _properties: Any, body: bytes) -> None:
        self.waiting.append((method.delivery_tag, bool(method.redelivered), body))
        self.work()

    def work(self) -> None:
        if self.rate is not None:
            now = self.clock()
            self.tokens = min(float(self.prefetch), self.tokens + self.rate * (now - self.last))
            self.last = now
        history = self.history
        assert isinstance(history, QueueHistory)
        while self.waiting and self.channel is not None and (
                self.rate is None or self.tokens >= 1):
            tag, redelivered, body = self.waiting.popleft()
            self.tokens -= 1
            with self.lock:
                history.dequeues.append(Dequeue(self.client, self.node, id_of(body),
                                                redelivered, self.clock(), RUN))
            self.channel.basic_ack(tag)

    def connection_ended(self) -> None:
        self.waiting.clear()  # unacked: the queue has them back


class QuorumWorkload(Workload):
    """A quorum queue with publishers and consumers (on every node, or on one path)."""

    kind = QUORUM
    decode = staticmethod(decode)
    history: QueueHistory

    def __init__(self, endpoints: dict[str, tuple[str, int]], queue: str, *,
                 rate: float = 100.0, window: int = 20, prefetch: int = 50,
                 consume_rate: float | None = 60.0, drain_s: float = 5.0,
                 single_path: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(endpoints, queue, QueueHistory(), clock)
        self.rate, self.window, self.prefetch, self.drain_s = rate, window, prefetch, drain_s
        self.consume_rate = consume_rate
        self.single_path = single_path
        self.ordered = single_path  # one consumer at a time: first deliveries in queue order

    def arguments(self) -> dict[str, Any]:
        """Every node a member, and no delivery limit: a message returned often in a faulty
        round is redelivered, never dropped, so that any confirmed id missing at the end is a
        loss."""
        return {"x-queue-type": QUORUM, "x-quorum-initial-group-size": len(self.endpoints),
                "x-delivery-limit": -1}

    def make_clients(self) -> list[_Client]:
        names = sorted(self.endpoints)
        if self.single_path:
            others = [n for n in names if n != self.declared_on] or names
            publishers, consumers = others[:1], others[-1:]
        else:
            publishers = consumers = names
        clients: list[_Client] = []
        for node in publishers:
            clients.append(Publisher(
                f"p{node}", node, self.endpoints[node], queue=self.queue, rate=self.rate,
                window=self.window, drain_s=self.drain_s, **self.common()))
        for node in consumers:
            clients.append(QueueConsumer(
                f"c{node}", node, self.endpoints[node], queue=self.queue,
                prefetch=self.prefetch, rate=self.consume_rate, **self.common()))
        return clients

    def drain(self, first: str, timeout: float = 60.0, idle_s: float = 0.5) -> list[str]:
        """Empty the queue through every node, `first` first, recording each delivery as a
        DRAIN dequeue, in passes until one pass gets nothing and every node reports no ready
        message; the problems of the last pass (empty when it ended so)."""
        names = sorted(self.endpoints)
        order = [first] + [n for n in names if n != first]
        deadline = time.monotonic() + timeout
        problems = ["not drained: no pass finished"]
        while time.monotonic() < deadline:
            problems = []
            before = len(self.history.dequeues)
            for node in order:
                try:
                    left = self._drain_through(node, deadline, idle_s)
                except (pika.exceptions.AMQPError, OSError) as exc:
                    problems.append(f"drain through {node}: {exc!r}")
                    continue
                if left:
                    problems.append(f"drain through {node}: {left} messages still ready")
            if not problems and len(self.history.dequeues) == before:
                return []
            if problems:
                time.sleep(0.5)
        return problems

    def _drain_through(self, node: str, deadline: float, idle_s: float) -> int:
        """Consume through `node` (recording, then acking, each delivery) until nothing
        arrives for `idle_s`; the queue's ready count then. Closing the connection gives back
        anything delivered but not yet handed to the callback (never nack'ed: a reject would
        count towards the delivery limit)."""
        conn = pika.BlockingConnection(parameters(*self.endpoints[node]))
        try:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=200)

            def got(ch: Any, method: Any, _props: Any, body: bytes) -> None:
                with self.lock:
                    self.history.dequeues.append(Dequeue(
                        f"drain@{node}", node, id_of(body), bool(method.redelivered),
                        self.clock(), DRAIN))
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume(self.queue, got)
            last, seen = time.monotonic(), len(self.history.dequeues)
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
                if len(self.history.dequeues) != seen:
                    last, seen = time.monotonic(), len(self.history.dequeues)
                elif time.monotonic() - last > idle_s:
                    break
            return int(channel.queue_declare(self.queue, passive=True).method.message_count)
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                conn.close()
