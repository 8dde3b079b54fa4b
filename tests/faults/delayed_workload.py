"""The delayed-message workload: publishers with confirms into a delayed exchange, consumers of
its target quorum queue, then a drain.

Role: drive real AMQP clients (pika) against a durable delayed exchange (`x-delayed-message`,
`x-delayed-type: direct`) bound to a durable quorum queue (the target: a quorum queue keeps the
`x-leveret-delayed-id` of every copy it took, replicated, so a copy routed twice is dropped
there) during a round, and hand the delayed checker (delayed_checker.py) a `DelayedHistory`.
In a cluster the exchange's messages are held in one hidden replicated log,
`amq.delayed.<digest>` (`subject`): that log's leader is what the round's nemesis strikes.

- The exchange is `<queue>-dx`, the target queue `<queue>`, bound with the key `<queue>`; both
  are declared through the round's node (the log's first leader, placed client-local as a
  quorum queue), the queue through that node or the next one (`target_here`; by default the
  queue name's digest, so a round's seed, decides whether the routed copies stay on the log
  leader's node, where a nemesis strikes both, or cross to another).
- A publisher per node (workload.Publisher: each id sent once, with confirms; a nack or a lost
  connection leaves it `nacked` or `unconfirmed`, never re-sent) sends each id with an `x-delay`
  drawn from `delay_s` (most: due while the nemesis runs) or, a `late_share` of them, from
  `late_s` (due after the heal); the body carries the id and the due time (wall clock, ms),
  and the history keeps each id's due time on the clients' clock (`due`).
- A consumer per node (queue_workload.QueueConsumer, no rate limit) records each delivery and
  its `redelivered` flag, then acks it.
- `stop()` stops the publishers first, then keeps the consumers running until every confirmed
  id was delivered and the last id sent is past its due time (by `GRACE_S`, for a second copy
  to show), or `LATE_S` after that due time; then stops them. The round then drains the queue
  (queue_workload's final drain).

Must not know: namespaces, nemeses, how the cluster is started; it gets `{node: (host, port)}`.
Threading: each client runs its own pika ioloop in its own thread and appends to the shared
history under a lock; `declare`, `start`, `stop`, `drain`, `delete` run on the test's thread.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
from faults.checker import CONFIRMED, Publish
from faults.queue_checker import QueueHistory
from faults.queue_workload import QueueConsumer, QuorumWorkload
from faults.workload import FILLER, MAGIC, Publisher, _Client

from leveret.broker.model.delayed_log import log_name

LATE_S = 30.0  # the lateness bound: a confirmed message first delivered later than this after
# its due time (or after the cluster recovered, when it fell due before) fails the round
GRACE_S = 1.0  # past the last due time, for copies routed twice to show up


def exchange_of(queue: str) -> str:
    return f"{queue}-dx"


def subject(queue: str) -> str:
    """The hidden replicated log that holds the round's delayed exchange's messages."""
    return log_name("/", exchange_of(queue))


def delayed_body(id_: str, due_ms: int) -> bytes:
    """The workload's body (workload.id_of reads the id back), with the due time."""
    return MAGIC + id_.encode() + b"|due=" + str(due_ms).encode() + b"|" + FILLER


@dataclass
class DelayedHistory(QueueHistory):
    due: dict[str, float] = field(default_factory=dict)  # id: due time on the clients' clock


