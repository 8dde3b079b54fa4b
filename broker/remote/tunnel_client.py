"""The forwarding node's end of a tunnel: AMQP 0-9-1 spoken to the holding node over the link.

A `Tunnel` is one AMQP connection to one peer's vhost, carried in TUNNEL frames (the peer
serves it with a real session: tunnel_server.py). It has no handshake of its own (the link was
authenticated) and starts with `tunnel.open`. Its channels are `Shadow`s, each standing for
something of this node's clients on the peer: the publishes to one queue (a channel in confirm
mode), one consumer (basic.qos with the consumer's prefetch, basic.consume with its
arguments), or one client channel's basic.get and queue methods. What the peer sends back is
parsed with the wire layer's frame buffer and hot-frame codecs; a delivery's content header and
body are passed on as bytes, never decoded.

Output is gathered during one loop turn and leaves as one TUNNEL frame, or sooner, in pieces
of FLUSH_EARLY_BYTES, while a turn forwards many publishes.

It knows AMQP frames and the link's tunnel frames; the queues and channels it serves are the
callers' (forwarding.py). Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from pamqp import commands as m

from leveret.amqp import codec
from leveret.amqp import constants as c
from leveret.amqp.content import Message, content_frames
from leveret.amqp.errors import AMQPError
from leveret.broker.cluster.link import Link, LinkError
from leveret.broker.cluster.link_frames import TUNNEL_FROM_OPENER
from leveret.broker.model.message import Confirm, QueuedMessage
from leveret.broker.process import logs

log = logs.get("leveret.cluster.tunnel")
OPEN = "tunnel.open"  # request: {id, vhost}; the peer serves the tunnel (tunnel_server.py)
OPEN_TIMEOUT_S = 10.0
HIGH_WATER = 8 * 1024 * 1024  # bytes unsent on the link before this node's clients wait
LOW_WATER = 2 * 1024 * 1024
# A turn's output leaves early once write_many has gathered this many bytes: the holder works
# on the first publishes of a client's read while this node parses the rest, instead of the
# two taking turns on whole confirm windows (forwarded publishes 0.55 -> 0.83 of local).
FLUSH_EARLY_BYTES = 32 * 1024
MAX_CHANNELS = 65535
_GET_OK = (c.CLASS_BASIC << 16) | 71
_GET_EMPTY = (c.CLASS_BASIC << 16) | 72
_RETURN = (c.CLASS_BASIC << 16) | 50
_CANCEL = (c.CLASS_BASIC << 16) | 30
_CHANNEL_CLOSE = (c.CLASS_CHANNEL << 16) | 40
_CHANNEL_CLOSE_OK = (c.CLASS_CHANNEL << 16) | 41
_BODY_SIZE = struct.Struct(">Q")
_FRAME_HEAD = struct.Struct(">BHI")
_DELIVER_HEAD = struct.Struct(">BHIHH")
_TAG_BIT = struct.Struct(">QB")
_END = c.FRAME_END_BYTE
_GET_OK_HEAD = struct.Struct(">QB")
_U32 = struct.Struct(">I")
_ids = itertools.count(1)


class TunnelLost(Exception):
    """The tunnel (or the link under it) closed before the answer came."""


def peer_error(method: Any) -> AMQPError:
    """The AMQPError a peer's channel.close stands for: same code, same explanation."""
    text = str(method.reply_text)
    prefix = f"{c.REPLY_NAMES.get(method.reply_code, 'UNKNOWN')} - "
    return AMQPError(method.reply_code, text[len(prefix):] if text.startswith(prefix) else text)


