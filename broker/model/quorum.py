"""Quorum queues (`x-queue-type: quorum`): a durable queue whose every message and settlement
is a record in its log, replicated as a stream's log is (docs/QUORUM-QUEUES.md).

The queue is the durable classic queue's state machine over its log (durable.py): message
records, settled ranges, delivered ranges, and one more record kind of its own, the counts of
a returned message (`RETURNS`: its delivery count and acquired count), so that a restart or a
new leader knows how often each message was tried. What differs from a classic queue:

- every message is written and confirmed once the log's commit point covers it (the fsync
  policy on one node; a majority of the members in a cluster, through the replication port);
- requeued messages go first; then strict priorities, 32 levels (0-31), a message without one
  at 4 (RabbitMQ 4.3): the default level is paged from the log, the others are kept in memory
  (store.py's LeveledStore);
- a returned message counts its acquisitions (`x-acquired-count`: every return) and its failed
  deliveries (`x-delivery-count`: basic.reject, or its channel closed, as RabbitMQ 4.3 counts;
  not basic.nack nor basic.recover); past the delivery limit (default 20, a negative one
  disables it) it is dead-lettered with the reason `delivery_limit`, or dropped;
- reject-publish lets the queue go one message over its limit and refuses publishes until it
  is back at 80% of it (rabbit_fifo's soft limit); reject-publish-dlx is drop-head, as there;
- exclusive consumers are not enforced; single active consumer prefers the highest x-priority
  (the active one keeps its place until what it holds is settled), and refuses basic.get;
- global QoS and queue.delete's if-unused and if-empty are refused as RabbitMQ 3.10 refuses
  them (docs/QUORUM-QUEUES.md says where 4.3 differs);
- every delivery is recorded (a DELIVERED record, a redelivery too) and sent once the record
  is where a confirmed message is, so that a restart or a new leader knows what any consumer
  was sent: it comes back flagged `redelivered` and counted, never as new;
- at-least-once dead lettering (`x-dead-letter-strategy`, with reject-publish): a dead letter
  stays in the queue (a `DEAD_LETTERS` record says so, for a restart or a new leader) until
  every queue its copy was routed to has confirmed it, and is tried again until then.

It must not know AMQP frames, the session or the cluster: it sees the replication port.
Single-threaded: runs on the event loop.
"""

from __future__ import annotations

import heapq
import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.model.consumer import Consumer
from leveret.broker.model.delayed_ids import MARK, TakenIds
from leveret.broker.model.delayed_retry import DelayedRetry, resolve
from leveret.broker.model.durable import (
    ACKS,
    DELIVERED,
    PENDING,
    DurableClassicQueue,
    PagedStore,
    _Batch,
    _parse_ranges,
    _ranges,
)
from leveret.broker.model.errors import NotImplementedFeature, ResourceLocked
from leveret.broker.model.intervals import IntervalSet
from leveret.broker.model.leader_wait import HOLD_MS, RESUME_RETRY_MS
from leveret.broker.model.log_queue import MemberAnswers
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue import ClassicQueue, Queue, QueueOwner
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.store import LeveledStore, MessageStore
from leveret.broker.process import logs
from leveret.storage import OffsetSpec, StorageError

if TYPE_CHECKING:
    from leveret.broker.model.queue_client import QueueClient, QueueMethod
    from leveret.broker.model.scheduler import Timer

log = logs.get("leveret.quorum")
RETURNS = 18  # chunk type: the counts of returned messages
_COUNTS = struct.Struct(">QII")  # offset, delivery count, acquired count
_COUNTS_AT = struct.Struct(">QIIq")  # the same, and when a delayed retry makes it ready (ms)
DEFAULT_PRIORITY = 4  # a message without a priority (RabbitMQ 4.x)
TOP_PRIORITY = 31
DEFAULT_DELIVERY_LIMIT = 20
DEAD_LETTERS = 19  # chunk type: messages dead-lettered at least once, until their targets have them
_DEAD = struct.Struct(">QB")  # offset, reason
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
DEAD_LETTER_RETRY_MS = 1000
DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000  # RabbitMQ's consumer_timeout
FOLLOW_MS = 1000  # how often a replica applies the leader's settlements to its log's head
UNSENT_MAX = 4096  # deliveries waiting for their DELIVERED record, at most, per queue
COUNT_HEADERS = ("x-delivery-count", "x-acquired-count")


def delivery_limit(argument: object, policy: object) -> int | None:
    """The delivery limit from the queue argument and the policy's `delivery-limit`, as
    RabbitMQ 4.3 resolves them: the lower of the two, unless one is negative (then the
    higher: a negative one alone disables it); anything but an integer counts as unset, and
    neither set is 20. None: unlimited."""
    values = [v for v in (argument, policy) if isinstance(v, int) and not isinstance(v, bool)]
    if not values:
        return DEFAULT_DELIVERY_LIMIT
    limit = max(values) if any(v < 0 for v in values) else min(values)
    return None if limit < 0 else limit


