"""Quorum queues (`x-queue-type: quorum`): a durable queue whose every message and settlement
is a record in its log, replicated as a stream's log is (docs/QUORUM-QUEUES.md).

The queue is the durable classic queue's state machine over its log (durable.py): message
records, settled ranges, delivered ranges, and one more record kind of its own, the counts of
a returned message (`RETURNS`: its delivery count and acquired count), so that a restart or a
new leader knows how often each message was tried. What differs from a classic queue:

- every message is written and confirmed once the log's commit point covers it (the fsync
  policy on one node; a majority of the members in a cluster, through the replication port);
- strict priorities, 32 levels (0-31), a message without one at 4 (RabbitMQ 4.x): the default
  level is paged from the log, the others are kept in memory (store.py's LeveledStore);
- a returned message counts its failed deliveries (`x-delivery-count`: basic.reject and
  basic.nack with requeue) and its acquisitions (`x-acquired-count`: every return); past the
  delivery limit (default 20, a negative one disables it) it is dead-lettered with the reason
  `delivery_limit`, or dropped;
- global QoS and queue.delete's if-unused and if-empty are refused as RabbitMQ refuses them.

It must not know AMQP frames, the session or the cluster: it sees the replication port.
Single-threaded: runs on the event loop.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.model.durable import DurableClassicQueue, PagedStore, _Batch
from leveret.broker.model.errors import NotImplementedFeature
from leveret.broker.model.intervals import IntervalSet
from leveret.broker.model.message import Confirm, InboundMessage, QueuedMessage
from leveret.broker.model.queue import Queue, QueueOwner
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.store import LeveledStore, MessageStore
from leveret.storage import OffsetSpec

if TYPE_CHECKING:
    from leveret.broker.model.queue_client import QueueClient, QueueMethod

RETURNS = 18  # chunk type: the counts of returned messages
_COUNTS = struct.Struct(">QII")  # offset, delivery count, acquired count
DEFAULT_PRIORITY = 4  # a message without a priority (RabbitMQ 4.x)
TOP_PRIORITY = 31
DEFAULT_DELIVERY_LIMIT = 20


def delivery_limit(argument: object, policy: object) -> int | None:
    """The delivery limit from the queue argument and the policy's `delivery-limit` (the
    lower wins, as RabbitMQ's res_min); None: unlimited (a negative one disables it)."""
    values = [v for v in (argument, policy) if isinstance(v, int) and not isinstance(v, bool)]
    if not values:
        return DEFAULT_DELIVERY_LIMIT
    limit = min(values)
    return None if limit < 0 else limit