class DelayedPublisher(Publisher):
    """A Publisher into the delayed exchange, each id with its own `x-delay`."""

    def __init__(self, *args: Any, exchange: str, delay: Callable[[], float],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exchange, self.delay = exchange, delay

    def outgoing(self, publish: Publish) -> tuple[str, str, bytes, pika.BasicProperties]:
        delay_s = self.delay()
        history = self.history
        assert isinstance(history, DelayedHistory)
        with self.lock:
            history.due[publish.id] = publish.sent_at + delay_s
        due_ms = int((time.time() + delay_s) * 1000)
        return (self.exchange, self.queue, delayed_body(publish.id, due_ms),
                pika.BasicProperties(delivery_mode=2,
                                     headers={"x-delay": int(delay_s * 1000)}))


class DelayedWorkload(QuorumWorkload):
    """A delayed exchange, its target quorum queue, a publisher and a consumer on every node."""

    history: DelayedHistory

    def __init__(self, endpoints: dict[str, tuple[str, int]], queue: str, *,
                 rate: float = 60.0, delay_s: tuple[float, float] = (0.5, 8.0),
                 late_s: tuple[float, float] = (8.0, 12.0), late_share: float = 0.15,
                 target_here: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(endpoints, queue, rate=rate, consume_rate=None, clock=clock)
        self.history = DelayedHistory()  # the quorum workload's, with due times
        self.delay_s, self.late_s, self.late_share = delay_s, late_s, late_share
        self.exchange = exchange_of(queue)
        self.target_here = target_here
        self.target_on: str | None = None

    def delay(self, rng: random.Random) -> float:
        low, high = self.late_s if rng.random() < self.late_share else self.delay_s
        return rng.uniform(low, high)

    def declare(self, via: str) -> None:
        """The exchange through `via` (its log's first leader), the target queue through `via`
        or the next node (`target_here`, or when None the queue name's digest, decides), and
        the binding."""
        self.declared_on = via
        names = sorted(self.endpoints)
        here = (zlib.crc32(self.queue.encode()) % 2 == 0 if self.target_here is None
                else self.target_here)
        self.target_on = names[(names.index(via) + (0 if here else 1)) % len(names)]
        self._on(via, lambda channel: channel.exchange_declare(
            self.exchange, "x-delayed-message", durable=True,
            arguments={"x-delayed-type": "direct"}))
        self._on(self.target_on, lambda channel: channel.queue_declare(
            self.queue, durable=True, arguments=self.arguments()))
        self._on(via, lambda channel: channel.queue_bind(self.queue, self.exchange, self.queue))

    def delete(self, via: str) -> None:
        self._on(via, lambda channel: channel.exchange_delete(self.exchange))
        super().delete(via)

    def paths(self) -> str:
        return (f"log first led by {self.declared_on}, target queue declared through "
                f"{self.target_on}; " + super().paths())

    def make_clients(self) -> list[_Client]:
        clients: list[_Client] = []
        for node in sorted(self.endpoints):
            rng = random.Random(f"{self.queue}/{node}")
            clients.append(DelayedPublisher(
                f"p{node}", node, self.endpoints[node], queue=self.queue, rate=self.rate,
                window=self.window, drain_s=self.drain_s, exchange=self.exchange,
                delay=lambda rng=rng: self.delay(rng), **self.common()))
        for node in sorted(self.endpoints):
            clients.append(QueueConsumer(
                f"c{node}", node, self.endpoints[node], queue=self.queue,
                prefetch=self.prefetch, rate=None, **self.common()))
        return clients

    def stop(self, timeout: float = 20.0) -> DelayedHistory:
        """Stop the publishers, let the consumers take what falls due (see the module's
        docstring), then stop them."""
        publishers = [c for c in self.clients if isinstance(c, Publisher)]
        for client in publishers:
            client.stopping.set()
        deadline = time.monotonic() + timeout
        for client in publishers:
            client.join(max(0.1, deadline - time.monotonic()))
        self.await_due()
        super().stop(timeout)
        return self.history

    def await_due(self) -> None:
        with self.lock:
            last = max(self.history.due.values(), default=self.clock())
            confirmed = {p.id for p in self.history.publishes if p.outcome == CONFIRMED}
        deadline = last + LATE_S
        while self.clock() < deadline:
            with self.lock:
                given = {d.id for d in self.history.dequeues}
            if self.clock() >= last + GRACE_S and confirmed <= given:
                return
            time.sleep(0.1)