def _ms(value: object) -> int | None:
    """A timeout in milliseconds: a non-negative integer, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class QuorumQueue(MemberAnswers, DurableClassicQueue):
    type = "quorum"
    CHUNK_TYPES = (*DurableClassicQueue.CHUNK_TYPES, RETURNS, DEAD_LETTERS)
    STATE_TYPES = (*DurableClassicQueue.STATE_TYPES, RETURNS, DEAD_LETTERS)
    paged_level = DEFAULT_PRIORITY

    def __init__(self, vhost: QueueOwner, name: str, *, env: StorageEnv,
                 storage_id: str | None = None, replication: Replication = ONE_NODE,
                 **kwargs: Any) -> None:
        self.replication = replication
        self.recovered_counts: dict[int, tuple[int, int]] = {}  # offset: counts, until read
        self.delivery_limit: int | None = DEFAULT_DELIVERY_LIMIT
        self.stats_delivery_limit = 0  # messages dead-lettered or dropped at the limit
        # consumers of this node that the leader serves, by the queue that reaches it; and
        # those whose leader was lost, waiting to subscribe on the next one
        self.elsewhere: dict[Consumer, Queue] = {}
        self.waiting: list[Consumer] = []
        # publishes that reached this node while its leader was lost: (message, confirm, since)
        self.held: list[tuple[InboundMessage, Confirm | None, int]] = []
        self.uncommitted: deque[QueuedMessage] = deque()  # written, not yet committed
        self._resume_timer: Timer | None = None
        self.rejecting = False  # reject-publish: over the limit, until back under 80% of it
        self._policy_consumer_timeout: object = None
        self.dead_letter_strategy = "at-most-once"
        # at-least-once: dead letters held until their targets confirm them, by reason
        self.dead_letters: dict[QueuedMessage, str] = {}
        self.dead_letters_bytes = 0
        self._dead_letters_sent: set[QueuedMessage] = set()  # waiting for their targets
        self._dead_letter_timer: Timer | None = None
        self._followed = 0  # a replica: where its log's settlements were read up to
        self._follow_timer: Timer | None = None
        # deliveries waiting for their DELIVERED record (see deliver_to): (the last offset
        # of the write that holds it, its sends), in order; and the consumers that went
        # before theirs were sent
        self._unsent: deque[tuple[int, list[tuple[Consumer, QueuedMessage]]]] = deque()
        self._unsent_count = 0
        self._unsent_gone: set[Consumer] = set()
        # a restart's or a new leader's: messages delivered again after their last return,
        # so checked out when the log ended (their acquired count is one more than recorded)
        self._checked_out_again: set[int] = set()
        # delayed retry (delayed_retry.py): returned messages waiting to be ready again, as
        # (ready at, seq, entry); and a restart's or a new leader's, by offset
        self.delayed_retry: DelayedRetry | None = None
        self.retrying: list[tuple[int, int, QueuedMessage]] = []
        self.retrying_bytes = 0
        self._retry_timer: Timer | None = None
        self._recovered_retry: dict[int, int] = {}
        self._recovered_at = 0  # when this recovery began (ms): what a delayed retry waits for
        super().__init__(vhost, name, env=env, storage_id=storage_id, replication=replication,
                         **kwargs)
        if self.overflow == "reject-publish-dlx":
            log.warning(f"Invalid overflow strategy reject-publish-dlx for quorum queue: "
                        f"{self.resource}")
            self.overflow = "drop-head"  # as RabbitMQ's quorum queues treat it
        self.policy_changed()

    # -- what differs from a durable classic queue --------------------------------------------

    def make_store(self) -> MessageStore:
        return LeveledStore(DEFAULT_PRIORITY, PagedStore(self, level=DEFAULT_PRIORITY),
                            TOP_PRIORITY)

    def persists(self, message: InboundMessage) -> bool:
        return True  # a quorum queue keeps transient messages too

    def priority_of(self, message: InboundMessage) -> int:
        if not message.has_priority:
            return DEFAULT_PRIORITY
        return min(message.priority, TOP_PRIORITY)

    def policy_changed(self) -> None:
        policy = self.vhost.policy_for("queues", self.name, self.type)
        definition = policy.definition if policy is not None else {}
        self.delivery_limit = delivery_limit(self.arguments.get("x-delivery-limit"),
                                             definition.get("delivery-limit"))
        strategy = self.arguments.get("x-dead-letter-strategy",
                                      definition.get("dead-letter-strategy", "at-most-once"))
        if isinstance(strategy, bytes):
            strategy = strategy.decode()
        if strategy == "at-least-once" and self.overflow != "reject-publish":
            log.warning(
                f"Falling back to dead-letter-strategy at-most-once for {self.resource} "
                "because configured dead-letter-strategy at-least-once is incompatible with "
                f"effective overflow strategy {self.overflow}. To enable dead-letter-strategy "
                "at-least-once, set overflow strategy to reject-publish.")
            strategy = "at-most-once"
        self.dead_letter_strategy = str(strategy)
        self._policy_consumer_timeout = definition.get("consumer-timeout")
        self.delayed_retry = resolve(self.arguments, definition)

    def consumer_timeout(self, arguments: dict[str, Any] | None) -> int | None:
        """RabbitMQ 4.3's: the consumer's `x-consumer-timeout`, else the lower of the queue's
        argument and the policy's `consumer-timeout`, else 30 minutes."""
        own = _ms(arguments.get("x-consumer-timeout")) if arguments is not None else None
        if own is not None:
            return own
        values = [v for v in (_ms(self.arguments.get("x-consumer-timeout")),
                              _ms(self._policy_consumer_timeout)) if v is not None]
        return min(values) if values else DEFAULT_CONSUMER_TIMEOUT_MS

    @property
    def at_least_once(self) -> bool:
        return self.dlx is not None and self.dead_letter_strategy == "at-least-once"

    # -- the replication's answers (a cluster's member: docs/QUORUM-QUEUES.md) -----------------

    def took_role(self) -> None:
        """A new leader's state is its log's, read again (what it inherited included); a
        replica keeps none: the leader serves its node's clients."""
        role = self.replication.role
        if role == "leader":
            self._drop_state()
            self._recover()
            self.dispatch()
        elif role == "replica":
            self._drop_state()
        if (self.waiting or self.held) and role:
            self._resume_later(0)

    # -- a replica's log ----------------------------------------------------------------------

    def dispatch(self, now: int | None = None) -> None:
        if self.replication.role == "replica":  # the commit point moved
            if self._follow_timer is None and not self.deleted:
                self._follow_timer = self.vhost.scheduler.call_later(FOLLOW_MS, self._follow)
            return
        super().dispatch(now)

    def _follow(self) -> None:
        """A replica applies the leader's settlements as far as they are committed and
        deletes its log's head as the leader does, so that disk use follows the live
        messages on every member."""
        self._follow_timer = None
        bound = self.replication.commit_bound
        if self.deleted or self.replication.role != "replica" or bound is None:
            return
        settled = self.settled_offsets
        try:
            reader = self.log.reader(
                OffsetSpec.offset(max(self._followed, self.log.first_offset)),
                chunk_types=(ACKS, DELIVERED, RETURNS, DEAD_LETTERS))
        except StorageError:
            return
        try:
            for chunk in reader:
                if chunk.next_offset - 1 > bound:
                    break
                settled.add_range(chunk.first_offset, chunk.next_offset)
                if chunk.chunk_type == ACKS:
                    for record in chunk.records:
                        for start, end in _parse_ranges(record):
                            settled.add_range(start, end)
                self._followed = chunk.next_offset
        finally:
            reader.close()
        self._truncate()

    def _drop_state(self) -> None:
        self.taken_ids = TakenIds()  # a leader's recovery reads them back from the log
        for consumer in list(self.consumers):
            consumer.sink.server_cancel(consumer)
        self.consumers.clear()
        if self._resume_timer is not None:
            self._resume_timer.cancel()
            self._resume_timer = None
        for _last, sends in self._unsent:
            self._unsend_all(sends)
        self._unsent.clear()
        self._unsent_gone.clear()
        self._unsend_all(self.writer.batch.sends)
        self.writer.batch.sends = []
        self.messages = self.make_store()
        self.settled_offsets = IntervalSet()
        self.delivered_offsets = IntervalSet()
        self.recovered_counts = {}
        self.uncommitted.clear()  # (a deposed leader's: their publishes were nack'ed)
        self.held_offsets = IntervalSet()
        self._drop_retrying()
        self.dead_letters.clear()
        self._dead_letters_sent.clear()
        self.dead_letters_bytes = 0
        self.unacked = 0
        self.ledger = None  # a replica writes no snapshot; a leader's recovery makes it anew
        self.floor = self._followed = self.log.first_offset

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        leader = self.replication.forward_to
        if self.held or (leader is not None and not leader.reachable()):
            # the leader is lost and the next one not known yet (an election): the publish
            # waits for it, as RabbitMQ's does, rather than be nack'ed
            if confirm is not None:
                confirm.defer()
            self.held.append((message, confirm, self.vhost.scheduler.now_ms()))
            self._resume_later(RESUME_RETRY_MS)
            return True
        if leader is not None:  # a replica: the leader writes, and confirms
            return bool(leader.publish(message, confirm))
        return self._enqueue(message, confirm)

    def _enqueue(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        """The leader takes a message: written now, ready for consumers once committed
        (`committed_moved`), as RabbitMQ's quorum queue applies only what a quorum holds."""
        if self.dedup is not None and self.dedup.seen(message.headers):
            return False
        if self.overflow != "drop-head" and self._would_overflow(message):
            if confirm is not None:
                confirm.reject()
            return True  # routed all the same: no basic.return, the nack tells
        if MARK in message.header:  # a delayed exchange's copy (delayed_ids.py), taken
            kept = self.delayed_copy(message)
            if kept is None:
                return True  # taken already: a delayed exchange's new leader routed it again
            message = kept
        self._seq += 1
        entry = QueuedMessage(message, self._seq, self._expires_at(message),
                              self.priority_of(message))
        self.stats_published += 1
        self.uncommitted.append(entry)
        self.accept(entry, confirm)
        return True

    def takes_run(self) -> bool:
        """Whether `publish_many` may take a run of plain messages (no headers, expiration
        or user id) now: when each would go straight to `_enqueue` and be taken there, with
        no deduplication and no reject-publish limit to look at message by message."""
        return (not self.held and self.replication.forward_to is None and self.dedup is None
                and self.overflow != "reject-publish")

    def publish_many(self, messages: list[InboundMessage],
                     confirms: list[Confirm] | None) -> None:
        """`_enqueue` for each of a run of plain messages (`takes_run` said yes), in one go:
        the same entries, seqs, expiries and priorities, in the same order, into this turn's
        batch, each confirm settled with it."""
        ttl = self.ttl_ms
        now_ms = self.vhost.scheduler.now_ms
        priority_of = self.priority_of
        uncommitted = self.uncommitted
        writer = self.writer
        entries = writer.batch.entries
        seq = self._seq
        for message in messages:
            seq += 1
            entry = QueuedMessage(message, seq, None if ttl is None else now_ms() + ttl,
                                  priority_of(message))
            entry.store_ref = PENDING
            uncommitted.append(entry)
            entries.append(entry)
        self._seq = seq
        self.stats_published += len(messages)
        if confirms is not None:
            for confirm in confirms:
                confirm.defer()
            writer.confirms += confirms
        writer.schedule()

    def committed_moved(self) -> None:
        """What the commit point now covers becomes ready, in order, and is delivered; the
        deliveries whose records it covers are sent."""
        self._send_recorded(self.writer.committer.committed)
        uncommitted = self.uncommitted
        if not uncommitted:
            return
        committed = self.writer.committer.committed
        ready: list[QueuedMessage] = []
        while uncommitted:
            ref = uncommitted[0].store_ref
            if ref is None:  # its write failed: nack'ed, never stored
                uncommitted.popleft()
                continue
            if not isinstance(ref, int) or ref > committed:
                break
            ready.append(uncommitted.popleft())
        if not ready:
            return
        now = self.vhost.scheduler.now_ms()
        taken = self._deliver_ready(ready, now)
        push = self.messages.push
        for entry in ready[taken:]:
            push(entry)
        self.dispatch(now)
        self._drop_over_limit()
        self._expire_head(now)

    def _deliver_ready(self, ready: list[QueuedMessage], now: int) -> int:
        """Newly committed messages that nothing waits before (no ready message, and all of
        them at one priority, so that they would leave the store in this order) go straight
        to the consumers, as `dispatch` would hand them out after pushing them: one
        consumer at a time, expired ones dead-lettered on the way. How many were taken."""
        if (not self.consumers or self._dispatching or len(self.messages)
                or self.replication.role == "replica"):
            return 0
        priority = ready[0].priority
        for entry in ready:
            if entry.priority != priority:
                return 0
        count = len(ready)
        taken = 0
        self._dispatching = True
        try:
            while taken < count:
                consumer = self._next_consumer()
                if consumer is None:
                    break
                entry = ready[taken]
                taken += 1
                while entry.expires_at is not None and entry.expires_at <= now:
                    self.discard(entry, "expired")
                    if taken == count:
                        return taken
                    entry = ready[taken]
                    taken += 1
                self.deliver_to(consumer, entry)
        finally:
            self._dispatching = False
        return taken

    def _release_held(self) -> None:
        """Publishes that waited for a leader go to it, in order (or are nack'ed once they
        have waited HOLD_MS)."""
        held, self.held = self.held, []
        now = self.vhost.scheduler.now_ms()
        for index, (message, confirm, since) in enumerate(held):
            leader = self.replication.forward_to
            if leader is not None and not leader.reachable():
                if now - since < HOLD_MS:
                    self.held = held[index:]
                    self._resume_later(RESUME_RETRY_MS)
                    return
                if confirm is not None:
                    confirm.settle(False)
                continue
            if leader is not None:
                leader.publish(message, confirm)
            else:
                self._enqueue(message, confirm)
            if confirm is not None:
                confirm.settle()  # this queue's own hold on it

    # -- consumers served by the leader, across a failover ------------------------------------

    def consume(self, consumer: Consumer, client: QueueClient, nowait: bool) -> None:
        leader = self.replication.forward_to
        if leader is None:
            super().consume(consumer, client, nowait)
            return
        if not leader.reachable():  # an election: it waits for the next leader
            client.consume_started(consumer, nowait)
            self.consumer_lost(consumer)
            return
        self.elsewhere[consumer] = leader
        leader.consume(consumer, client, nowait)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.waiting:
            self.waiting.remove(consumer)
            return
        leader = self.elsewhere.pop(consumer, None)
        if leader is not None:
            leader.remove_consumer(consumer)
            return
        if self._unsent_count:
            self._unsent_gone.add(consumer)  # what waits for it is not sent (_send_recorded)
        super().remove_consumer(consumer)

    def consumer_lost(self, consumer: Consumer) -> bool:
        """The leader that served this node's consumer is gone: it waits for the next one
        (its client sees nothing; what it had unacked comes back redelivered)."""
        if self.deleted:
            return False
        self.elsewhere.pop(consumer, None)
        if consumer not in self.waiting:
            self.waiting.append(consumer)
        self._resume_later(RESUME_RETRY_MS)
        return True

    def _resume_later(self, delay_ms: int) -> None:
        if self._resume_timer is None and not self.deleted:
            self._resume_timer = self.vhost.scheduler.call_later(delay_ms, self._resume)

    def _resume(self) -> None:
        """Subscribe the waiting consumers where the queue is led now: here, or through the
        leader's queue (which calls consumer_lost again if it cannot take them yet)."""
        self._resume_timer = None
        if self.deleted or not (self.waiting or self.held):
            return
        role = self.replication.role
        leader = self.replication.forward_to
        if (role == "replica" and leader is None) or (role == "" and self.replication.members):
            self._resume_later(RESUME_RETRY_MS)  # between two roles
            return
        if self.held:
            self._release_held()
        waiting, self.waiting = self.waiting, []
        for consumer in waiting:
            consumer.state = None
            if leader is None:
                self.add_consumer(consumer)
            else:
                self.elsewhere[consumer] = leader
                leader.resume(consumer)

    def awaiting_leader(self) -> bool:
        leader = self.replication.forward_to
        if leader is not None:
            return not leader.reachable()
        role = self.replication.role
        return role == "replica" or (role == "" and bool(self.replication.members))

    def forward(self, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> bool:
        leader = self.replication.forward_to
        return leader is not None and bool(leader.forward(client, method, answer))

    def forward_delete(self, client: QueueClient, method: QueueMethod,
                       answer: Callable[[QueueMethod], None]) -> bool:
        leader = self.replication.forward_to
        return leader is not None and bool(leader.forward_delete(client, method, answer))

    # -- the length limits -------------------------------------------------------------------

    def _would_overflow(self, message: InboundMessage) -> bool:
        """reject-publish: refused only once the queue is over its limit (so it takes one
        more than the limit first, as rabbit_fifo does)."""
        return self.rejecting

    def accept(self, entry: QueuedMessage, confirm: Confirm | None) -> None:
        super().accept(entry, confirm)
        if self.overflow == "reject-publish" and not self.rejecting:
            count, size = self._held_length()
            self.rejecting = (
                (self.max_length is not None and count > self.max_length)
                or (self.max_length_bytes is not None and size > self.max_length_bytes))

    def settled(self, entry: QueuedMessage) -> None:
        super().settled(entry)
        if self.rejecting:
            self._check_rejecting()

    def settled_many(self, entries: list[QueuedMessage]) -> None:
        """Once for them all: settling an acked delivery leaves the lengths the limits count
        as they were, so each one's check would find the same."""
        super().settled_many(entries)
        if self.rejecting:
            self._check_rejecting()

    def _check_rejecting(self) -> None:
        """reject-publish: publishes are taken again once the queue is back at 80%."""
        count, size = self._held_length()
        self.rejecting = not (
            (self.max_length is None or count <= self.max_length * 0.8)
            and (self.max_length_bytes is None or size <= self.max_length_bytes * 0.8))

    def _held_length(self) -> tuple[int, int]:
        """What the length limits count: the ready messages and the dead letters held."""
        messages = self.messages
        return (len(messages) + len(self.uncommitted) + len(self.dead_letters)
                + len(self.retrying),
                messages.bytes + self.dead_letters_bytes + self.retrying_bytes)

    # -- consuming ----------------------------------------------------------------------------

    def check_consume(self, exclusive: bool) -> None:
        """RabbitMQ does not enforce exclusive consumers on a quorum queue."""

    def _next_consumer(self) -> Consumer | None:
        """With single active consumer, the consumer with the highest x-priority (the
        first of them to attach) is active; one of a lower priority keeps its place until it
        has settled what it holds, and takes nothing new meanwhile (RabbitMQ 4.3)."""
        consumers = self.consumers
        if self._unsent_count >= UNSENT_MAX:
            return None  # until the records of those waiting are written
        if not self.single_active or not consumers:
            return super()._next_consumer()
        active = consumers[0]
        best = max(consumers, key=lambda c: c.priority)
        if best.priority > active.priority:
            if active.unacked:
                return None  # quiescing
            consumers.remove(best)
            consumers.insert(0, best)
            active = best
        return active if active.sink.can_send(active) else None

    def serve_get(self, client: QueueClient, no_ack: bool) -> None:
        leader = self.replication.forward_to
        if leader is not None:
            leader.serve_get(client, no_ack)
            return
        if self.single_active:
            raise ResourceLocked(
                f"cannot obtain access to locked {self.resource}. basic.get operations are "
                "not supported by quorum queues with single active consumer")
        super().serve_get(client, no_ack)

    def validate_consumer(self, tag: str, no_ack: bool, prefetch: int, global_prefetch: int,
                          arguments: dict[str, Any]) -> None:
        super().validate_consumer(tag, no_ack, prefetch, global_prefetch, arguments)
        if global_prefetch:
            raise NotImplementedFeature(f"{self.resource} does not support global qos")

    def deliver_to(self, consumer: Any, entry: QueuedMessage) -> None:
        """Every delivery is recorded first (a DELIVERED record), and sent once the record is
        where a confirmed message is: written on one node, committed by a majority of the
        members in a cluster. So a restart or a new leader knows each message that any
        consumer was sent, and how often: what comes back is flagged `redelivered` and counted,
        never delivered again as new. Meanwhile the consumer's prefetch counts the delivery."""
        entry.acquired += 1
        self._mark_delivered(entry)
        consumer.unacked += 1  # until sent; then the channel counts it
        self.writer.batch.sends.append((consumer, entry))
        self._unsent_count += 1

    def _send_recorded(self, up_to: int) -> None:
        """Send the deliveries whose records the log holds up to `up_to` (see deliver_to);
        one whose consumer went meanwhile was never sent: it is ready again, at its place."""
        unsent = self._unsent
        if not unsent or unsent[0][0] > up_to:
            return
        was_full = self._unsent_count >= UNSENT_MAX
        gone = self._unsent_gone
        send = ClassicQueue.deliver_to
        back = False
        sends_from: list[list[tuple[Consumer, QueuedMessage]]] = []
        while unsent and unsent[0][0] <= up_to:
            _last, sends = unsent.popleft()
            sends_from.append(sends)
            self._unsent_count -= len(sends)
            if not gone:
                self._send_runs(sends)
                continue
            for consumer, entry in sends:
                consumer.unacked -= 1
                if consumer in gone:
                    entry.acquired -= 1
                    self.messages.requeue(entry)
                    back = True
                else:
                    send(self, consumer, entry)
        if not self._unsent_count:
            gone.clear()
        if not self.replication.local:
            self._write_at_once(sends_from)
        if back or was_full:
            self.vhost.scheduler.call_soon(self.dispatch)

    @staticmethod
    def _write_at_once(sends_from: list[list[tuple[Consumer, QueuedMessage]]]) -> None:
        """In a cluster, the deliveries just sent go to their connections' transports in the
        callback that committed their records (after the stall watch's look: a leader whose
        process was stopped may have been deposed meanwhile), not at the end of the loop's
        turn: a stop (SIGSTOP) that fell between the two would write them on waking, after the
        new leader had redelivered them, flagged, to other consumers (issue 28)."""
        flushed: set[int] = set()
        for sends in sends_from:
            for consumer, _entry in sends:
                sink = consumer.sink
                if id(sink) not in flushed:
                    flushed.add(id(sink))
                    flush = getattr(sink, "flush", None)
                    if flush is not None:
                        flush()

    def _send_runs(self, sends: list[tuple[Consumer, QueuedMessage]]) -> None:
        """`ClassicQueue.deliver_to` for each of `sends`, in order, with each run of them to
        one consumer with acks whose sink takes a run (`send_many`) handed over at once."""
        send = ClassicQueue.deliver_to
        count = len(sends)
        i = 0
        while i < count:
            consumer, entry = sends[i]
            send_many = None if consumer.no_ack else getattr(consumer.sink, "send_many", None)
            if send_many is None:
                consumer.unacked -= 1
                send(self, consumer, entry)
                i += 1
                continue
            j = i + 1
            while j < count and sends[j][0] is consumer:
                j += 1
            run = [entry for _consumer, entry in sends[i:j]]
            consumer.unacked -= len(run)
            self.stats_delivered += len(run)
            self.unacked += len(run)
            send_many(consumer, run, self)
            i = j

    def _unsend_all(self, sends: list[tuple[Consumer, QueuedMessage]]) -> None:
        """A deposed leader's or a deleted queue's deliveries not sent: forgotten (the log,
        read again by whoever leads, has their messages)."""
        for consumer, _entry in sends:
            consumer.unacked -= 1
        self._unsent_count -= len(sends)

    def get(self, no_ack: bool) -> QueuedMessage | None:
        if self.replication.role == "replica":
            return None  # the leader's to serve
        entry = super().get(no_ack)
        if entry is not None:
            entry.acquired += 1
        return entry

    # -- returns and the delivery limit -------------------------------------------------------

    def requeue(self, entries: list[QueuedMessage], delivery_failed: bool = True) -> None:
        """Returned deliveries: counted (and recorded), then back at their places, or past
        the delivery limit dead-lettered (reason delivery_limit) or dropped."""
        if self.deleted:
            return
        back: list[QueuedMessage] = []
        retry = self.delayed_retry
        delays = retry is not None and retry.delays(delivery_failed)
        now = self.vhost.scheduler.now_ms()
        for entry in entries:
            if delivery_failed:
                entry.delivery_count += 1
            limit = self.delivery_limit
            if limit is not None and entry.delivery_count > limit:
                self.unacked -= 1
                self.stats_delivery_limit += 1
                self.discard(entry, "delivery_limit")
                continue
            stamp(entry)
            ready_at = (retry.ready_at(now, entry.delivery_count)
                        if delays and retry is not None else 0)
            batch = self.writer.batch
            batch.returned.append((entry, entry.delivery_count, entry.acquired, ready_at))
            batch.returned_ids.add(id(entry))
            if ready_at:
                self.unacked -= 1
                entry.redelivered = True
                self._retry_later(entry, ready_at)
            else:
                back.append(entry)
        self.writer.schedule()
        super().requeue(back)

    # -- delayed retry ------------------------------------------------------------------------

    def _retry_later(self, entry: QueuedMessage, ready_at: int) -> None:
        """A returned message waits until `ready_at` (delayed retry) before it is ready."""
        heapq.heappush(self.retrying, (ready_at, entry.seq, entry))
        self.retrying_bytes += len(entry.message.body)
        if self.retrying[0][2] is entry:
            self._arm_retry()

    def _arm_retry(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self.retrying and not self.deleted:
            wait = max(0, self.retrying[0][0] - self.vhost.scheduler.now_ms())
            self._retry_timer = self.vhost.scheduler.call_later(wait, self._retry_due)

    def _retry_due(self) -> None:
        """What is due is ready again, first in the queue, as returned messages are."""
        self._retry_timer = None
        now = self.vhost.scheduler.now_ms()
        retrying = self.retrying
        moved = False
        while retrying and retrying[0][0] <= now:
            _at, _seq, entry = heapq.heappop(retrying)
            self.retrying_bytes -= len(entry.message.body)
            self.messages.requeue(entry)
            moved = True
        self._arm_retry()
        if moved:
            self._drop_over_limit()
            self.dispatch(now)

    def _drop_retrying(self) -> list[QueuedMessage]:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        entries = [entry for _at, _seq, entry in self.retrying]
        self.retrying = []
        self.retrying_bytes = 0
        return entries

    def _mark_delivered(self, entry: QueuedMessage) -> None:
        """Every delivery (and basic.get) is recorded, a redelivery too, so that a new
        leader or a restart knows what was checked out (redelivered with the flag set and
        counted); one before its write (this turn's publish) once it has an offset."""
        ref = entry.store_ref
        batch = self.writer.batch
        if ref is PENDING:
            batch.delivered_early.append(entry)
        elif isinstance(ref, int):
            batch.delivered.add(ref)
            if id(entry) in batch.returned_ids:
                batch.out_again.append(entry)  # its record must follow the return's
        self.writer.schedule()

    def _write(self, batch: _Batch) -> None:
        """The durable queue's write, then this turn's records of the quorum queue's own:
        deliveries made before their write, the counts of returned messages, and the dead
        letters held (each needs its message's offset, known once it is written)."""
        if self.replication.role == "replica":
            self._unsend_all(batch.sends)
            return  # a deposed leader's late settlements: the log is the leader's now
        super()._write(batch)
        early = IntervalSet()
        for entry in batch.delivered_early:
            if isinstance(entry.store_ref, int):
                early.add(entry.store_ref)
        if early.range_count:
            self._append_settled([_ranges(early)], DELIVERED)
        records = [_COUNTS_AT.pack(e.store_ref, delivery_count, acquired, ready_at)
                   if ready_at else _COUNTS.pack(e.store_ref, delivery_count, acquired)
                   for e, delivery_count, acquired, ready_at in batch.returned
                   if isinstance(e.store_ref, int)]
        if records:
            self._append_settled(records, RETURNS)
        again = IntervalSet()  # returned, then delivered again in this batch: out, after all
        for entry in batch.out_again:
            if isinstance(entry.store_ref, int):
                again.add(entry.store_ref)
        if again.range_count:
            self._append_settled([_ranges(again)], DELIVERED)
        dead = []
        for entry in batch.dead_lettered:
            if isinstance(entry.store_ref, int) and entry in self.dead_letters:
                ref = entry.store_ref
                if self.ledger is not None and ref not in self.held_offsets and (
                        ref not in self.settled_offsets):
                    self.ledger.gone(ref, *self._kind_of(entry))  # held: no longer ready
                self.held_offsets.add(ref)
                dead.append(_DEAD.pack(entry.store_ref,
                                       REASONS.index(self.dead_letters[entry])))
        if dead:
            self._append_settled(dead, DEAD_LETTERS)
        if batch.sends:
            last = self.log.next_offset - 1
            self._unsent.append((last, batch.sends))
            if self.replication.local:  # written is enough on one node: a crash keeps it
                self._send_recorded(last)

    def _append_settled(self, records: list[bytes], chunk_type: int) -> None:
        """A chunk of the queue's own records: its offsets are settled at once (they hold no
        message), so that the log's head can be deleted past them."""
        first = self.log.append(records, chunk_type=chunk_type)
        self.settled_offsets.add_range(first, first + len(records))

    def _recover(self) -> None:
        """The durable queue's recovery, with the counts of returned messages and the dead
        letters held. Read in log order with the deliveries, to tell which returned messages
        were delivered again after their last return (checked out when the log ended)."""
        self._recovered_reasons: dict[int, str] = {}
        self.recovered_counts.clear()
        self._checked_out_again = set()
        self._recovered_retry = {}
        self._recovered_at = self.vhost.scheduler.now_ms()
        super()._recover()
        settled = self.settled_offsets
        self.recovered_counts = {offset: counts for offset, counts
                                 in self.recovered_counts.items() if offset not in settled}

    def recovered_record(self, chunk_type: int, record: bytes) -> int | None:
        """The counts of a returned message (RETURNS), or a dead letter held (DEAD_LETTERS):
        few records, read in full at every restart (a snapshot leaves them to their chunks).
        A return whose delayed retry is not due yet holds its message until then (it cannot
        have been delivered again since)."""
        if chunk_type == RETURNS:
            offset, delivered, acquired, ready_at = _returned(bytes(record))
            self.recovered_counts[offset] = (delivered, acquired)
            self._checked_out_again.discard(offset)
            if ready_at > self._recovered_at:
                self._recovered_retry[offset] = ready_at
                self.held_offsets.add(offset)
                return int(offset)
            return None
        offset, reason = _DEAD.unpack(bytes(record))
        self.held_offsets.add(offset)
        self._recovered_reasons[offset] = REASONS[reason]
        return int(offset)

    def recovered_delivered(self, start: int, end: int) -> None:
        """Deliveries, in log order with the returns: a returned message delivered again
        after its last return was checked out when the log ended."""
        if self.recovered_counts:
            self._checked_out_again.update(_returned_in(self.recovered_counts, start, end))

    def snapshots_allowed(self) -> bool:
        """One node, or the leader: a replica keeps no queue state (docs/QUORUM-QUEUES.md)."""
        return self.replication.role in ("", "leader")

    def _unpack(self, offset: int, record: bytes, redelivered: bool) -> QueuedMessage:
        """A message read back from the log, with its counts: a message that was checked
        out when the log ended (its node or its leader went) was acquired once more than its
        last return says, or once if it never came back; its delivery count stays, as
        RabbitMQ counts a consumer lost with its node (not a failed delivery)."""
        entry = super()._unpack(offset, record, redelivered)
        counts = self.recovered_counts.pop(offset, None)
        if counts is not None:
            entry.delivery_count, entry.acquired = counts
            if offset in self._checked_out_again:
                self._checked_out_again.discard(offset)
                self._returned_by_recovery(entry)
            stamp(entry)
        elif redelivered:
            self._returned_by_recovery(entry)
            stamp(entry)
        return entry

    def _returned_by_recovery(self, entry: QueuedMessage) -> None:
        """A message checked out when the log ended is returned: one more acquisition; on one
        node (a restart: its consumers' channels are gone) a failed delivery too, as RabbitMQ
        4.3 counts a consumer that is down; after a failover not (its consumer's node was
        lost, or it lives on: RabbitMQ counts neither)."""
        entry.acquired += 1
        if self.replication.local:
            entry.delivery_count += 1

    # -- dead lettering ----------------------------------------------------------------------

    def discard(self, entry: QueuedMessage, reason: str) -> None:
        """A message leaves without delivery: its dead-lettered copy carries no counts of
        this queue's; at least once, it stays here until every target holds the copy."""
        headers = entry.message.headers
        if any(key in headers for key in COUNT_HEADERS):
            entry.message = entry.message.replace(headers={
                k: v for k, v in headers.items() if k not in COUNT_HEADERS})
        if not self.at_least_once or self.deleted or self.replication.role == "replica":
            super().discard(entry, reason)
            return
        self.dead_letters[entry] = reason
        self.dead_letters_bytes += len(entry.message.body)
        self.writer.batch.dead_lettered.append(entry)
        self.writer.schedule()
        self._send_dead_letter(entry)

    def recovered_held(self, entry: QueuedMessage) -> None:
        ready_at = self._recovered_retry.get(entry.store_ref, 0)
        if entry.store_ref not in self._recovered_reasons and ready_at:
            self._retry_later(entry, ready_at)  # a delayed retry, still waiting
            return
        reason = self._recovered_reasons.get(entry.store_ref, "rejected")
        self.dead_letters[entry] = reason
        self.dead_letters_bytes += len(entry.message.body)
        if self.replication.role != "replica":
            self._dead_letters_later(0)

    def _send_dead_letter(self, entry: QueuedMessage) -> None:
        reason = self.dead_letters.get(entry)
        if reason is None or entry in self._dead_letters_sent or self.deleted:
            return
        confirm = Confirm(0, lambda done: self._dead_letter_confirmed(entry, done))
        if not self.vhost.dead_letter(self, entry, reason, confirm):
            self._dead_letters_later(DEAD_LETTER_RETRY_MS)  # no route yet: try again
            return
        self._dead_letters_sent.add(entry)
        confirm.seal()

    def _dead_letter_confirmed(self, entry: QueuedMessage, confirm: Confirm) -> None:
        self._dead_letters_sent.discard(entry)
        if entry not in self.dead_letters or self.deleted:
            return
        if confirm.rejected:
            self._dead_letters_later(DEAD_LETTER_RETRY_MS)
            return
        del self.dead_letters[entry]
        self.dead_letters_bytes -= len(entry.message.body)
        self.settled(entry)

    def _dead_letters_later(self, delay_ms: int) -> None:
        if self._dead_letter_timer is None and not self.deleted:
            self._dead_letter_timer = self.vhost.scheduler.call_later(
                delay_ms, self._send_dead_letters)

    def _send_dead_letters(self) -> None:
        self._dead_letter_timer = None
        if self.replication.role == "replica":
            return
        for entry in list(self.dead_letters):
            self._send_dead_letter(entry)

    def purge(self) -> int:
        """The ready messages, and the dead letters held (RabbitMQ 4.3 purges those too)."""
        held = list(self.dead_letters)
        self.dead_letters.clear()
        self.dead_letters_bytes = 0
        for entry in held:
            self.settled(entry)
        coming = list(self.uncommitted)  # enqueued before the purge, not yet committed
        self.uncommitted.clear()
        waiting = self._drop_retrying()  # delayed retries (RabbitMQ 4.3 purges those)
        for entry in coming + waiting:
            self.settled(entry)
        return super().purge() + len(coming) + len(waiting)

    # -- deleting -----------------------------------------------------------------------------

    def on_delete(self) -> None:
        self._drop_retrying()
        for _last, sends in self._unsent:
            self._unsend_all(sends)
        self._unsent.clear()
        held, self.held = self.held, []
        for _message, confirm, _since in held:
            if confirm is not None:
                confirm.settle(False)  # the queue went before a leader took them
        super().on_delete()

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        for flag, wanted in (("if-unused", if_unused), ("if-empty", if_empty)):
            if wanted:
                raise NotImplementedFeature(
                    f"cannot delete {self.resource}. queue.delete operations with {flag} flag "
                    "set are not supported by quorum queues")
        super().check_delete(if_unused, if_empty)


def _returned(record: bytes) -> tuple[int, int, int, int]:
    """A RETURNS record: offset, delivery count, acquired count, ready at (0: at once)."""
    if len(record) == _COUNTS_AT.size:
        return _COUNTS_AT.unpack(record)
    return (*_COUNTS.unpack(record), 0)


def _returned_in(counts: dict[int, tuple[int, int]], start: int, end: int) -> list[int]:
    """The offsets in [start, end) that have counts (were returned), the cheaper way round."""
    if end - start <= len(counts):
        return [offset for offset in range(start, end) if offset in counts]
    return [offset for offset in counts if start <= offset < end]


def stamp(entry: QueuedMessage) -> None:
    """The headers of a returned message's next delivery: how often it was tried."""
    headers = dict(entry.message.headers)
    if entry.delivery_count:
        headers["x-delivery-count"] = entry.delivery_count
    if entry.acquired:
        headers["x-acquired-count"] = entry.acquired
    entry.message = entry.message.replace(headers=headers)
