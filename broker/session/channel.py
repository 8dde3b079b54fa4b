"""One AMQP channel: methods in, model calls, deliveries and confirms out.

The channel keeps what RabbitMQ keeps per channel: the last declared queue, its consumers,
the unacked deliveries (by delivery tag), QoS, the confirm sequence and the transaction
buffer. It is the ConsumerSink through which queues deliver, and the QueueClient through
which they answer basic.consume and basic.get. Domain errors raised by the model leave through
`errors.to_amqp`; the wire layer closes the channel or the connection.

It reaches a queue only through the queue-type interface (broker/model/queue_type.py) and must
not know which type of queue it holds, nor which node holds it.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands as m
from pamqp.base import Frame

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.content import Message, content_frames, deliver_parts
from leveret.amqp.errors import AMQPError
from leveret.amqp.stored import deliver_batch, deliver_names
from leveret.broker.model import args as qargs
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.errors import (
    AccessRefused,
    BrokerError,
    NotAllowed,
    NotFound,
    NotImplementedFeature,
    PreconditionFailed,
)
from leveret.broker.model.message import Confirm, QueuedMessage
from leveret.broker.model.vhost import server_generated_name
from leveret.broker.session import backlog, queries, topology
from leveret.broker.session.confirms import Confirms
from leveret.broker.session.consumer_timeouts import TIMED_OUT, ConsumerTimeouts
from leveret.broker.session.errors import to_amqp
from leveret.broker.session.unacked import Unacked

if TYPE_CHECKING:
    from leveret.amqp.connection import WireConnection
    from leveret.broker.model.exchange import Exchange
    from leveret.broker.model.queue_client import Closeable
    from leveret.broker.model.vhost import VHost
    from leveret.broker.session.backlog import Backlog

FLAG_EXPIRATION = 1 << 8
FLAG_USER_ID = 1 << 4
# A message with none of these properties has nothing to check and routes by its routing key
# alone (no CC or BCC headers, nothing for a headers exchange or a deduplication to read).
NOT_PLAIN = FLAG_EXPIRATION | FLAG_USER_ID | (1 << 13)  # 1 << 13: the headers property
# what a delivery's frames add to its message's bytes, near enough for the session's
# flush-early mark
FRAMING_BYTES = 100


class Session(topology.Session, Protocol):
    """What a channel needs of its connection (`connection.Session`): a Protocol, so that
    this module does not import the connection, which imports it."""

    @property
    def vhost(self) -> VHost: ...

    @property
    def channels(self) -> Mapping[int, Channel]: ...

    @property
    def wire(self) -> WireConnection: ...

    @property
    def writable(self) -> bool: ...

    @property
    def frame_max(self) -> int: ...

    @property
    def capabilities(self) -> Mapping[str, object]: ...

    @property
    def username(self) -> str: ...

    @property
    def limited_permissions(self) -> bool: ...

    def write_many(self, parts: list[bytes | memoryview], size: int = -1) -> None: ...

    def after_turn(self, callback: Callable[[], None]) -> None: ...

    def flush_now(self) -> None: ...

    def check_permission(self, kind: str, resource_kind: str, name: str) -> None: ...


class Channel:
    # message statistics (broker/management/rates.py samples them): plain counters, bumped
    # once per publish, per ack frame, or on the rare paths (get, no-ack, redelivered, returned);
    # deliveries are not counted: every one takes a delivery tag, so there were next_tag - 1
    stats_publish = 0
    stats_ack = 0
    stats_get = 0
    stats_get_no_ack = 0
    stats_deliver_no_ack = 0
    stats_redeliver = 0
    stats_return_unroutable = 0
    stats_unroutable_dropped = 0
    enforces_timeouts = True  # a queue's consumer timeout (a tunnel's channel leaves it to
    # the node of the consumer's client)

    def __init__(self, session: Session, number: int) -> None:
        self.session = session
        self.number = number
        self.vhost = session.vhost
        self.last_queue: str | None = None
        self.consumers: dict[str, Consumer] = {}
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        self.next_tag = 1
        self.consumer_prefetch = 0
        self.global_prefetch = 0
        self.confirms: Confirms | None = None  # set by confirm.select
        self.tx: list[Any] | None = None
        self.get_unacked = 0  # basic.get deliveries in `unacked`: global QoS ignores them
        self.tx_held = 0  # consumer deliveries settled in the open transaction, not yet committed
        self.closed = False
        self.timeouts: ConsumerTimeouts | None = None  # made when a queue sets one
        self.released: set[int] = set()  # tags a consumer timeout gave back: acks are dropped
        self.backlog: Backlog | None = None  # a step this channel waits for, in cluster mode
        # its channels on the nodes that hold queues it used (broker/remote/forwarding.py)
        self.remote: Closeable | None = None
        self._handlers: dict[type[Frame], Callable[[Any], None]] = {
            **{kind: functools.partial(handler, self)
               for kind, handler in topology.HANDLERS.items()},
            m.Channel.Flow: self._flow,
            m.Basic.Qos: self._qos,
            m.Basic.Consume: self._consume,
            m.Basic.Cancel: self._cancel,
            m.Basic.Get: self._get,
            m.Basic.Ack: lambda method: self.ack(method.delivery_tag, method.multiple),
            m.Basic.Reject: lambda method: self._settle(
                method.delivery_tag, False, method.requeue, "reject"
            ),
            m.Basic.Nack: lambda method: self._settle(
                method.delivery_tag, method.multiple, method.requeue, "nack"
            ),
            m.Basic.Recover: self._recover,
            m.Basic.RecoverAsync: self._recover,
            m.Confirm.Select: self._confirm_select,
            m.Tx.Select: self._tx_select,
            m.Tx.Commit: self._tx_commit,
            m.Tx.Rollback: self._tx_rollback,
        }

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, method: Frame) -> None:
        handler = self._handlers.get(type(method))
        if handler is None:
            raise AMQPError(
                c.COMMAND_INVALID, "unimplemented method", *divmod(method.index, 0x10000)
            )
        try:
            handler(method)
        except BrokerError as error:
            raise to_amqp(error) from None

    def reply(self, method: Frame) -> None:
        self.session.write(codec.encode_method(self.number, method))

    def check(self, kind: str, resource_kind: str, name: str) -> None:
        self.session.check_permission(kind, resource_kind, name)

    # -- channel ------------------------------------------------------------------------------

    def _flow(self, method: m.Channel.Flow) -> None:
        if not method.active:
            raise NotImplementedFeature("active=false")
        self.reply(m.Channel.FlowOk(active=True))

    # -- consuming ----------------------------------------------------------------------------

    def _qos(self, method: m.Basic.Qos) -> None:
        if method.prefetch_size:
            raise NotImplementedFeature(f"prefetch_size!=0 ({method.prefetch_size})")
        if method.global_:
            self.global_prefetch = method.prefetch_count
        else:
            self.consumer_prefetch = method.prefetch_count
        self.reply(m.Basic.QosOk())
        self.redispatch()

    def _consume(self, method: m.Basic.Consume) -> None:
        name = topology.queue_name(self, topology.strip_cr_lf(method.queue))
        self.check("read", "queue", name)
        queue = self.vhost.queue(name)
        self.vhost.check_exclusive(queue, self.session)
        tag = method.consumer_tag or server_generated_name("amq.ctag-")
        if tag in self.consumers:
            raise NotAllowed(f"attempt to reuse consumer tag '{tag}'")
        arguments = method.arguments or {}
        queue.validate_consumer(tag, method.no_ack, self.consumer_prefetch,
                                self.global_prefetch, arguments)
        queue.check_consume(method.exclusive)  # 403 in exclusive use: no consume-ok before it
        queue = queue.consumer_queue(arguments)
        priority = arguments.get("x-priority", 0)
        consumer = Consumer(
            tag, queue, self, no_ack=method.no_ack, exclusive=method.exclusive,
            prefetch=self.consumer_prefetch,
            priority=priority if isinstance(priority, int) and qargs.is_int(priority) else 0,
            arguments=arguments,
        )
        try:
            queue.consume(consumer, self, method.nowait)
        except BrokerError:
            self.consumers.pop(tag, None)
            raise
        timeout = queue.consumer_timeout(arguments)
        if timeout is not None and not method.no_ack and self.enforces_timeouts:
            self._timeouts().track_consumer(consumer, timeout)

    def _timeouts(self) -> ConsumerTimeouts:
        if self.timeouts is None:
            self.timeouts = ConsumerTimeouts(self)
        return self.timeouts

    def expire(self, consumer: Consumer | None, tags: list[int]) -> None:
        """A consumer timeout fired for these deliveries (consumer_timeouts.py): they go back
        to their queue and the consumer is cancelled, if the client understands basic.cancel;
        otherwise, or for a basic.get, the channel is closed (RabbitMQ 4.3)."""
        if (consumer is None or self.consumers.get(consumer.tag) is not consumer
                or not self.session.capabilities.get("consumer_cancel_notify")):
            self.session.wire.close_channel(self.number, to_amqp(
                PreconditionFailed(TIMED_OUT.format(self.number))))
            return
        del self.consumers[consumer.tag]
        consumer.queue.remove_consumer(consumer)  # first: what goes back is not for it
        if self.timeouts is not None:
            self.timeouts.forget_consumer(consumer)
        items = [self.unacked.pop(tag) for tag in tags if tag in self.unacked]
        self.released.update(tags)
        self._reject(items, requeue=True, delivery_failed=False)
        self.notify_cancel(consumer)

    def _cancel(self, method: m.Basic.Cancel) -> None:
        consumer = self.consumers.pop(method.consumer_tag or "", None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
            if self.timeouts is not None:
                self.timeouts.forget_consumer(consumer)
        if not method.nowait:
            self.reply(m.Basic.CancelOk(consumer_tag=method.consumer_tag))

    def _get(self, method: m.Basic.Get) -> None:
        name = topology.queue_name(self, topology.strip_cr_lf(method.queue))
        if queries.is_query(name):
            answer = queries.answer(self.vhost, name, self.check)
            if answer is None:
                self.reply(m.Basic.GetEmpty())
            else:
                entry = QueuedMessage(answer, 0)
                self.get_ok(entry, queries.ANSWERED, method.no_ack, 0)
            return
        self.check("read", "queue", name)
        queue = self.vhost.queue(name)
        self.vhost.check_exclusive(queue, self.session)
        queue.serve_get(self, method.no_ack)

    # -- the QueueClient interface: how a queue answers basic.consume and basic.get -----------

    def consume_started(self, consumer: Consumer, nowait: bool) -> None:
        if not nowait:
            self.reply(m.Basic.ConsumeOk(consumer_tag=consumer.tag))
        self.consumers[consumer.tag] = consumer

    def get_empty(self) -> None:
        self.reply(m.Basic.GetEmpty())

    def wait_for(self, index: int, step: Coroutine[Any, Any, None]) -> None:
        backlog.run_step(self, index, step)

    def get_ok(self, entry: QueuedMessage, queue: Any, no_ack: bool, remaining: int) -> None:
        tag = self.next_tag
        self.next_tag += 1
        if not no_ack:
            self.unacked[tag] = Unacked(entry, queue, None)
            self.get_unacked += 1
            self.stats_get += 1
            timeout = queue.consumer_timeout(None)
            if timeout is not None and self.enforces_timeouts:
                self._timeouts().track_get(tag, timeout)
        else:
            self.stats_get_no_ack += 1
        if entry.redelivered:
            self.stats_redeliver += 1
        message = entry.message
        session = self.session
        session.write(
            codec.encode_get_ok(
                self.number,
                tag,
                entry.redelivered,
                codec.short_str(message.exchange),
                codec.short_str(message.routing_key),
                remaining,
            )
        )
        session.write_many(
            content_frames(self.number, message.header, message.body, session.frame_max)
        )

    # -- the ConsumerSink interface -----------------------------------------------------------

    def can_send(self, consumer: Consumer) -> bool:
        if not self.session.writable or self.closed:
            return False
        if consumer.no_ack:
            return True
        if consumer.prefetch and consumer.unacked >= consumer.prefetch:
            return False
        return not self.global_prefetch or self._limited_unacked() < self.global_prefetch

    def _limited_unacked(self) -> int:
        """What RabbitMQ's channel limiter counts for global QoS: unacked consumer deliveries,
        including those acked in an uncommitted transaction, but not basic.get ones."""
        return len(self.unacked) - self.get_unacked + self.tx_held

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: Any) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        if not consumer.no_ack:
            self.unacked[tag] = Unacked(entry, queue, consumer)
            consumer.unacked += 1
        else:
            self.stats_deliver_no_ack += 1
            queue.stats_deliver_no_ack += 1
        if entry.redelivered:
            self.stats_redeliver += 1
            queue.stats_redeliver += 1
        message = entry.message
        session = self.session
        body = message.body
        session.write_many(
            deliver_parts(self.number, consumer.tag_bytes, tag, entry.redelivered,
                          deliver_names(message.exchange, message.routing_key), message.header,
                          body, session.frame_max),
            len(body) + FRAMING_BYTES,
        )

    def send_many(self, consumer: Consumer, entries: list[QueuedMessage], queue: Any) -> None:
        """`send` for each of `entries` in order, to a consumer with acks (a quorum queue's
        deliveries of one write): the same tags and frames, written in one go."""
        tag = self.next_tag
        unacked = self.unacked
        session = self.session
        number, consumer_tag, frame_max = self.number, consumer.tag_bytes, session.frame_max
        parts: list[bytes | memoryview] = []
        size = 0
        # the last message's names, usually the next one's too (a run from one publisher)
        exchange: str | None = None
        routing_key: str | None = None
        names = b""
        for entry in entries:
            unacked[tag] = Unacked(entry, queue, consumer)
            redelivered = entry.redelivered
            if redelivered:
                self.stats_redeliver += 1
                queue.stats_redeliver += 1
            message = entry.message
            body = message.body
            if message.exchange is not exchange or message.routing_key is not routing_key:
                exchange, routing_key = message.exchange, message.routing_key
                names = deliver_names(message.exchange, message.routing_key)
            parts += deliver_parts(number, consumer_tag, tag, redelivered, names,
                                   message.header, body, frame_max)
            size += len(body) + FRAMING_BYTES
            tag += 1
        self.next_tag = tag
        consumer.unacked += len(entries)
        session.write_many(parts, size)

    def flush(self) -> None:
        """What was sent so far goes to the connection's transport now (QuorumQueue)."""
        self.session.flush_now()

    def credit(self, consumer: Consumer) -> int:
        """How many more deliveries this consumer may take now (streams)."""
        if not self.session.writable or self.closed:
            return 0
        return consumer.prefetch - consumer.unacked if consumer.prefetch else 1 << 30

    def send_records(
        self, consumer: Consumer, offsets: Sequence[int], records: Sequence[bytes]
    ) -> None:
        """Deliver stored stream records, each with its x-stream-offset header."""
        first = tag = self.next_tag
        self.next_tag = tag + len(records)
        unacked = self.unacked
        queue = consumer.queue
        for offset in offsets:
            unacked[tag] = Unacked(offset, queue, consumer)
            tag += 1
        consumer.unacked += len(records)
        out: list[Any] = []
        deliver_batch(self.number, consumer.tag_bytes, first, offsets, records,
                      self.session.frame_max, out)
        self.session.write_many(out, sum(map(len, records)) + FRAMING_BYTES * len(records))

    def server_cancel(self, consumer: Consumer) -> None:
        """The queue went away (or ended the consumer): forget it, and tell the client."""
        if self.consumers.pop(consumer.tag, None) is not None:
            self.notify_cancel(consumer)

    def notify_cancel(self, consumer: Consumer) -> None:
        """basic.cancel, nowait as RabbitMQ sends it, if the client understands it."""
        if not self.closed and self.session.capabilities.get("consumer_cancel_notify"):
            self.reply(m.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    def redispatch(self) -> None:
        """Credit or writability came back: let every consumed queue deliver again."""
        queues = {id(consumer.queue): consumer.queue for consumer in self.consumers.values()}
        for queue in queues.values():
            queue.dispatch()

    # -- settling -----------------------------------------------------------------------------

    def _take(self, tag: int, multiple: bool) -> list[tuple[int, Unacked]]:
        """Remove and return the deliveries an ack/nack/reject names, as RabbitMQ's
        collect_acks: `multiple` with tag 0 means all; otherwise the tag itself must be
        unacked (406 `unknown delivery tag` if not), and `multiple` adds every lower tag."""
        unacked = self.unacked
        if multiple and tag == 0:
            taken = list(unacked.items())
            unacked.clear()
        elif tag not in unacked:
            if tag in self.released:  # a consumer timeout gave it back already
                self.released.discard(tag)
                return []
            raise PreconditionFailed(f"unknown delivery tag {tag}")
        elif multiple:
            # Tags are held in ascending order, so those up to `tag` lead; when none of them was
            # settled alone they are `count` in a row, ending at `tag`, and leave in one sweep.
            count = tag - next(iter(unacked)) + 1
            if count == 1 or next(islice(unacked, count - 1, None), None) == tag:
                popitem = unacked.popitem
                taken = [popitem(False) for _ in range(count)]
            else:
                taken = []
                while unacked:
                    first = next(iter(unacked))
                    if first > tag:
                        break
                    taken.append((first, unacked.popitem(last=False)[1]))
        else:
            taken = [(tag, unacked.pop(tag))]
        if self.get_unacked:
            self.get_unacked -= sum(1 for _tag, item in taken if item.consumer is None)
        return taken

    def ack(self, tag: int, multiple: bool) -> None:
        taken = self._take(tag, multiple)
        self.stats_ack += len(taken)
        if self.tx is not None:
            self._hold(("ack", taken))
            return
        self._ack_items([item for _tag, item in taken])

    def _ack_items(self, items: list[Unacked]) -> None:
        """Settle acked deliveries: each run of one queue and one consumer as one ack_many."""
        queues: dict[int, Any] = {}
        queue: Any = None
        consumer: Consumer | None = None
        entries: list[Any] = []
        for item in items:
            if item.queue is not queue or item.consumer is not consumer:
                if entries:
                    self._ack_run(queue, entries, consumer)
                    entries = []
                queue, consumer = item.queue, item.consumer
                queues[id(queue)] = queue
            entries.append(item.entry)
        if entries:
            self._ack_run(queue, entries, consumer)
        for queue in queues.values():
            queue.dispatch()

    @staticmethod
    def _ack_run(queue: Any, entries: list[Any], consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked -= len(entries)
        queue.stats_ack += len(entries)
        queue.ack_many(entries, consumer)

    def _hold(self, work: tuple[Any, ...]) -> None:
        """An ack or nack inside a transaction: taken from `unacked` now (so a second one is
        406, as in RabbitMQ), applied at commit, put back at rollback."""
        assert self.tx is not None
        self.tx.append(work)
        self.tx_held += sum(1 for _tag, item in work[1] if item.consumer is not None)

    def _settle(self, tag: int, multiple: bool, requeue: bool, kind: str) -> None:
        """basic.reject or basic.nack. RabbitMQ 4.3 counts a reject as a failed delivery (a
        quorum queue's x-delivery-count), a nack not (#15387)."""
        taken = self._take(tag, multiple)
        failed = kind == "reject"
        if self.tx is not None:
            self._hold(("nack", taken, requeue, failed))
            return
        self._reject([item for _tag, item in taken], requeue, failed)

    def _reject(self, items: list[Unacked], requeue: bool, delivery_failed: bool) -> None:
        """basic.reject, basic.nack, basic.recover or a closed channel's return of its unacked
        deliveries; `delivery_failed` as RabbitMQ 4.3 counts them: a reject and a close are
        failed deliveries, a nack and a recover are not."""
        by_queue: dict[int, tuple[Any, list[object]]] = {}
        for item in items:
            if item.consumer is not None:
                item.consumer.unacked -= 1
            if requeue and item.queue.redelivers:
                by_queue.setdefault(id(item.queue), (item.queue, []))[1].append(item.entry)
            else:
                item.queue.reject(item.entry, item.consumer)
        for queue, entries in by_queue.values():
            queue.requeue(entries, delivery_failed)
        self.redispatch()

    def _recover(self, method: m.Basic.Recover | m.Basic.RecoverAsync) -> None:
        if not method.requeue:
            raise NotImplementedFeature("requeue=false")
        self.requeue_all()
        if isinstance(method, m.Basic.Recover):
            self.reply(m.Basic.RecoverOk())

    def requeue_all(self) -> None:
        items = list(self.unacked.values())
        self.unacked.clear()
        self.get_unacked = 0
        self._reject(items, requeue=True, delivery_failed=False)

    # -- publishing ---------------------------------------------------------------------------

    def publish(
        self,
        exchange_name: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        header: bytes,
        body: bytes,
    ) -> None:
        """Route one publish; an exchange this node does not know is looked up first
        (`topology.look_up_exchange`: in a cluster, it may have been declared through another
        node), and the publish is tried once more."""
        try:
            self._publish(exchange_name, routing_key, mandatory, immediate, header, body)
        except BrokerError as error:
            if isinstance(error, NotFound) and exchange_name not in self.vhost.exchanges:
                topology.look_up_exchange(self, exchange_name, functools.partial(
                    self.publish_looked_up, exchange_name, routing_key, mandatory, immediate,
                    header, body))
                return
            raise to_amqp(error) from None

    def publish_looked_up(self, exchange_name: str, routing_key: str, mandatory: bool,
                          immediate: bool, header: bytes, body: bytes) -> None:
        """`publish`, once its exchange was looked up: a miss now is a 404."""
        try:
            self._publish(exchange_name, routing_key, mandatory, immediate, header, body)
        except BrokerError as error:
            raise to_amqp(error) from None

    def _publish(
        self,
        exchange_name: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        header: bytes,
        body: bytes,
    ) -> None:
        exchange = self._publish_target(exchange_name, immediate)
        self._publish_one(exchange, exchange_name, routing_key, mandatory, header, body)

    def publish_run(self, exchange_name: str, routing_key: str, mandatory: bool,
                    immediate: bool, run: list[Any]) -> None:
        """`publish` for each `run[2::2]` header and `run[3::2]` body, with the checks that
        depend only on the exchange and the routing key made once, and for a run of plain
        messages (`_plain_run_route`) the route too. An error raised for one of them carries
        its index in `at`; the later ones are not taken."""
        at = 0
        try:
            exchange = self._publish_target(exchange_name, immediate)
            queues = self._plain_run_route(exchange, exchange_name, routing_key, run)
            if queues is not None and self._publish_many(queues, exchange, exchange_name,
                                                         routing_key, run):
                return
            publish_one = self._publish_one
            for j in range(2, len(run), 2):
                if queues is None:
                    publish_one(exchange, exchange_name, routing_key, mandatory, run[j],
                                run[j + 1])
                else:  # as _publish_one would: no property to check, no transaction
                    self._route(exchange, Message(exchange_name, routing_key, run[j],
                                                  run[j + 1]), mandatory, queues)
                at += 1
        except BrokerError as error:
            exc = to_amqp(error)
            exc.at = at
            raise exc from None
        except AMQPError as exc:
            exc.at = at
            raise

    def _plain_run_route(self, exchange: Exchange, exchange_name: str, routing_key: str,
                         run: list[Any]) -> list[Any] | None:
        """The queues that every message of a run goes to, when they are all plain
        (NOT_PLAIN: no expiration or user id to check, no headers, so no CC, BCC or headers
        to route by) and nothing else makes messages alike route apart: no transaction, no
        deduplication, no exchange on the way that routes by properties. None otherwise."""
        if self.tx is not None or exchange.dedup is not None:
            return None
        for j in range(2, len(run), 2):
            header = run[j]
            if ((header[12] << 8) | header[13]) & NOT_PLAIN:
                return None
        return self.vhost.route_run(exchange, Message(exchange_name, routing_key, run[2],
                                                      run[3]))

    def _publish_many(self, queues: list[Any], exchange: Exchange, exchange_name: str,
                      routing_key: str, run: list[Any]) -> bool:
        """A run of plain messages that routes to one queue that takes a run in one call
        (a stream, or a quorum queue that would take each of them: `takes_run`), taken so
        (`publish_many`), with the stats and confirms `_route` keeps. False, having done
        nothing, for any other run. One queue only, so that the order of what other queues
        deliver is never changed."""
        if len(queues) != 1:
            return False
        takes_run = getattr(queues[0], "takes_run", None)
        if takes_run is None or not takes_run():
            return False
        publish_many = queues[0].publish_many
        messages = [Message(exchange_name, routing_key, run[j], run[j + 1])
                    for j in range(2, len(run), 2)]
        confirms = self.confirms
        tracked = [confirms.track() for _ in messages] if confirms is not None else None
        publish_many(messages, tracked)
        count = len(messages)
        self.stats_publish += count
        exchange.stats_publish_in += count
        exchange.stats_publish_out += count
        if tracked is not None:
            for confirm in tracked:
                confirm.seal()
        return True

    def _publish_target(self, exchange_name: str, immediate: bool) -> Exchange:
        """The exchange a publish goes to, once the rules on the publish itself allow it."""
        if immediate:
            raise NotImplementedFeature("immediate=true")
        if self.session.limited_permissions:
            self.check("write", "exchange", exchange_name)
        exchange = self.vhost.exchanges.get(exchange_name)
        if exchange is None:
            raise NotFound(f"no exchange '{exchange_name}' in vhost '{self.vhost.name}'")
        if exchange.internal:
            raise AccessRefused(
                f"cannot publish to internal {self.vhost.rs('exchange', exchange_name)}"
            )
        return exchange

    def _publish_one(self, exchange: Exchange, exchange_name: str, routing_key: str,
                     mandatory: bool, header: bytes, body: bytes) -> None:
        message = Message(exchange_name, routing_key, header, body)
        flags = (header[12] << 8) | header[13]
        if flags & (FLAG_EXPIRATION | FLAG_USER_ID):
            self._check_properties(message, flags)
        if self.tx is not None:
            self.tx.append(("publish", exchange, message, mandatory))
            return
        self._route(exchange, message, mandatory)

    def _check_properties(self, message: Message, flags: int) -> None:
        props = message.properties
        if flags & FLAG_EXPIRATION and props.expiration is not None:
            qargs.parse_expiration(props.expiration)  # "" too: RabbitMQ says no_integer
        if flags & FLAG_USER_ID and props.user_id and props.user_id != self.session.username:
            raise PreconditionFailed(
                f"user_id property set to '{props.user_id}' but authenticated user was "
                f"'{self.session.username}'"
            )

    def _route(self, exchange: Exchange, message: Message, mandatory: bool,
               queues: list[Any] | None = None) -> None:
        """Route and enqueue one message, or enqueue it to `queues` when its run's route is
        known (`_plain_run_route`)."""
        confirm: Confirm | None = None
        if self.confirms is not None:
            confirm = self.confirms.track()
        if queues is None:
            taken = self.vhost.publish(exchange, message, confirm)
        else:
            taken = self.vhost.publish_to(queues, message, confirm)
        self.stats_publish += 1
        exchange.stats_publish_in += 1
        exchange.stats_publish_out += taken
        if not taken:
            if mandatory:
                self.stats_return_unroutable += 1
                self._return(message, c.NO_ROUTE, "NO_ROUTE")
            else:
                self.stats_unroutable_dropped += 1
        if confirm is not None:
            confirm.seal()

    def _return(self, message: Message, code: int, text: str) -> None:
        session = self.session
        session.write(
            codec.encode_return(
                self.number,
                code,
                text,
                codec.short_str(message.exchange),
                codec.short_str(message.routing_key),
            )
        )
        session.write_many(
            content_frames(self.number, message.header, message.body, session.frame_max)
        )

    # -- confirms -----------------------------------------------------------------------------

    def _confirm_select(self, method: m.Confirm.Select) -> None:
        if self.tx is not None:
            raise PreconditionFailed("cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = Confirms(self.session, self.number)
        if not method.nowait:
            self.reply(m.Confirm.SelectOk())

    # -- transactions -------------------------------------------------------------------------

    def _tx_select(self, _method: m.Tx.Select) -> None:
        if self.confirms is not None:
            raise PreconditionFailed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = []
        self.reply(m.Tx.SelectOk())

    def _tx_commit(self, _method: m.Tx.Commit) -> None:
        """As RabbitMQ: the publishes first, then the acks and nacks in their order."""
        if self.tx is None:
            raise PreconditionFailed("channel is not transactional")
        work, self.tx = self.tx, None
        self.tx_held = 0
        try:
            for item in work:
                if item[0] == "publish":
                    self._route(item[1], item[2], item[3])
            for item in work:
                if item[0] == "ack":
                    self._ack_items([unacked for _tag, unacked in item[1]])
                elif item[0] == "nack":
                    self._reject([unacked for _tag, unacked in item[1]], item[2], item[3])
        finally:
            self.tx = []
        self.reply(m.Tx.CommitOk())

    def _tx_rollback(self, _method: m.Tx.Rollback) -> None:
        """Drop the publishes; the acked and nacked deliveries become unacked again."""
        if self.tx is None:
            raise PreconditionFailed("channel is not transactional")
        self._restore_held()
        self.tx = []
        self.reply(m.Tx.RollbackOk())

    def _restore_held(self) -> None:
        held = [pair for work in self.tx or () if work[0] != "publish" for pair in work[1]]
        if not held:
            return
        self.get_unacked += sum(1 for _tag, item in held if item.consumer is None)
        self.tx_held = 0
        self.unacked = OrderedDict(sorted([*self.unacked.items(), *held], key=lambda p: p[0]))

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """The channel is gone: requeue what it held and cancel its consumers."""
        if self.closed:
            return
        self.closed = True
        if self.timeouts is not None:
            self.timeouts.close()
        backlog.cancel(self)
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self._restore_held()  # acks of an uncommitted transaction do not count
        items = list(self.unacked.values())
        self.unacked.clear()
        self._reject(items, requeue=True, delivery_failed=True)
        if self.confirms is not None:
            self.confirms.close()
        if self.remote is not None:
            self.remote.close()
        # The handlers are bound methods of this channel: a reference cycle that only the
        # cyclic collector (tuned to run rarely) would free. Nothing is dispatched to a
        # closed channel.
        self._handlers.clear()

