"""Forwarding to the node that holds a queue, over the node-to-node link.

A client of this node may use any queue of the cluster. A queue held by another node is a
`RemoteQueue` here, which hands what must happen to it to the `Forwarder` (as its
`Forwarding`); that is forwarded through a tunnel: AMQP 0-9-1 spoken to
that node over the link (tunnel_client.py), served there by an ordinary session
(tunnel_server.py). Why a tunnel rather than one link message per operation: the holding node
applies its own queue rules, with their codes and texts, to everything (prefetch, exclusive
consumers, stream offsets, requeue and redelivery, purge and delete counts), through the code
its own clients use; this side only maps delivery tags and passes content bytes through.

- Publishes: one tunnel per (node, vhost); per target queue, one tunnel channel in confirm
  mode, so each publisher's order holds per queue. A publish's `Confirm` is deferred until the
  holder acks or nacks it; one routed to queues on several nodes confirms once all have.
- Consumers: per remote consumer, one tunnel channel (basic.qos with the consumer's prefetch,
  basic.consume with its arguments). Its deliveries go out on the client's channel with that
  channel's own delivery tags; acks, nacks, rejects (with requeue), recover and cancel go back.
- basic.get and queue.declare (passive), purge and delete: through a tunnel channel of the
  client channel (`Channel.remote`), relaying the reply or the error (same code and text).
- A node going down (its link closes): its consumers here get basic.cancel, publishes waiting
  for its confirm are nacked, deliveries not yet acked are forgotten (the holder requeues
  them), and what is asked of its queues gets RabbitMQ's answer for a queue whose node is down.

It must not know the etcd topology: the queues it is given say which node holds them. It
answers basic.consume and basic.get through the `QueueClient` it is given (the client's
channel), never by importing the channel. The broker is composed with its `Forwarder`
(`broker.forwarder`) in broker/server.py.
Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands as m

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError
from leveret.broker.cluster.link import Link
from leveret.broker.cluster.link_frames import TUNNEL_FROM_OPENER
from leveret.broker.model.message import Confirm
from leveret.broker.process import logs
from leveret.broker.remote.remote_queue import RemoteQueue, node_down
from leveret.broker.remote.tunnel_client import (
    LOW_WATER,
    OPEN,
    Shadow,
    Tunnel,
    TunnelLost,
    encode_passive_declare,
    entry_of,
    message_of,
)
from leveret.broker.session.unacked import Unacked

if TYPE_CHECKING:
    from leveret.broker.cluster.peers import ClusterLinks
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.queue_client import QueueClient, QueueMethod

log = logs.get("leveret.cluster.forwarding")
_DELIVER_ID = struct.pack(">I", c.BASIC_DELIVER)
_FRAME_HEAD = struct.Struct(">BHI")
_TAG_BIT = struct.Struct(">QB")
_U64 = struct.Struct(">Q")
_METHOD_HEAD = struct.Struct(">BHII")  # frame type, channel, size; class and method ids
_CONTENT_HEAD = struct.Struct(">BHI4xQ")  # frame type, channel, size; the body size
_END = c.FRAME_END_BYTE
CONSUME_INDEX = (c.CLASS_BASIC << 16) | 20
GET_INDEX = (c.CLASS_BASIC << 16) | 70

# A stream consumer's channel on the holder may run this many prefetches ahead of the client,
# so the extra hop's latency does not throttle it; the client still gets at most its prefetch.
STREAM_READ_AHEAD = 8
# ... but by no more than this many deliveries beyond it (what b may hold for one consumer).
STREAM_READ_AHEAD_MAX = 16_000
PREFETCH_MAX = 65_535  # basic.qos's prefetch-count is a short
THROTTLE_POLL_S = 0.005
# A client session with a remote consumer writes what it gathered once it holds this many
# bytes, not only at the end of the turn: the link's reader may run a long turn, and the client
# can work on the first deliveries meanwhile.
CLIENT_FLUSH_BYTES = 64 * 1024


def _holder_tag(method: bytes) -> int:
    """The delivery tag of a basic.deliver frame's payload."""
    return int(_TAG_BIT.unpack_from(method, 5 + method[4])[0])


