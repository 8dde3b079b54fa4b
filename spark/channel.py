"""One AMQP channel of a `wire.Connection`: synchronous methods, publisher confirms, and the
deliveries of its consumers.

Frames reach a channel through `Channel.on_frame`, called by its connection's `pump`; the
hot ones (basic.ack, basic.nack, basic.deliver and content) are read with the wire layer's
struct codecs (`leveret.amqp.codec`), the rest with pamqp. Confirms are counted with a
settled-up-to mark plus the set of tags settled above it, so single and multiple acks in any
order are counted once.

Same threading contract as the connection: one thread at a time.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from pamqp import commands

from leveret.amqp import codec, properties
from leveret.amqp import constants as c
from leveret.amqp.errors import AMQPError
from leveret.spark.endpoint import Endpoint
from leveret.spark.errors import BrokerError, ConnectionLost, LeveretSparkError

T = TypeVar("T")


class Connection(Protocol):
    """What a channel needs of its connection (`wire.Connection`): a Protocol, so that this
    module does not import the wire module that imports it."""

    @property
    def endpoint(self) -> Endpoint: ...

    @property
    def closed(self) -> BrokerError | ConnectionLost | None: ...

    def send_raw(self, data: bytes | bytearray | memoryview) -> None: ...

    def pump(self, timeout: float | None) -> bool: ...

    def forget(self, channel: Channel) -> None: ...


class Delivery:
    """One basic.deliver, basic.return or basic.get-ok with its content; the content header
    stays encoded (`property_values` decodes it when a caller wants the properties)."""

    __slots__ = ("body", "delivery_tag", "exchange", "header", "routing_key")

    def __init__(self, delivery_tag: int, exchange: str, routing_key: str) -> None:
        self.delivery_tag = delivery_tag
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = b""
        self.body = b""

    def property_values(self) -> dict[str, Any]:
        """The properties by their AMQP names (see `leveret.amqp.properties.decode_values`)."""
        try:
            return properties.decode_values(self.header)
        except AMQPError as exc:
            raise LeveretSparkError(f"leveret: the broker sent a message whose properties do "
                                    f"not decode: {exc}") from None


def decode_method(payload: bytes) -> Any:
    """A method frame decoded by pamqp; one that does not decode loses the connection."""
    try:
        return codec.decode_method(payload)
    except (AMQPError, struct.error) as exc:
        raise ConnectionLost(f"cannot decode a method frame from the broker: {exc}") from None


def decoded(value: T | None, what: str) -> T:
    """A field of a method frame pamqp decoded. pamqp types every field as optional (its
    constructors default them to None), but its decoder sets them all."""
    if value is None:
        raise ConnectionLost(f"the broker sent a method frame without its {what}")
    return value


def close_error(close: commands.Channel.Close | commands.Connection.Close,
                scope: str) -> BrokerError:
    """The error a channel.close or connection.close from the broker carries."""
    return BrokerError(decoded(close.reply_code, "reply code"), close.reply_text,
                       decoded(close.class_id, "class id"), decoded(close.method_id, "method id"),
                       scope=scope)


class Channel:
    """One channel: synchronous methods, a publisher-confirm window, a consumer queue."""

    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.error: BrokerError | ConnectionLost | None = None
        self.replies: deque[Any] = deque()
        self.deliveries: deque[Delivery] = deque()
        self.returns: list[Delivery] = []
        self.return_reasons: list[tuple[int, str]] = []
        self.gets: deque[Delivery] = deque()
        self.cancelled = False
        self.ignore_content = False
        # publisher confirms
        self.confirming = False
        self.next_tag = 1
        self.acked_upto = 0  # every tag <= this is settled
        self.settled_above: set[int] = set()
        self.nacked = 0
        # content assembly
        self._content: Delivery | None = None
        self._content_left = 0
        self._content_kind = ""
        self._body_parts: list[bytes] = []

    # -- frames ---------------------------------------------------------------------------

    def on_frame(self, ftype: int, payload: bytes) -> None:
        if ftype == c.FRAME_METHOD:
            self._on_method_frame(payload)
        elif ftype == c.FRAME_HEADER:
            if self._content is None:
                return
            self._content.header = payload
            self._content_left = properties.body_size(payload)
            if self._content_left == 0:
                self._finish_content()
        elif ftype == c.FRAME_BODY:
            if self._content is None:
                return
            self._body_parts.append(payload)
            self._content_left -= len(payload)
            if self._content_left <= 0:
                self._finish_content()

    def _on_method_frame(self, payload: bytes) -> None:
        try:
            index = codec.method_index(payload)
            if index == c.BASIC_ACK:
                self._settle(*codec.decode_ack(payload))
                return
            if index == c.BASIC_DELIVER:
                _ctag, tag, _redelivered, exchange, routing_key = codec.decode_deliver(payload)
                self._start_content("deliver", Delivery(tag, exchange, routing_key))
                return
            if index == c.BASIC_NACK:
                self.nacked += self._settle(*codec.decode_ack(payload))
                return
        except (AMQPError, struct.error) as exc:
            raise ConnectionLost(f"cannot decode a method frame from the broker: {exc}") from None
        self._on_method(decode_method(payload))

    def _start_content(self, kind: str, delivery: Delivery) -> None:
        self._content = delivery
        self._content_kind = kind
        self._body_parts = []

    def _finish_content(self) -> None:
        content, self._content = self._content, None
        assert content is not None
        parts = self._body_parts
        content.body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._body_parts = []
        if self.ignore_content:
            return
        if self._content_kind == "deliver":
            self.deliveries.append(content)
        elif self._content_kind == "get":
            self.gets.append(content)
        else:
            self.returns.append(content)

    def _on_method(self, method: Any) -> None:
        if isinstance(method, commands.Channel.Close):
            self.error = close_error(method, "channel")
            try:
                self.connection.send_raw(codec.encode_method(self.number,
                                                             commands.Channel.CloseOk()))
            finally:
                self.connection.forget(self)
        elif isinstance(method, commands.Basic.Return):
            self._start_content("return", Delivery(0, method.exchange,
                                                   decoded(method.routing_key, "routing key")))
            self.return_reasons.append((decoded(method.reply_code, "reply code"),
                                        method.reply_text))
        elif isinstance(method, commands.Basic.Cancel):
            self.cancelled = True
        else:
            if isinstance(method, commands.Basic.GetOk):
                self._start_content("get", Delivery(0, method.exchange,
                                                    decoded(method.routing_key, "routing key")))
            self.replies.append(method)

    def _settle(self, tag: int, multiple: bool) -> int:
        """Mark tags settled; returns how many became settled."""
        if multiple:
            if tag <= self.acked_upto:
                return 0
            above = {t for t in self.settled_above if t <= tag}
            count = tag - self.acked_upto - len(above)
            self.settled_above -= above
            self.acked_upto = tag
        else:
            if tag <= self.acked_upto or tag in self.settled_above:
                return 0
            count = 1
            self.settled_above.add(tag)
        while self.acked_upto + 1 in self.settled_above:
            self.acked_upto += 1
            self.settled_above.discard(self.acked_upto)
        return count

    # -- synchronous methods --------------------------------------------------------------

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.connection.closed is not None:
            raise self.connection.closed

    def wait_for(self, kind: type[T] | tuple[type[T], ...], timeout: float = 30.0) -> T:
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            while self.replies:
                reply = self.replies.popleft()
                if isinstance(reply, kind):
                    return reply
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(
                    f"{self.connection.endpoint.display} did not answer within {timeout:.0f} s")
            self.connection.pump(remaining)

    def call(self, method: Any, reply: type[T] | tuple[type[T], ...]) -> T:
        self.check()
        self.connection.send_raw(codec.encode_method(self.number, method))
        return self.wait_for(reply)

    def exchange_exists(self, name: str) -> None:
        self.call(commands.Exchange.Declare(exchange=name, passive=True),
                  commands.Exchange.DeclareOk)

    def queue_declare_passive(self, name: str) -> commands.Queue.DeclareOk:
        return self.call(commands.Queue.Declare(queue=name, passive=True),
                         commands.Queue.DeclareOk)

    def confirm_select(self) -> None:
        self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.confirming = True

    def basic_get(self, queue: str) -> tuple[Any, Delivery | None]:
        """basic.get with no-ack; (get-ok or get-empty, content or None)."""
        self.check()
        self.connection.send_raw(codec.encode_get(self.number, codec.short_str(queue, cut=False),
                                                  no_ack=True))
        got = self.wait_for((commands.Basic.GetOk, commands.Basic.GetEmpty))
        if isinstance(got, commands.Basic.GetEmpty):
            return got, None
        deadline = time.monotonic() + 30.0
        while not self.gets:
            self.check()
            if time.monotonic() > deadline:
                raise ConnectionLost("basic.get-ok came without its content")
            self.connection.pump(1.0)
        return got, self.gets.popleft()

    def qos(self, prefetch_count: int) -> None:
        self.call(commands.Basic.Qos(prefetch_count=prefetch_count), commands.Basic.QosOk)

    def consume(self, queue: str, arguments: dict[str, Any]) -> str:
        ok = self.call(commands.Basic.Consume(queue=queue, arguments=arguments),
                       commands.Basic.ConsumeOk)
        return str(ok.consumer_tag)

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.connection.send_raw(codec.encode_ack(self.number, delivery_tag, multiple))

    def close(self) -> None:
        if self.error is not None or self.connection.closed is not None:
            self.connection.forget(self)
            return
        self.ignore_content = True
        try:
            self.call(commands.Channel.Close(reply_code=200, reply_text="done", class_id=0,
                                             method_id=0), commands.Channel.CloseOk)
        finally:
            self.connection.forget(self)

    # -- confirms -------------------------------------------------------------------------

    @property
    def unconfirmed(self) -> int:
        return self.next_tag - 1 - self.acked_upto - len(self.settled_above)

    def wait_confirms(self, below: int, timeout: float,
                      on_progress: Callable[[], None] | None = None) -> None:
        """Block until at most `below` publishes are unconfirmed (0: all of them)."""
        deadline = time.monotonic() + timeout
        while self.unconfirmed > below:
            self.check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(
                    f"{self.unconfirmed} publishes to {self.connection.endpoint.display} were "
                    f"not confirmed within {timeout:.0f} s")
            if self.connection.pump(remaining) and on_progress is not None:
                on_progress()
        self.check()
