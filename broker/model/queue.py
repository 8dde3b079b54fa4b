"""Queues: what every queue type shares, and the classic queue.

The classic queue keeps ready messages in a store (FIFO or per priority), hands them round
robin to consumers that have credit, and applies RabbitMQ's arguments: message TTL (expiry at
the head only), x-expires, max length and bytes with drop-head or reject-publish, priorities,
dead-lettering and single active consumer. Unacked messages live in the consuming channel;
they come back through requeue() or leave through settle().

Single-threaded: every method runs on the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.model import args as qargs
from leveret.broker.model import delayed_ids
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.delayed_ids import MARK, TakenIds
from leveret.broker.model.errors import AccessRefused, PreconditionFailed, resource
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.store import MemoryStore, MessageStore, PriorityStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from leveret.broker.model.dedup import DedupCache
    from leveret.broker.model.exchange import Exchange
    from leveret.broker.model.policy import Policy
    from leveret.broker.model.queue_client import QueueClient, QueueMethod
    from leveret.broker.model.scheduler import Scheduler, Timer


class QueueOwner(Protocol):
    """What a queue asks of the vhost that holds it (vhost.py implements it): its clock,
    dead-lettering, its policies, and to be deleted. Named here rather than importing the
    vhost, which builds queues, so that the two modules import one way only."""

    @property
    def name(self) -> str: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def exchanges(self) -> dict[str, Exchange]: ...

    def delete_queue(self, queue: Queue) -> int: ...

    def dead_letter(self, queue: Queue, entry: QueuedMessage, reason: str,
                    confirm: Confirm | None = None) -> int: ...

    def policy_for(self, kind: str, name: str, queue_type: str | None = None) -> Policy | None:
        ...


class Queue:
    """What every queue type has: identity, flags, consumers and the exclusive rules; and
    how a queue of this node serves basic.consume and basic.get (model/queue_type.py)."""

    kind = "queue"
    type = "classic"
    redelivers = True  # a requeued message comes back (streams only give the credit back)
    unacked = 0  # deliveries not yet settled, as the queue counts them (classic queues do)
    single_active = False  # x-single-active-consumer on a classic queue
    # message statistics beside stats_published and stats_delivered (which counts every
    # delivery and get): bumped by the channels, once per ack run or on the rare paths
    stats_ack = 0
    stats_get = 0
    stats_get_no_ack = 0
    stats_deliver_no_ack = 0
    stats_redeliver = 0
    stats_get_empty = 0

    def __init__(
        self,
        vhost: QueueOwner,
        name: str,
        *,
        durable: bool = True,
        exclusive_owner: object = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.consumers: list[Consumer] = []
        self.had_consumers = False
        self.deleted = False
        self.dedup: DedupCache | None = None  # a queue-level deduplication cache
        self.taken_ids = TakenIds()  # the delayed copies it took (delayed_ids.py)
        self.stats_published = 0
        self.stats_delivered = 0

    @property
    def resource(self) -> str:
        return resource("queue", self.name, self.vhost.name)

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def holder(self) -> str | None:
        """The node of the cluster that holds this queue when it is another one; None when it
        is held here."""
        return None

    @property
    def written_elsewhere(self) -> bool:
        """Whether a message published here is written by another node: a queue held by
        another node, or a replica of one whose leader is elsewhere."""
        return self.holder is not None or getattr(self, "forward_to", None) is not None

    @property
    def message_count(self) -> int:
        return 0

    @property
    def message_bytes(self) -> int:
        """The ready messages' bytes, where the type counts them."""
        return 0

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def count_on_delete(self) -> int:
        """What delete-ok reports as the number of messages deleted."""
        return self.message_count

    def check_consume(self, exclusive: bool) -> None:
        """Queue-type rules for a new consumer among those already here, checked before
        consume-ok. A stream records basic.consume's exclusive flag and enforces nothing."""

    def consumer_queue(self, arguments: dict[str, Any]) -> Queue:
        """The queue that a consumer with these arguments joins: this one, as a rule."""
        return self

    def consume(self, consumer: Consumer, client: QueueClient, nowait: bool) -> None:
        """consume-ok first, then the consumer joins (and may be delivered to at once)."""
        client.consume_started(consumer, nowait)
        self.add_consumer(consumer)

    def add_consumer(self, consumer: Consumer) -> None:
        self.check_consume(consumer.exclusive)
        self.consumers.append(consumer)
        self.had_consumers = True

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if self.auto_delete and self.had_consumers and not self.consumers and not self.deleted:
            self.vhost.delete_queue(self)

    def resume(self, consumer: Consumer) -> None:
        """A consumer whose subscription went with a lost leader subscribes here again,
        without a second consume-ok (a queue of this node simply takes it)."""
        self.add_consumer(consumer)

    def reachable(self) -> bool:
        """Whether the queue can be served now (a queue of this node always can)."""
        return True

    def consumer_timeout(self, arguments: dict[str, Any] | None) -> int | None:
        """How long (ms) a consumer with these arguments (None: a basic.get) may hold a
        delivery unacked; None: no limit (classic queues and streams, as in RabbitMQ 4.3)."""
        return None

    def consumer_lost(self, consumer: Consumer) -> bool:
        """The node that served this queue's consumer for it is gone: True if the queue
        keeps the consumer to resume it elsewhere (a quorum queue), False to cancel it."""
        return False

    def touch(self) -> None:
        """A basic.get or a redeclare: the queue is in use (x-expires)."""

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        """Take one routed message; False if the queue refused it."""
        raise NotImplementedError

    def delayed_copy(self, message: InboundMessage) -> InboundMessage | None:
        """The message to keep (a delayed exchange's copy loses its id), or None for a
        delayed copy this queue took already (delayed_ids.py)."""
        return delayed_ids.take(self.taken_ids, message, self.took_delayed)

    def took_delayed(self, log_id: str, offset: int) -> None:
        """A delayed copy was taken (a durable queue or a stream records its id in its log;
        a non-durable classic queue only in `taken_ids`)."""

    def dispatch(self) -> None:
        """Deliver to consumers that have credit."""

    def purge(self) -> int:
        raise NotImplementedError

    # A delivery's handle (`entry`) is the queue type's own: a QueuedMessage for classic
    # queues, an offset for streams. The session hands it back unread.
    def get(self, no_ack: bool) -> QueuedMessage | None:
        """basic.get: take the next message, or None when there is none."""
        raise NotImplementedError

    def serve_get(self, client: QueueClient, no_ack: bool) -> None:
        """basic.get answered in this turn, with the queue's statistics."""
        entry = self.get(no_ack)
        if entry is None:
            self.stats_get_empty += 1
            client.get_empty()
            return
        if no_ack:
            self.stats_get_no_ack += 1
        else:
            self.stats_get += 1
        if entry.redelivered:
            self.stats_redeliver += 1
        client.get_ok(entry, self, no_ack, self.message_count)

    def ack(self, entry: Any, consumer: Consumer | None = None) -> None:
        """A delivery was acknowledged."""
        raise NotImplementedError

    def ack_many(self, entries: list[Any], consumer: Consumer | None = None) -> None:
        """Deliveries to one consumer (or basic.gets) acknowledged at once, in delivery order;
        a queue type may settle them faster than one by one."""
        ack = self.ack
        for entry in entries:
            ack(entry, consumer)

    def reject(self, entry: Any, consumer: Consumer | None = None) -> None:
        """A delivery was rejected without requeue (dead-lettered or dropped)."""
        raise NotImplementedError

    def requeue(self, entries: list[Any], delivery_failed: bool = True) -> None:
        """Deliveries given back, in delivery order."""
        raise NotImplementedError

    def awaiting_leader(self) -> bool:
        """A replicated queue between two leaders (its leader lost, the next not known yet):
        what only a leader answers (a passive declare, a purge, a delete) waits for the next
        one. A queue of this node never is."""
        return False

    def forward(self, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> bool:
        """A queue of this node serves queue.declare and queue.purge itself: nothing to hand
        to another node."""
        return False

    def forward_delete(self, client: QueueClient, method: QueueMethod,
                       answer: Callable[[QueueMethod], None]) -> bool:
        """A queue of this node is deleted here: nothing to hand to another node."""
        return False

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """Raise if queue.delete's conditions forbid deleting now."""

    def validate_consumer(self, tag: str, no_ack: bool, prefetch: int, global_prefetch: int,
                          arguments: dict[str, Any]) -> None:
        """Queue-type rules for basic.consume, checked before consume-ok: the consume
        arguments this type knows, with RabbitMQ's texts."""
        qargs.check_consume_args(arguments, self.type, self.resource)

    def close(self) -> None:
        """Broker shutdown: flush and release files (durable queue types)."""

    def policy_changed(self) -> None:
        """The vhost's policies changed; queue types that use policies re-read theirs."""

    def on_delete(self) -> None:
        """The queue is being deleted: tell consumers, free resources."""
        self.deleted = True
        for consumer in list(self.consumers):
            consumer.sink.server_cancel(consumer)
        self.consumers.clear()


class ClassicQueue(Queue):
    type = "classic"

    def __init__(self, vhost: QueueOwner, name: str, **kwargs: Any) -> None:
        super().__init__(vhost, name, **kwargs)
        a = self.arguments
        self.ttl_ms: int | None = a.get("x-message-ttl")
        self.expires_ms: int | None = a.get("x-expires")
        self.max_length: int | None = a.get("x-max-length")
        self.max_length_bytes: int | None = a.get("x-max-length-bytes")
        self.overflow = qargs.text(a.get("x-overflow", "drop-head"))
        self.max_priority: int | None = a.get("x-max-priority")
        dlx = a.get("x-dead-letter-exchange")
        self.dlx: str | None = qargs.text(dlx) if dlx is not None else None
        dlrk = a.get("x-dead-letter-routing-key")
        self.dlrk: str | None = qargs.text(dlrk) if dlrk is not None else None
        self.single_active = a.get("x-single-active-consumer") is True
        self.messages: MessageStore = (
            PriorityStore(self.max_priority) if self.max_priority else MemoryStore()
        )
        self.unacked = 0
        self._seq = 0
        self._rr = 0
        self._dispatching = False
        self._expiry_timer: Timer | None = None
        self._expiry_at: int | None = None
        self._idle_timer: Timer | None = None
        self.arm_idle_timer()

    @property
    def message_count(self) -> int:
        return len(self.messages)

    @property
    def message_bytes(self) -> int:
        return self.messages.bytes

    # -- publishing ---------------------------------------------------------------------------

    def _expires_at(self, message: InboundMessage, now: int | None = None) -> int | None:
        """When a message published `now` (read from the clock if not given) expires."""
        ttl = self.ttl_ms
        expiration = message.expiration
        if expiration is not None:
            per_message = qargs.parse_expiration(expiration)
            ttl = per_message if ttl is None else min(ttl, per_message)
        if ttl is None:
            return None
        return (self.vhost.scheduler.now_ms() if now is None else now) + ttl

    def _would_overflow(self, message: InboundMessage) -> bool:
        if self.max_length is not None and len(self.messages) + 1 > self.max_length:
            return True
        return (
            self.max_length_bytes is not None
            and self.messages.bytes + message.size > self.max_length_bytes
        )

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        """Enqueue one message; False if it was dropped as a duplicate.

        A reject-publish overflow nacks the publish but returns True: the message was routed,
        so a mandatory publish gets no basic.return (as in RabbitMQ).
        """
        if self.dedup is not None and self.dedup.seen(message.headers):
            return False
        if self.overflow != "drop-head" and self._would_overflow(message):
            if confirm is not None:
                confirm.reject()
            if self.overflow == "reject-publish-dlx":
                self.vhost.dead_letter(self, QueuedMessage(message, 0), "maxlen")
            # Routed all the same: RabbitMQ sends no basic.return for it; the nack tells.
            return True
        if MARK in message.header:  # a delayed exchange's copy (delayed_ids.py), taken
            kept = self.delayed_copy(message)
            if kept is None:
                return True  # taken already: a delayed exchange's new leader routed it again
            message = kept
        now = self.vhost.scheduler.now_ms()
        self._seq += 1
        entry = QueuedMessage(
            message,
            self._seq,
            self._expires_at(message, now),
            self.priority_of(message),
        )
        self.stats_published += 1
        if not len(self.messages) and self.consumers and not self._dispatching:
            # RabbitMQ's attempt_delivery: a ready consumer takes a new message straight
            # away, with no expiry check (so even a TTL of 0 reaches it).
            consumer = self._next_consumer()
            if consumer is not None:
                self.accept(entry, confirm)
                self.deliver_to(consumer, entry)
                return True
        self.messages.push(entry)
        self.accept(entry, confirm)
        self.dispatch(now)
        self._drop_over_limit()
        self._expire_head(now)
        return True

    def priority_of(self, message: InboundMessage) -> int:
        """The level a message waits at: its priority, up to x-max-priority."""
        return min(message.priority, self.max_priority or 0)

    def accept(self, entry: QueuedMessage, confirm: Confirm | None) -> None:
        """A new entry is in the store; a durable queue persists it here."""

    def _drop_over_limit(self) -> None:
        """drop-head: drop (or dead-letter) from the head while over a limit."""
        if self.overflow != "drop-head":
            return
        messages = self.messages
        while (self.max_length is not None and len(messages) > self.max_length) or (
            self.max_length_bytes is not None and messages.bytes > self.max_length_bytes
        ):
            entry = messages.pop()
            if entry is None:
                break
            self.discard(entry, "maxlen")

    # -- delivering ---------------------------------------------------------------------------

    def _next_consumer(self) -> Consumer | None:
        consumers = self.consumers
        if not consumers:
            return None
        if self.single_active:
            first = consumers[0]
            return first if first.sink.can_send(first) else None
        count = len(consumers)
        if count == 1:  # the common case, without the priorities' max
            only = consumers[0]
            return only if only.sink.can_send(only) else None
        top = max(c.priority for c in consumers)
        for step in range(count):
            index = (self._rr + step) % count
            consumer = consumers[index]
            if consumer.priority == top and consumer.sink.can_send(consumer):
                self._rr = (index + 1) % count
                return consumer
        if any(c.priority != top for c in consumers):
            for consumer in sorted(consumers, key=lambda c: -c.priority):
                if consumer.sink.can_send(consumer):
                    return consumer
        return None

    def dispatch(self, now: int | None = None) -> None:
        """Hand ready messages to consumers while any has credit."""
        if self._dispatching or not self.consumers or not len(self.messages):
            return
        self._dispatching = True
        try:
            if now is None:
                now = self.vhost.scheduler.now_ms()
            while len(self.messages):
                consumer = self._next_consumer()
                if consumer is None:
                    break
                entry = self._pop_live(now)
                if entry is None:
                    break
                self.deliver_to(consumer, entry)
        finally:
            self._dispatching = False

    def deliver_to(self, consumer: Consumer, entry: QueuedMessage) -> None:
        self.stats_delivered += 1
        if consumer.no_ack:
            consumer.sink.send(consumer, entry, self)
            self.settled(entry)
        else:
            self.unacked += 1
            consumer.sink.send(consumer, entry, self)

    def _pop_live(self, now: int) -> QueuedMessage | None:
        """Pop the head, dead-lettering expired messages in front of it."""
        while True:
            entry = self.messages.pop()
            if entry is None or entry.expires_at is None or entry.expires_at > now:
                return entry
            self.discard(entry, "expired")

    def get(self, no_ack: bool) -> QueuedMessage | None:
        """basic.get: the head message, or None."""
        self.touch()
        entry = self._pop_live(self.vhost.scheduler.now_ms())
        if entry is None:
            return None
        self.stats_delivered += 1
        if no_ack:
            self.settled(entry)
        else:
            self.unacked += 1
        return entry

    # -- settling -----------------------------------------------------------------------------

    def ack(self, entry: QueuedMessage, consumer: Consumer | None = None) -> None:
        self.unacked -= 1
        self.settled(entry)

    def settled(self, entry: QueuedMessage) -> None:
        """An entry left the queue for good; a durable queue records it."""

    def reject(self, entry: QueuedMessage, consumer: Consumer | None = None) -> None:
        """nack/reject without requeue: dead-letter (reason rejected) or drop."""
        self.unacked -= 1
        self.discard(entry, "rejected")

    def requeue(self, entries: list[QueuedMessage], delivery_failed: bool = True) -> None:
        """Put unacked entries back at their places, marked redelivered."""
        if self.deleted:
            return
        for entry in entries:
            self.unacked -= 1
            entry.redelivered = True
            self.messages.requeue(entry)
            self.requeued(entry)
        # RabbitMQ's requeue_and_run: apply max-length, drop expired heads, then deliver.
        now = self.vhost.scheduler.now_ms()
        self._drop_over_limit()
        self._expire_head(now)
        self.dispatch(now)

    def requeued(self, entry: QueuedMessage) -> None:
        """An entry came back; a durable queue records the redelivered flag."""

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """An entry leaves without delivery: dead-letter it if the queue has a DLX. A deleted
        queue dead-letters nothing: a delivery nacked after its queue went is lost, as in
        RabbitMQ, whose channel drops settlements for a queue that no longer exists."""
        self.settled(entry)
        if self.dlx is not None and not self.deleted:
            self.vhost.dead_letter(self, entry, reason)

    def purge(self) -> int:
        entries = self.messages.clear()
        for entry in entries:
            self.settled(entry)
        return len(entries)

    # -- consumers ----------------------------------------------------------------------------

    def check_consume(self, exclusive: bool) -> None:
        """RabbitMQ's rule, whichever channel or connection asks: an exclusive consumer
        needs a queue with no consumers, and once it holds the queue nobody else may consume
        from it; with single active consumer on, no consumer may be exclusive at all."""
        if (exclusive and (self.consumers or self.single_active)) or any(
            c.exclusive for c in self.consumers
        ):
            raise AccessRefused(f"{self.resource} in exclusive use")

    def add_consumer(self, consumer: Consumer) -> None:
        super().add_consumer(consumer)
        self._cancel_idle_timer()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        if not self.deleted:
            self.arm_idle_timer()
            self.dispatch()

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        if if_unused and self.consumers:
            raise PreconditionFailed(f"{self.resource} in use")
        if if_empty and len(self.messages):
            raise PreconditionFailed(f"{self.resource} not empty")

    def on_delete(self) -> None:
        super().on_delete()
        self._cancel_idle_timer()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self.messages.clear()

    # -- timers -------------------------------------------------------------------------------

    def touch(self) -> None:
        self.arm_idle_timer()

    def arm_idle_timer(self) -> None:
        """x-expires: delete the queue after that long without consumers or use."""
        if self.expires_ms is None or self.consumers or self.deleted:
            return
        self._cancel_idle_timer()
        self._idle_timer = self.vhost.scheduler.call_later(self.expires_ms, self._idle_expired)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if not self.consumers and not self.deleted:
            self.vhost.delete_queue(self)

    def _expire_head(self, now: int) -> None:
        """Drop expired messages at the head, and set a timer for the next one."""
        messages = self.messages
        while True:
            head = messages.peek()
            if head is None or head.expires_at is None:
                return
            if head.expires_at > now:
                break
            messages.pop()
            self.discard(head, "expired")
        if self._expiry_at is not None and self._expiry_at <= head.expires_at:
            return
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        self._expiry_at = head.expires_at
        self._expiry_timer = self.vhost.scheduler.call_later(
            max(0, head.expires_at - now), self._on_expiry_timer
        )

    def _on_expiry_timer(self) -> None:
        self._expiry_timer = None
        self._expiry_at = None
        if not self.deleted:
            self._expire_head(self.vhost.scheduler.now_ms())