class _Run:
    """Whole deliveries waiting in `pending` as one block, as they came on the tunnel (channel
    numbered as the client's): delivery i spans `data[bounds[i]:bounds[i + 1]]` and its holder's
    delivery tag is at `tags[i]`; those before `first` have gone to the client."""

    __slots__ = ("bounds", "data", "first", "tags")

    def __init__(self, data: bytes, bounds: list[int], tags: list[int]) -> None:
        self.data = data
        self.bounds = bounds
        self.tags = tags
        self.first = 0

    def holder_tags(self) -> list[int]:
        """The holder's tags of the deliveries still waiting."""
        data = self.data
        return [_U64.unpack_from(data, at)[0] for at in self.tags[self.first:]]

    def pop_one(self) -> tuple[bytes, list[bytes]]:
        """The next delivery as raw_done keeps one: its method's payload, its content frames."""
        i = self.first
        self.first = i + 1
        start = self.bounds[i]
        delivery = self.data[start:self.bounds[i + 1]]
        end = 7 + _FRAME_HEAD.unpack_from(delivery)[2]
        return delivery[7:end], [delivery[end + 1:]]

    @property
    def done(self) -> bool:
        return self.first == len(self.tags)


class ConsumerShadow(Shadow):
    """One remote consumer: the peer delivers on this tunnel channel; deliveries wait in
    `pending` until the client's channel can take them."""

    def __init__(self, tunnel: Tunnel, queue: RemoteQueue, consumer: Consumer) -> None:
        super().__init__(tunnel, consumer.sink.number)  # type: ignore[attr-defined]
        self.queue = queue
        self.consumer = consumer
        # deliveries the client's channel cannot take yet: decoded, or (method, content frames)
        self.pending: deque[Any] = deque()
        self.active = False  # consume-ok went to the client: deliveries may follow
        self.cancelled = False
        self.unacked = 0
        session = consumer.sink.session  # type: ignore[attr-defined]
        session.flush_early_bytes = min(session.flush_early_bytes, CLIENT_FLUSH_BYTES)
        # passed through only if the client's frames may be as large as the peer's
        frame_max = session.frame_max
        self.passthrough = not frame_max or frame_max >= tunnel.frame_max
        # a delivery that came whole goes to the client as it is, but for the method frame
        self.whole_deliveries = self.passthrough and self.number == consumer.sink.number  # type: ignore[attr-defined]
        consumer.state = self

    async def start(self, exclusive: bool) -> None:
        consumer = self.consumer
        number = self.number
        prefetch = consumer.prefetch
        if self.queue.type == "stream" and prefetch:  # no other consumer waits for it here
            prefetch = min(prefetch + min(prefetch * (STREAM_READ_AHEAD - 1),
                                          STREAM_READ_AHEAD_MAX), PREFETCH_MAX)
        self.write(codec.encode_method(number, m.Basic.Qos(prefetch_count=prefetch)), None)
        await self.call(codec.encode_method(number, m.Basic.Consume(
            queue=self.queue.name, consumer_tag=consumer.tag, no_ack=consumer.no_ack,
            exclusive=exclusive, arguments=consumer.arguments)))

    def frame(self, frame_type: int, payload: bytes) -> None:
        """The hot path: a delivery's frames are not decoded. The tunnel copies its content
        frames, with the client channel's number, into `raw_out`; once whole, it goes to the
        client with the client channel's delivery tag patched in (the consumer tag is the
        client's own), at once if the channel can take it, else when it can."""
        if (frame_type == c.FRAME_METHOD and payload[:4] == _DELIVER_ID and self.passthrough
                and not self.cancelled):
            self._raw_method = payload
            self.raw_channel = self.consumer.sink.number  # type: ignore[attr-defined]
            self.raw_left = 1
            self.raw_out = []
            return
        super().frame(frame_type, payload)

    def deliver_run(self, data: bytes, pos: int, n: int) -> int:
        """The hot path of a remote consumer: the whole deliveries that follow one another on
        this channel (numbered as the client's) go to the client as one copy of their bytes,
        with only each delivery tag patched, as many as its prefetch lets it take now; the
        rest wait in `pending`, undecoded, behind them."""
        consumer = self.consumer
        channel: Any = consumer.sink
        if (self.cancelled or not self.active or consumer.no_ack or not consumer.prefetch
                or channel.global_prefetch):
            return super().deliver_run(data, pos, n)
        pending = self.pending
        credit = (0 if pending or channel.closed or not channel.session.writable
                  else consumer.prefetch - consumer.unacked)
        number = self.number
        method_head = _METHOD_HEAD.unpack_from
        content_head = _CONTENT_HEAD.unpack_from
        frame_head = _FRAME_HEAD.unpack_from
        holder_tag = _U64.unpack_from
        unacked = channel.unacked
        queue = self.queue
        first = tag = channel.next_tag
        start = pos
        run_end = -1  # where the deliveries passed on end, once one has to wait
        at: list[int] = []  # where each delivery tag is, from `start`
        bounds: list[int] = []  # where each waiting delivery starts, from `run_end`
        tags: list[int] = []  # where each waiting delivery's tag is, from `run_end`
        while n - pos >= 11:  # content_end, inlined: the frames of one delivery
            kind, chan, size, index = method_head(data, pos)
            end = pos + 7 + size
            if (kind != c.FRAME_METHOD or chan != number or index != c.BASIC_DELIVER
                    or end >= n or data[end] != c.FRAME_END or n - end < 20):
                break
            kind, chan, size, body = content_head(data, end + 1)
            after = end + 8 + size
            if (kind != c.FRAME_HEADER or chan != number or size < 12 or after >= n
                    or data[after] != c.FRAME_END):
                break
            after += 1
            if body:
                if n - after < 8:
                    break
                kind, chan, size = frame_head(data, after)
                after += 7 + size
                if (kind != c.FRAME_BODY or chan != number or size != body or after >= n
                        or data[after] != c.FRAME_END):
                    break
                after += 1
            if credit > 0:
                tag_at = pos + 12 + data[pos + 11]
                unacked[tag] = Unacked((holder_tag(data, tag_at)[0], self), queue, consumer)
                at.append(tag_at - start)
                tag += 1
                credit -= 1
            else:
                if run_end < 0:
                    run_end = pos
                bounds.append(pos - run_end)
                tags.append(pos + 12 + data[pos + 11] - run_end)
            pos = after
        if pos == start:
            return super().deliver_run(data, pos, n)
        count = tag - first
        self.unacked += count + len(tags)
        if tags:  # one block for all that wait, split as credit comes back
            bounds.append(pos - run_end)
            pending.append(_Run(data[run_end:pos], bounds, tags))
        if count:
            run = bytearray(memoryview(data)[start:run_end if run_end >= 0 else pos])
            patch = _U64.pack_into
            for client_tag, offset in enumerate(at, first):
                patch(run, offset, client_tag)
            channel.next_tag = tag
            consumer.unacked += count
            queue.stats_delivered += count
            channel.session.write_many([run])
        return pos

    def raw_done(self) -> None:
        parts = self.raw_out
        self.raw_out = None
        if parts is None:
            return
        method = self._raw_method
        consumer = self.consumer
        if not consumer.no_ack:
            self.unacked += 1
        if self.cancelled:
            self.settle(_holder_tag(method), False, True)
        elif self.active and not self.pending and consumer.sink.can_send(consumer):
            self._send_raw(method, parts)
        else:
            self.pending.append((method, parts))

    def _send_raw(self, method: bytes, parts: list[bytes]) -> None:
        consumer = self.consumer
        channel: Any = consumer.sink
        tag_at = 5 + method[4]
        holder_tag, bits = _TAG_BIT.unpack_from(method, tag_at)
        tag = channel.next_tag
        channel.next_tag = tag + 1
        if not consumer.no_ack:
            channel.unacked[tag] = Unacked((holder_tag, self), self.queue, consumer)
            consumer.unacked += 1
        self.queue.stats_delivered += 1
        channel.session.write_many([
            _FRAME_HEAD.pack(c.FRAME_METHOD, channel.number, len(method)), method[:tag_at],
            _TAG_BIT.pack(tag, bits), method[tag_at + 9:], _END, *parts])

    def on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str,
                    header: bytes, body: bytes) -> None:
        entry = entry_of(tag, redelivered, message_of(exchange, routing_key, header, body), self)
        if not self.consumer.no_ack:
            self.unacked += 1
        if self.cancelled:
            self.settle(tag, False, True)
            return
        self.pending.append(entry)
        if self.active:
            self.drain()

    def drain(self) -> None:
        """Deliver what waits, while the client's channel can take it."""
        pending = self.pending
        if pending and type(pending[0]) in (tuple, _Run):
            self._drain_raw()
        consumer = self.consumer
        sink = consumer.sink
        queue = self.queue
        while pending and sink.can_send(consumer):
            item = pending[0]
            if type(item) is _Run:  # only where _drain_raw cannot serve this consumer
                self._send_raw(*item.pop_one())
                if item.done:
                    pending.popleft()
                continue
            pending.popleft()
            if type(item) is tuple:
                self._send_raw(*item)
            else:
                sink.send(consumer, item, queue)
                queue.stats_delivered += 1

    def _drain_raw(self) -> None:
        """drain's hot path: the undecoded deliveries at the head of `pending`, as many as the
        client's prefetch lets it take, written at once (as deliver_run does)."""
        consumer = self.consumer
        channel: Any = consumer.sink
        if (consumer.no_ack or not consumer.prefetch or channel.global_prefetch
                or channel.closed or not channel.session.writable):
            return
        credit = consumer.prefetch - consumer.unacked
        pending = self.pending
        unacked = channel.unacked
        queue = self.queue
        number = channel.number
        head = _FRAME_HEAD.pack
        tag_bit = _TAG_BIT.unpack_from
        pack_tag = _TAG_BIT.pack
        holder_tag = _U64.unpack_from
        patch = _U64.pack_into
        first = tag = channel.next_tag
        out: list[Any] = []
        while credit > 0 and pending:
            item = pending[0]
            if type(item) is _Run:  # a block: as many of its deliveries as credit allows
                i = item.first
                k = min(credit, len(item.tags) - i)
                data, bounds = item.data, item.bounds
                base = bounds[i]
                run = bytearray(memoryview(data)[base:bounds[i + k]])
                for at in item.tags[i:i + k]:
                    unacked[tag] = Unacked((holder_tag(data, at)[0], self), queue, consumer)
                    patch(run, at - base, tag)
                    tag += 1
                out.append(run)
                item.first = i + k
                credit -= k
                if item.done:
                    pending.popleft()
                continue
            if type(item) is not tuple:
                break
            method, parts = pending.popleft()
            tag_at = 5 + method[4]
            holder, bits = tag_bit(method, tag_at)
            unacked[tag] = Unacked((holder, self), queue, consumer)
            out += (head(c.FRAME_METHOD, number, len(method)), method[:tag_at],
                    pack_tag(tag, bits), method[tag_at + 9:], _END)
            out += parts
            tag += 1
            credit -= 1
        count = tag - first
        channel.next_tag = tag
        consumer.unacked += count
        queue.stats_delivered += count
        if out:
            channel.session.write_many(out)

    def settle(self, tag: int, ok: bool, requeue: bool = False, failed: bool = False) -> None:
        super().settle(tag, ok, requeue, failed)
        if not self.consumer.no_ack:
            self.unacked -= 1
        if self.cancelled and self.unacked <= 0:
            self.close()

    def ack(self, tag: int) -> None:
        """settle(tag, True), inlined: the hot path of a consumer's acks."""
        if self.closed or self.cancelled:
            self.settle(tag, True)
            return
        if not self._ack_due:
            self._ack_due = True
            self.tunnel.before_flush(self.send_acks)
        if tag == self._low and not self._ahead:  # the multiple ack of send_acks covers it
            self._low = tag + 1
        else:
            self._acks.append(tag)
            self.taken(tag)
        self.unacked -= 1

    def ack_many(self, tags: list[int]) -> None:
        """ack of each tag, in order; a run that starts at `_low` with none missing (the usual
        multiple ack) only moves `_low`."""
        first = tags[0]
        if (first == self._low and not self._ahead and tags[-1] - first + 1 == len(tags)
                and not self.closed and not self.cancelled):
            if not self._ack_due:
                self._ack_due = True
                self.tunnel.before_flush(self.send_acks)
            self._low = tags[-1] + 1
            self.unacked -= len(tags)
            return
        for tag in tags:
            self.ack(tag)

    def cancel(self) -> None:
        """The client cancelled (or its channel closed): what waited goes back to the peer;
        the channel stays open until the client has settled what it was given."""
        if self.cancelled:
            return
        self.cancelled = True
        if self.closed:
            return
        self.send_acks()
        self.write(codec.encode_method(self.number, m.Basic.Cancel(
            consumer_tag=self.consumer.tag, nowait=True)))
        pending, self.pending = self.pending, deque()
        if self.consumer.no_ack:
            self.unacked = 0
        for entry in pending:
            if type(entry) is _Run:
                for holder in entry.holder_tags():
                    self.settle(holder, False, True)
            else:
                self.settle(_holder_tag(entry[0]) if type(entry) is tuple else entry.seq,
                            False, True)
        if self.unacked <= 0:
            self.close()

    def on_server_cancel(self) -> None:
        self._end()

    def lost(self, error: Exception) -> None:
        super().lost(error)
        self.pending.clear()
        self._end()

    def _end(self) -> None:
        """The peer ended the consumer (the queue went, the node went): tell the client."""
        if self.cancelled:
            return
        self.cancelled = True
        consumer = self.consumer
        if consumer in self.queue.consumers:
            self.queue.consumers.remove(consumer)
        if consumer.queue is self.queue or not consumer.queue.consumer_lost(consumer):
            consumer.sink.server_cancel(consumer)
        if not self.closed and self.unacked <= 0:
            self.close()


