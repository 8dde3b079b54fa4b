"""One AMQP channel of a `wire.Connection`: synchronous methods, publisher confirms, and the
deliveries of its consumers.

Frames reach a channel through `Channel.on_frame`, called by its connection's `pump`; the
hot ones (basic.ack, basic.nack, basic.deliver and content) are parsed with struct, the rest
with pamqp. Confirms are counted with a settled-up-to mark plus the set of tags settled above
it, so single and multiple acks in any order are counted once.

Same threading contract as the connection: one thread at a time.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands, frame
from pamqp import exceptions as pamqp_exceptions

from leveret.spark import frames as f
from leveret.spark.errors import BrokerError, ConnectionLost
from leveret.spark.frames import Delivery

if TYPE_CHECKING:
    from leveret.spark.wire import Connection


def unmarshal_method(payload: memoryview) -> Any:
    data = bytes(payload)
    try:
        return frame._unmarshal_method_frame(data)
    except (pamqp_exceptions.UnmarshalingException, ValueError, struct.error) as exc:
        raise ConnectionLost(f"cannot decode a method frame: {exc}") from None


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

    def on_frame(self, ftype: int, payload: memoryview) -> None:
        if ftype == 1:
            class_method = f.CLASS_METHOD.unpack_from(payload, 0)[0]
            if class_method == f.BASIC_ACK:
                tag, bits = f.TAG_BITS.unpack_from(payload, 4)
                self._settle(tag, bool(bits & 1))
            elif class_method == f.BASIC_DELIVER:
                self._start_content("deliver", f.parse_deliver(payload))
            elif class_method == f.BASIC_NACK:
                tag, bits = f.TAG_BITS.unpack_from(payload, 4)
                self.nacked += self._settle(tag, bool(bits & 1))
            else:
                self._on_method(unmarshal_method(payload))
        elif ftype == 2:
            if self._content is None:
                return
            body_size = f.BODY_SIZE.unpack_from(payload, 4)[0]
            self._content.properties = bytes(payload[12:])
            self._content_left = body_size
            if body_size == 0:
                self._finish_content()
        elif ftype == 3:
            if self._content is None:
                return
            self._body_parts.append(bytes(payload))
            self._content_left -= len(payload)
            if self._content_left <= 0:
                self._finish_content()

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
            self.error = BrokerError(method.reply_code, method.reply_text, method.class_id,
                                     method.method_id, scope="channel")
            try:
                self.connection.send_raw(frame.marshal(commands.Channel.CloseOk(), self.number))
            finally:
                self.connection.forget(self)
        elif isinstance(method, commands.Basic.Return):
            self._start_content("return", Delivery(0, method.exchange, method.routing_key,
                                                   b"", b""))
            self.return_reasons.append((method.reply_code or 0, method.reply_text))
        elif isinstance(method, commands.Basic.Cancel):
            self.cancelled = True
        else:
            if isinstance(method, commands.Basic.GetOk):
                self._start_content("get", Delivery(0, method.exchange, method.routing_key,
                                                    b"", b""))
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

    def wait_for(self, kind: type | tuple[type, ...], timeout: float = 30.0) -> Any:
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

    def call(self, method: Any, reply: type | tuple[type, ...]) -> Any:
        self.check()
        self.connection.send_raw(frame.marshal(method, self.number))
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
        # built by hand: pamqp refuses queue names with '?', which the broker's reserved
        # query names (amq.leveret.publisher-id?stream=...) have
        payload = b"\x00\x3c\x00\x46\x00\x00" + f.shortstr(queue) + b"\x01"
        self.connection.send_raw(f.FRAME_HEAD.pack(1, self.number, len(payload)) + payload
                                 + f.END)
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
        self.connection.send_raw(f.encode_ack(self.number, delivery_tag, multiple))

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