class Shadow:
    """One channel of a tunnel. Replies to synchronous methods resolve `expect`'s futures in
    order (None: a reply nobody waits for)."""

    def __init__(self, tunnel: Tunnel, prefer: int = 0) -> None:
        self.tunnel = tunnel
        self.closed = False
        self.closing = False
        self.expect: deque[asyncio.Future[Any] | None] = deque()
        self._content: list[Any] | None = None  # [kind, args, header, size, body parts]
        # Acks gathered in one loop turn leave as few frames as possible: the peer's delivery
        # tags on this channel run 1, 2, 3...; every tag below `_low` is settled (acked,
        # nacked, or taken without ack), `_ahead` holds the settled ones above it.
        self._low = 1
        self._ahead: set[int] = set()
        self._acks: list[int] = []  # acked tags that were above `_low` when acked
        self._ack_due = False  # acks wait for the end of the turn
        self._acked_upto = 0
        # settled on the peer already, above `_acked_upto` (acked or nacked one by one, or
        # taken without ack): a multiple ack must not name one of them (406 unknown tag)
        self._gone: set[int] = set()
        # a delivery whose content frames the tunnel copies to the client as they come
        self.raw_out: list[bytes] | None = None
        self.raw_channel = 0
        self.raw_left = 0
        self._raw_method = b""
        self.whole_deliveries = False  # deliver_whole takes a delivery that came in one read
        self.number = tunnel.allocate(self, prefer)
        self.write(codec.encode_method(self.number, m.Channel.Open()), None)

    def write(self, data: bytes, reply: asyncio.Future[Any] | bool | None = False) -> None:
        """Send bytes; `reply` None or a future if the peer will answer with a method."""
        if reply is not False:
            self.expect.append(reply)  # type: ignore[arg-type]
        self.tunnel.write(data)

    def call(self, data: bytes) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(TunnelLost("the channel is closed"))
        else:
            self.write(data, future)
        return future

    def settle(self, tag: int, ok: bool, requeue: bool = False, failed: bool = False) -> None:
        """Ack or nack (with requeue) one delivery the peer made on this channel. Acks are
        sent at the end of the turn, coalesced; a nack at once, after the acks before it (a
        reject when the delivery failed: a quorum queue counts it, RabbitMQ 4.3)."""
        if self.closed or self.closing:
            return  # the peer requeues what a closed channel held
        if ok:
            if not self._ack_due:
                self._ack_due = True
                self.tunnel.before_flush(self.send_acks)
            self._acks.append(tag)
        else:
            self.send_acks()
            self.tunnel.write(codec.encode_method(self.number, m.Basic.Reject(
                delivery_tag=tag, requeue=requeue) if failed else m.Basic.Nack(
                delivery_tag=tag, multiple=False, requeue=requeue)))
            self._gone.add(tag)
        self.taken(tag)

    def taken_without_ack(self, tag: int) -> None:
        """A delivery the peer settled itself (a basic.get with no_ack)."""
        self._gone.add(tag)
        self.taken(tag)

    def taken(self, tag: int) -> None:
        """The delivery `tag` needs no more settling (settled, or taken without an ack)."""
        if tag == self._low:
            low = tag + 1
            ahead = self._ahead
            while low in ahead:
                ahead.remove(low)
                low += 1
            self._low = low
        elif tag > self._low:
            self._ahead.add(tag)

    def send_acks(self) -> None:
        """The acks gathered: one multiple ack up to the highest tag below which all is
        settled, the rest one by one. The multiple ack names the highest of those tags that
        the peer still holds (one acked alone in an earlier turn, nacked, or taken without
        ack is gone there, and naming it would be 406 `unknown delivery tag`); the tags it
        covers that are gone already are left alone by the peer."""
        acks, self._acks = self._acks, []
        due, self._ack_due = self._ack_due, False
        if not due or self.closed or self.closing:
            return  # (after channel.close the peer takes no frame for the channel)
        write = self.tunnel.write
        upto = self._low - 1
        gone = self._gone
        if upto > self._acked_upto:
            top = upto
            while top > self._acked_upto and top in gone:
                top -= 1
            if top > self._acked_upto:
                write(codec.encode_ack(self.number, top, True))
            self._acked_upto = upto
            if gone:
                self._gone = gone = {tag for tag in gone if tag > upto}
        for tag in acks:
            if tag > upto:
                write(codec.encode_ack(self.number, tag, False))
                gone.add(tag)

    def close(self) -> None:
        """Close the peer's channel (it requeues what it held)."""
        if self.closed or self.closing:
            return
        self.send_acks()
        self.closing = True
        self.tunnel.write(codec.encode_method(
            self.number, m.Channel.Close(reply_code=200, reply_text="Normal shutdown",
                                        class_id=0, method_id=0)))

    # -- frames from the peer

    def frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == c.FRAME_METHOD:
            self._method(payload)
        elif frame_type == c.FRAME_HEADER:
            content = self._content
            if content is None:
                return
            content[2] = payload
            content[3] = _BODY_SIZE.unpack_from(payload, 4)[0]
            if not content[3]:
                self._complete(content, b"")
        elif frame_type == c.FRAME_BODY:
            content = self._content
            if content is None:
                return
            parts = content[4]
            parts.append(payload)
            if len(parts) == 1 and len(payload) == content[3]:
                self._complete(content, payload)
            elif sum(map(len, parts)) >= content[3]:
                self._complete(content, b"".join(parts))

    def _complete(self, content: list[Any], body: bytes) -> None:
        self._content = None
        kind, args, header = content[0], content[1], content[2]
        if kind == "deliver":
            self.on_delivery(args[1], args[2], args[3], args[4], header, body)
        elif kind == "get":
            future = self.expect.popleft() if self.expect else None
            if future is not None and not future.done():
                future.set_result((args, header, body))

    def _method(self, payload: bytes) -> None:
        index = codec.method_index(payload)
        if index == c.BASIC_DELIVER:
            self._content = ["deliver", codec.decode_deliver(payload), b"", 0, []]
        elif index == c.BASIC_ACK or index == c.BASIC_NACK:
            tag, multiple = codec.decode_ack(payload)
            self.on_confirm(tag, multiple, index == c.BASIC_ACK)
        elif index == _GET_OK:
            tag, bits = _GET_OK_HEAD.unpack_from(payload, 4)
            pos = 13
            exchange, pos = _short(payload, pos)
            routing_key, pos = _short(payload, pos)
            count = _U32.unpack_from(payload, pos)[0]
            self._content = ["get", (tag, bool(bits & 1), exchange, routing_key, count), b"",
                             0, []]
        elif index == _RETURN:
            self._content = ["return", None, b"", 0, []]
        elif index == _CANCEL:
            self.on_server_cancel()
        elif index == _CHANNEL_CLOSE:
            method = codec.decode_method(payload)
            self.tunnel.write(codec.encode_method(self.number, m.Channel.CloseOk()))
            self.lost(peer_error(method))
            self.tunnel.release(self.number)
        elif index == _CHANNEL_CLOSE_OK:
            self.lost(TunnelLost("channel closed"))
            self.tunnel.release(self.number)
        else:
            reply: Any = None if index == _GET_EMPTY else codec.decode_method(payload)
            future = self.expect.popleft() if self.expect else None
            if future is not None and not future.done():
                future.set_result(reply)

    # -- what kinds of shadows do with it

    def raw_done(self) -> None:
        """The delivery in `raw_out` is whole."""

    def deliver_run(self, data: bytes, pos: int, n: int) -> int:
        """Pass on the whole deliveries that follow one another from `data[pos:]` on this
        channel, as many as the client may take now; return where they end (`pos` if none
        was taken): only for shadows with `whole_deliveries`. Here, the first one alone."""
        end = pos + 7 + _U32.unpack_from(data, pos + 3)[0]
        after = content_end(data, end + 1, self.number, n)
        if after:
            self.deliver_whole(data[pos + 7:end], data[end + 1:after])
            return after
        return pos

    def deliver_whole(self, method: bytes, content: bytes) -> None:
        """A delivery (its basic.deliver payload, then its header and body frames as they
        are) that came whole: only for shadows with `whole_deliveries`."""
        self._raw_method = method
        self.raw_out = [content]
        self.raw_done()

    def on_delivery(self, tag: int, redelivered: bool, exchange: str, routing_key: str,
                    header: bytes, body: bytes) -> None:
        """A basic.deliver on this channel."""

    def on_confirm(self, tag: int, multiple: bool, ok: bool) -> None:
        """A publisher confirm (basic.ack or basic.nack) on this channel."""

    def on_server_cancel(self) -> None:
        """The peer cancelled this channel's consumer."""

    def lost(self, error: Exception) -> None:
        """The channel is gone (closed by the peer with `error`, or the tunnel is lost)."""
        if self.closed:
            return
        self.closed = True
        expect, self.expect = self.expect, deque()
        for future in expect:
            if future is not None and not future.done():
                future.set_exception(error)