class OpsShadow(Shadow):
    """A client channel's tunnel channel to one peer: basic.get and the queue methods."""


class ChannelRemote:
    """What one client channel holds on other nodes: its OpsShadow per tunnel."""

    def __init__(self) -> None:
        self.shadows: dict[int, OpsShadow] = {}

    def ops(self, tunnel: Tunnel) -> OpsShadow:
        shadow = self.shadows.get(id(tunnel))
        if shadow is None or shadow.closed or shadow.closing:
            shadow = self.shadows[id(tunnel)] = OpsShadow(tunnel)
        return shadow

    def close(self) -> None:
        for shadow in self.shadows.values():
            shadow.close()
        self.shadows.clear()


class TunnelServing(Protocol):
    """This node's end of the tunnels other nodes open to it (tunnel_server.TunnelServer)."""

    async def open(self, link: Link, body: Any) -> dict[str, Any]: ...

    def receive(self, link: Link, tunnel_id: int, data: bytes) -> None: ...


class ClientConnection(Protocol):
    """What the forwarder needs of a client connection (`session.connection.Session`): its
    socket, to stop reading from it while a peer is behind."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def blocked(self) -> bool: ...


class Host(Protocol):
    """What the forwarder needs of the broker (`broker.Broker`): the cluster's links and the
    client connections."""

    @property
    def cluster(self) -> ClusterRuntime | None: ...

    @property
    def connections(self) -> Collection[ClientConnection]: ...


class Forwarder:
    """This node's tunnels to the others (`broker.forwarder`), and its server of theirs. It
    is the `Forwarding` of every RemoteQueue (remote_queue.py)."""

    def __init__(self, broker: Host, server: TunnelServing) -> None:
        self.broker = broker
        self.server = server
        self.tunnels: dict[tuple[str, str], Tunnel] = {}
        self.by_id: dict[int, Tunnel] = {}
        self._throttled: set[int] = set()  # ids of links whose peer is behind

    def link_to(self, node: str) -> Link | None:
        cluster = self.broker.cluster
        return cluster.links.link_to(node) if cluster is not None else None

    def tunnel(self, node: str, vhost: str) -> Tunnel | None:
        """The tunnel to `vhost` on `node`, opened if need be; None if there is no link."""
        tunnel = self.tunnels.get((node, vhost))
        if tunnel is not None and not tunnel.closed:
            return tunnel
        link = self.link_to(node)
        if link is None:
            return None
        tunnel = Tunnel(link, node, vhost, self._lost)
        tunnel.on_full = self._full
        self.tunnels[(node, vhost)] = tunnel
        self.by_id[tunnel.id] = tunnel
        return tunnel

    def _full(self, link: Link) -> None:
        """The peer is behind (its link holds more than HIGH_WATER unsent): stop reading from
        this node's clients until it has caught up, as RabbitMQ's credit flow holds publishers
        back; a node's memory never holds more than that for a slow peer."""
        if id(link) in self._throttled:
            return
        self._throttled.add(id(link))
        paused: list[Any] = [
            session for session in self.broker.connections
            if session.transport is not None and not session.closed
            and getattr(session.transport, "link", None) is None]  # not a tunnel's
        for session in paused:
            session.transport.pause_reading()
        log.info("a node is behind: reading from clients paused", peer_node=link.peer_node,
                 buffered=link.buffered_bytes)
        asyncio.get_running_loop().call_later(THROTTLE_POLL_S, self._caught_up, link, paused)

    def _caught_up(self, link: Link, paused: list[Any]) -> None:
        if not link.closed and link.buffered_bytes > LOW_WATER:
            asyncio.get_running_loop().call_later(THROTTLE_POLL_S, self._caught_up, link,
                                                  paused)
            return
        self._throttled.discard(id(link))
        for session in paused:  # not those an alarm blocks: the alarm's end resumes them
            transport = session.transport
            if not session.closed and not session.blocked and not transport.is_closing():
                transport.resume_reading()
        log.info("a node caught up: reading from clients resumed", peer_node=link.peer_node)

    def _lost(self, tunnel: Tunnel) -> None:
        if self.tunnels.get((tunnel.peer, tunnel.vhost)) is tunnel:
            del self.tunnels[(tunnel.peer, tunnel.vhost)]
        self.by_id.pop(tunnel.id, None)
        log.info("tunnel closed", peer_node=tunnel.peer, vhost=tunnel.vhost,
                 reason=str(tunnel.error))

    def receive(self, link: Link, tunnel_id: int, data: bytes) -> None:
        """A TUNNEL frame: for a session this node serves, or for one of its own tunnels."""
        if tunnel_id & TUNNEL_FROM_OPENER:
            self.server.receive(link, tunnel_id & ~TUNNEL_FROM_OPENER, data)
            return
        tunnel = self.by_id.get(tunnel_id)
        if tunnel is not None and tunnel.link is link:
            tunnel.receive(data)

    def serve(self, links: ClusterLinks) -> None:
        """Register the link handlers with which this node serves its queues to the others."""
        handlers = links.handlers
        handlers.on_request(OPEN, self.server.open)
        handlers.on_tunnel(self.receive)

    # -- what RemoteQueue hands over (its `Forwarding`)

    def consume(self, queue: RemoteQueue, consumer: Consumer, client: QueueClient,
                nowait: bool) -> None:
        consume(queue, consumer, client, nowait)

    def get(self, queue: RemoteQueue, client: QueueClient, no_ack: bool) -> None:
        get(queue, client, no_ack)

    def resume(self, queue: RemoteQueue, consumer: Consumer) -> None:
        resume(queue, consumer)

    def forward(self, queue: RemoteQueue, client: QueueClient, method: QueueMethod,
                answer: Callable[[QueueMethod], None]) -> None:
        forward_queue_method(client, queue, method, answer)

    def reachable(self, queue: RemoteQueue) -> bool:
        link = self.link_to(queue.node)
        return link is not None and not link.closed

    def publish(self, queue: RemoteQueue, message: Any, confirm: Confirm | None) -> bool:
        tunnel = self.tunnel(queue.node, queue.vhost.name)
        if tunnel is None:  # the node is down: as RabbitMQ, a confirm is a nack
            if confirm is not None:
                confirm.reject()
            return True
        publisher = queue.publisher = tunnel.publisher(queue.name)
        publisher.publish(message, confirm)
        return True