class QuorumQueue(DurableClassicQueue):
    type = "quorum"

    def __init__(self, vhost: QueueOwner, name: str, *, env: StorageEnv,
                 storage_id: str | None = None, replication: Replication = ONE_NODE,
                 **kwargs: Any) -> None:
        self.replication = replication
        self.recovered_counts: dict[int, tuple[int, int]] = {}  # offset: counts, until read
        self.delivery_limit: int | None = DEFAULT_DELIVERY_LIMIT
        self.stats_delivery_limit = 0  # messages dead-lettered or dropped at the limit
        super().__init__(vhost, name, env=env, storage_id=storage_id, replication=replication,
                         **kwargs)
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

    # -- the replication's answers (a cluster's member: docs/QUORUM-QUEUES.md) -----------------

    @property
    def role(self) -> str:
        """"" on one node (or not a member yet), "leader" or "replica"."""
        return self.replication.role

    @property
    def members(self) -> tuple[str, ...]:
        return self.replication.members

    @property
    def commit_bound(self) -> int | None:
        return self.replication.commit_bound

    @property
    def forward_to(self) -> Queue | None:
        """A replica's: the leader's queue, which serves everything but the log."""
        return self.replication.forward_to

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

    def _drop_state(self) -> None:
        for consumer in list(self.consumers):
            consumer.sink.server_cancel(consumer)
        self.consumers.clear()
        self.messages = self.make_store()
        self.settled_offsets = IntervalSet()
        self.delivered_offsets = IntervalSet()
        self.recovered_counts = {}
        self.unacked = 0
        self.floor = self.log.first_offset

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        leader = self.replication.forward_to
        if leader is not None:  # a replica: the leader writes, and confirms
            return bool(leader.publish(message, confirm))
        return super().publish(message, confirm)

    def consumer_queue(self, arguments: dict[str, Any]) -> Queue:
        leader = self.replication.forward_to
        return leader if leader is not None else self

    def serve_get(self, client: QueueClient, no_ack: bool) -> None:
        leader = self.replication.forward_to
        if leader is not None:
            leader.serve_get(client, no_ack)
        else:
            super().serve_get(client, no_ack)

    def forward(self, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> bool:
        leader = self.replication.forward_to
        return leader is not None and bool(leader.forward(client, method, answer))

    def forward_delete(self, client: QueueClient, method: QueueMethod,
                       answer: Callable[[QueueMethod], None]) -> bool:
        leader = self.replication.forward_to
        return leader is not None and bool(leader.forward_delete(client, method, answer))

    # -- consuming ----------------------------------------------------------------------------

    def validate_consumer(self, tag: str, no_ack: bool, prefetch: int, global_prefetch: int,
                          arguments: dict[str, Any]) -> None:
        super().validate_consumer(tag, no_ack, prefetch, global_prefetch, arguments)
        if global_prefetch:
            raise NotImplementedFeature(f"{self.resource} does not support global qos")

    def deliver_to(self, consumer: Any, entry: QueuedMessage) -> None:
        entry.acquired += 1
        super().deliver_to(consumer, entry)

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
            self.writer.batch.returned.append(entry)
            back.append(entry)
        self.writer.schedule()
        super().requeue(back)

    def _write(self, batch: _Batch) -> None:
        if self.replication.role == "replica":
            return  # a deposed leader's late settlements: the log is the leader's now
        super()._write(batch)
        records = [_COUNTS.pack(e.store_ref, e.delivery_count, e.acquired)
                   for e in batch.returned if isinstance(e.store_ref, int)]
        if records:
            offset = self.log.append(records, chunk_type=RETURNS)
            self.settled_offsets.add(offset)

    def _recover(self) -> None:
        if self.log.next_offset != self.log.first_offset:
            reader = self.log.reader(OffsetSpec.first(), chunk_types=(RETURNS,))
            for chunk in reader:
                self.settled_offsets.add(chunk.first_offset)
                for record in chunk.records:
                    offset, delivered, acquired = _COUNTS.unpack(bytes(record))
                    self.recovered_counts[offset] = (delivered, acquired)
            reader.close()
        super()._recover()
        settled = self.settled_offsets
        self.recovered_counts = {offset: counts for offset, counts
                                 in self.recovered_counts.items() if offset not in settled}

    def _unpack(self, offset: int, record: bytes, redelivered: bool) -> QueuedMessage:
        entry = super()._unpack(offset, record, redelivered)
        counts = self.recovered_counts.pop(offset, None)
        if counts is not None:
            entry.delivery_count, entry.acquired = counts
            stamp(entry)
        return entry

    # -- deleting -----------------------------------------------------------------------------

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        for flag, wanted in (("if-unused", if_unused), ("if-empty", if_empty)):
            if wanted:
                raise NotImplementedFeature(
                    f"cannot delete {self.resource}. queue.delete operations with {flag} flag "
                    "set are not supported by quorum queues")
        super().check_delete(if_unused, if_empty)


def stamp(entry: QueuedMessage) -> None:
    """The headers of a returned message's next delivery: how often it was tried."""
    headers = dict(entry.message.headers)
    if entry.delivery_count:
        headers["x-delivery-count"] = entry.delivery_count
    if entry.acquired:
        headers["x-acquired-count"] = entry.acquired
    entry.message = entry.message.replace(headers=headers)