class PublishShadow(Shadow):
    """The channel that carries this node's publishes to one queue of the peer, in order, in
    confirm mode; each publish's `Confirm` is settled by the peer's basic.ack or basic.nack."""

    def __init__(self, tunnel: Tunnel, queue: str) -> None:
        super().__init__(tunnel)
        self.queue = queue
        self.seq = 0
        self.unconfirmed: OrderedDict[int, Confirm | None] = OrderedDict()
        self._frames: dict[tuple[str, str], bytes] = {}  # basic.publish frames, by names
        self.write(encode_passive_declare(self.number, queue), None)
        self.write(codec.encode_method(self.number, m.Confirm.Select()), None)

    def publish(self, message: Any, confirm: Confirm | None) -> None:
        """The hot path of a forwarded publish: the method frame is encoded once per
        (exchange, routing key), the content header and body go as they came."""
        key = (message.exchange, message.routing_key)
        method = self._frames.get(key)
        if method is None:
            if len(self._frames) > 1024:
                self._frames.clear()
            method = self._frames[key] = codec.encode_publish(
                self.number, codec.short_str(key[0]), codec.short_str(key[1]))
        self.seq += 1
        if confirm is not None:
            confirm.defer()
        self.unconfirmed[self.seq] = confirm
        tunnel = self.tunnel
        header = message.header
        body = message.body
        size = len(body)
        if 0 < size <= tunnel.frame_max - c.FRAME_OVERHEAD:
            number = self.number
            tunnel.write_many([method, _FRAME_HEAD.pack(c.FRAME_HEADER, number, len(header)),
                               header, _END, _FRAME_HEAD.pack(c.FRAME_BODY, number, size),
                               body, _END], len(method) + len(header) + size + 16)
        else:
            tunnel.write(method)
            tunnel.write_many(content_frames(self.number, header, body, tunnel.frame_max))

    def on_confirm(self, tag: int, multiple: bool, ok: bool) -> None:
        unconfirmed = self.unconfirmed
        if not multiple:
            confirm = unconfirmed.pop(tag, None)
            if confirm is not None:
                confirm.settle(ok)
            return
        while unconfirmed:
            seq = next(iter(unconfirmed))
            if seq > tag:
                break
            confirm = unconfirmed.popitem(last=False)[1]
            if confirm is not None:
                confirm.settle(ok)

    def lost(self, error: Exception) -> None:
        super().lost(error)
        unconfirmed, self.unconfirmed = self.unconfirmed, OrderedDict()
        for confirm in unconfirmed.values():
            if confirm is not None:
                confirm.settle(False)
        self.tunnel.publishers.pop(self.queue, None)