def _tunnel_for(queue: RemoteQueue) -> Tunnel:
    forwarder = queue.forwarder
    tunnel = (forwarder.tunnel(queue.node, queue.vhost.name)
              if isinstance(forwarder, Forwarder) else None)
    if tunnel is None:
        raise node_down(queue)
    return tunnel


async def _answer(queue: RemoteQueue, shadow: Shadow, future: Any) -> Any:
    """The holder's answer to `future` (a future, or the coroutine that asks), once the
    tunnel is open; the node-down error if the tunnel is lost. What was asked of a tunnel
    that never opened is dropped here (a coroutine closed, a future's exception retrieved),
    so that the node-down answer is all that is said of it."""
    try:
        await shadow.tunnel.opened
    except TunnelLost:
        if asyncio.iscoroutine(future):
            future.close()
        elif future.done():
            future.exception()
        else:
            future.add_done_callback(lambda done: done.cancelled() or done.exception())
        raise node_down(queue) from None
    try:
        return await future
    except TunnelLost:
        raise node_down(queue) from None


def consume(queue: RemoteQueue, consumer: Consumer, client: QueueClient, nowait: bool) -> None:
    """basic.consume on a RemoteQueue, checked here already: consume on the holder, then
    answer consume-ok (or the holder's error) and let deliveries flow."""
    tunnel = _tunnel_for(queue)
    shadow = ConsumerShadow(tunnel, queue, consumer)

    async def step() -> None:
        try:
            await _answer(queue, shadow, shadow.start(consumer.exclusive))
        except BaseException:
            shadow.cancelled = True
            shadow.close()
            raise
        if client.closed:
            shadow.cancel()
            return
        client.consume_started(consumer, nowait)
        queue.consumers.append(consumer)
        queue.had_consumers = True
        shadow.active = True
        shadow.drain()

    client.wait_for(CONSUME_INDEX, step())


def resume(queue: RemoteQueue, consumer: Consumer) -> None:
    """A consumer of a quorum queue whose leader was lost subscribes on the new holder: as
    `consume`, but its client already has its consume-ok. If the holder refuses or cannot be
    reached, the consumer's own queue decides whether it waits for the next one."""
    shadow = ConsumerShadow(_tunnel_for(queue), queue, consumer)

    async def step() -> None:
        try:
            await _answer(queue, shadow, shadow.start(consumer.exclusive))
        except BaseException as exc:
            shadow.cancelled = True
            shadow.close()
            if not consumer.queue.consumer_lost(consumer):
                consumer.sink.server_cancel(consumer)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if getattr(consumer.sink, "closed", False):
            shadow.cancel()
            return
        queue.consumers.append(consumer)
        queue.had_consumers = True
        shadow.active = True
        shadow.drain()

    task = asyncio.get_running_loop().create_task(step())
    _resuming.add(task)
    task.add_done_callback(_resuming.discard)


_resuming: set[asyncio.Task[None]] = set()  # resume steps under way (kept from the collector)


def _remote(client: QueueClient) -> ChannelRemote:
    """What the client's channel holds on other nodes, made at its first use."""
    remote = client.remote
    if not isinstance(remote, ChannelRemote):
        remote = client.remote = ChannelRemote()
    return remote