class Tunnel:
    """One AMQP connection to one vhost of one peer, over the link."""

    def __init__(self, link: Link, peer: str, vhost: str,
                 on_lost: Callable[[Tunnel], None]) -> None:
        self.link = link
        self.peer = peer
        self.vhost = vhost
        self.id = next(_ids) & ~TUNNEL_FROM_OPENER
        self.channels: dict[int, Shadow] = {}
        self.publishers: dict[str, PublishShadow] = {}
        self.frame_max = c.DEFAULT_FRAME_MAX
        self.ready = False
        self.closed = False
        self.error: Exception | None = None
        self._partial = b""  # the start of a frame whose end has not come yet
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0  # bytes in `_out` written with write_many
        self._before_flush: list[Callable[[], None]] = []
        self._flush_scheduled = False
        self._next = MAX_CHANNELS + 1  # counts down
        self._on_lost = on_lost
        self.on_full: Callable[[Link], None] | None = None  # the link holds too much unsent
        self._loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = self._loop.create_future()
        self._task = self._loop.create_task(self._open())
        link.on_close(lambda closed: self.lose(TunnelLost(f"link to '{peer}' closed")))

    async def _open(self) -> None:
        try:
            reply = await self.link.call(OPEN, {"id": self.id, "vhost": self.vhost},
                                         timeout=OPEN_TIMEOUT_S)
        except LinkError as exc:
            self.lose(TunnelLost(str(exc)))
            return
        if self.closed:
            return
        if isinstance(reply, dict) and isinstance(reply.get("frame_max"), int):
            self.frame_max = reply["frame_max"]
        self.ready = True
        if not self.opened.done():
            self.opened.set_result(None)
        self._flush()

    # -- output

    def write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write_many(self, parts: list[bytes | memoryview], size: int = -1) -> None:
        """Send `parts` (`size` bytes in all, if the caller knows)."""
        self._out += parts
        self._out_bytes += size if size >= 0 else sum(map(len, parts))
        if self._out_bytes > FLUSH_EARLY_BYTES:
            self._flush()  # the peer starts on these while the rest of the turn is read
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def before_flush(self, callback: Callable[[], None]) -> None:
        """Run `callback` (which may write) just before this turn's output leaves."""
        self._before_flush.append(callback)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._before_flush:
            callbacks, self._before_flush = self._before_flush, []
            for callback in callbacks:
                callback()
        if not self.ready or self.closed or not self._out:
            return
        data = b"".join(self._out)
        self._out.clear()
        self._out_bytes = 0
        try:
            self.link.send_tunnel(self.id | TUNNEL_FROM_OPENER, data)
        except LinkError as exc:
            self.lose(TunnelLost(str(exc)))
            return
        if self.link.buffered_bytes > HIGH_WATER and self.on_full is not None:
            self.on_full(self.link)

    # -- input

    def receive(self, data: bytes) -> None:
        """The peer's bytes: split into frames here (the hot loop of a remote consumer). The
        content frames of a delivery being passed through (`Shadow.raw_out`) are copied to
        it with the client channel's number; every other frame goes to its shadow."""
        if not data:
            self.lose(TunnelLost(f"'{self.peer}' closed the tunnel"))
            return
        if self._partial:
            data = self._partial + data
            self._partial = b""
        channels = self.channels
        unpack = _FRAME_HEAD.unpack_from
        pack = _FRAME_HEAD.pack
        size_of = _BODY_SIZE.unpack_from
        n = len(data)
        pos = 0
        while n - pos >= 8:
            frame_type, number, size = unpack(data, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if data[end] != c.FRAME_END:
                self.lose(TunnelLost(f"bad frame end from '{self.peer}'"))
                return
            shadow = channels.get(number)
            if number == 0 and frame_type == c.FRAME_METHOD:  # connection.close: shutdown
                self._connection_method(data[pos + 7:end])
                return
            if (shadow is not None and shadow.whole_deliveries and frame_type == c.FRAME_METHOD
                    and data[pos + 7:pos + 11] == _DELIVER_ID):
                after = shadow.deliver_run(data, pos, n)
                if after > pos:  # whole deliveries, their header and body frames all here
                    pos = after
                    continue
            if shadow is not None:
                out = shadow.raw_out
                if out is not None and frame_type != c.FRAME_METHOD:
                    if shadow.raw_channel == number:  # the frame as it is
                        out.append(data[pos:end + 1])
                    else:
                        out.append(pack(frame_type, shadow.raw_channel, size))
                        out.append(data[pos + 7:end + 1])
                    if frame_type == c.FRAME_HEADER:
                        shadow.raw_left = size_of(data, pos + 11)[0]
                    else:
                        shadow.raw_left -= size
                    if shadow.raw_left <= 0:
                        shadow.raw_done()
                else:
                    shadow.frame(frame_type, data[pos + 7:end])
            pos = end + 1
        if pos < n:
            self._partial = data[pos:]

    def _connection_method(self, payload: bytes) -> None:
        """The peer closes the tunnel's connection (it is shutting down): close-ok, and the
        tunnel is lost with the peer's reason."""
        method = codec.decode_method(payload)
        if isinstance(method, m.Connection.Close):
            with contextlib.suppress(LinkError):
                self.link.send_tunnel(self.id | TUNNEL_FROM_OPENER, codec.encode_method(
                    0, m.Connection.CloseOk()))
            self.lose(TunnelLost(f"'{self.peer}' closed the tunnel: {method.reply_text}"))

    # -- channels

    def allocate(self, shadow: Shadow, prefer: int = 0) -> int:
        """A free channel number: `prefer` if it is free (a consumer's is its client
        channel's, so that its content frames pass as they are), else counting down from the
        top, which leaves the low numbers clients use to their consumers."""
        if prefer and prefer not in self.channels:
            self.channels[prefer] = shadow
            return prefer
        if len(self.channels) >= MAX_CHANNELS:
            raise AMQPError(c.RESOURCE_ERROR, f"too many channels to node '{self.peer}'")
        while True:
            self._next = (self._next - 2) % MAX_CHANNELS + 1  # MAX, MAX - 1, ..., 1, MAX
            if self._next not in self.channels:
                self.channels[self._next] = shadow
                return self._next

    def release(self, number: int) -> None:
        self.channels.pop(number, None)

    def publisher(self, queue: str) -> PublishShadow:
        shadow = self.publishers.get(queue)
        if shadow is None or shadow.closed:
            shadow = self.publishers[queue] = PublishShadow(self, queue)
        return shadow

    # -- ending

    def lose(self, error: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = error
        self._out.clear()
        if not self.opened.done():
            self.opened.set_exception(error)
            self.opened.exception()  # retrieved: nobody need wait for it
        for shadow in list(self.channels.values()):
            shadow.lost(error)
        self.channels.clear()
        self._on_lost(self)

    def close(self) -> None:
        if not self.closed and self.ready and not self.link.closed:
            self.link.send_tunnel(self.id | TUNNEL_FROM_OPENER, b"")
        self.lose(TunnelLost("closed"))


_DELIVER_ID = struct.pack(">I", c.BASIC_DELIVER)


def content_end(data: bytes, at: int, number: int, n: int) -> int:
    """Where the content of a delivery on channel `number` ends, if its header frame and one
    body frame holding the whole body (or none, for an empty body) start at `at` and are all
    in `data`; else 0."""
    if n - at < 8:
        return 0
    frame_type, channel, size = _FRAME_HEAD.unpack_from(data, at)
    end: int = at + 7 + size
    if frame_type != c.FRAME_HEADER or channel != number or end >= n or size < 12:
        return 0
    if data[end] != c.FRAME_END:
        return 0
    body = int(_BODY_SIZE.unpack_from(data, at + 11)[0])
    if not body:
        return end + 1
    at = end + 1
    if n - at < 8:
        return 0
    frame_type, channel, size = _FRAME_HEAD.unpack_from(data, at)
    end = at + 7 + size
    if frame_type != c.FRAME_BODY or channel != number or size != body or end >= n:
        return 0
    return end + 1 if data[end] == c.FRAME_END else 0


def _short(payload: bytes, pos: int) -> tuple[str, int]:
    end = pos + 1 + payload[pos]
    return payload[pos + 1:end].decode("utf-8"), end


def encode_passive_declare(number: int, queue: str, nowait: bool = False) -> bytes:
    """queue.declare passive: queue names pamqp would refuse to encode pass too."""
    args = b"".join((b"\x00\x00", codec.short_str(queue), b"\x11" if nowait else b"\x01",
                     b"\x00\x00\x00\x00"))
    return (struct.pack(">BHIHH", c.FRAME_METHOD, number, len(args) + 4, 50, 10) + args
            + c.FRAME_END_BYTE)


def message_of(exchange: str, routing_key: str, header: bytes, body: bytes) -> Message:
    return Message(exchange, routing_key, header, body)


def entry_of(tag: int, redelivered: bool, message: Message, shadow: Shadow) -> QueuedMessage:
    """A delivery from the peer as this node's channel takes it: the peer's tag is its seq,
    the shadow that must settle it its store_ref."""
    entry = QueuedMessage(message, tag)
    entry.redelivered = redelivered
    entry.store_ref = shadow
    return entry