def get(queue: RemoteQueue, client: QueueClient, no_ack: bool) -> None:
    """basic.get on a RemoteQueue: the holder's get-ok becomes the client's, with its tag."""
    shadow = _remote(client).ops(_tunnel_for(queue))
    future = shadow.call(codec.encode_get(shadow.number, codec.short_str(queue.name), no_ack))

    async def step() -> None:
        answer = await _answer(queue, shadow, future)
        if answer is None:
            client.get_empty()
            return
        (tag, redelivered, exchange, routing_key, count), header, body = answer
        entry = entry_of(tag, redelivered, message_of(exchange, routing_key, header, body),
                         shadow)
        if no_ack:
            shadow.taken_without_ack(tag)
        client.get_ok(entry, queue, no_ack, count)

    client.wait_for(GET_INDEX, step())


def forward_queue_method(client: QueueClient, queue: RemoteQueue, method: QueueMethod,
                         answer: Callable[[QueueMethod], None]) -> None:
    """queue.declare (passive), queue.purge or queue.delete of a RemoteQueue: asked of the
    holder; its reply (with its counts) goes to `answer`, its error (same code and text) is
    the client's, as the error of the method it waits for."""
    if not isinstance(method, (m.Queue.Declare, m.Queue.Purge, m.Queue.Delete)):
        raise TypeError(f"not a queue method a holder answers: {method!r}")
    tunnel = _tunnel_for(queue)
    shadow = _remote(client).ops(tunnel)
    nowait = bool(method.nowait)
    if isinstance(method, m.Queue.Declare):
        data = encode_passive_declare(shadow.number, queue.name, nowait)
    else:
        data = codec.encode_method(shadow.number, method)
    if nowait:
        shadow.write(data)
        return
    future = shadow.call(data)

    async def step() -> None:
        reply = await _answer(queue, shadow, future)
        if reply is not None:
            answer(reply)

    client.wait_for(method.index, step())


__all__ = ["AMQPError", "Forwarder", "consume", "forward_queue_method", "get", "node_down"]
