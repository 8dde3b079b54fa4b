"""Messages as the model sees them: the inbound message interface and a queue entry.

The wire layer builds the inbound messages; the model reads them through the InboundMessage
interface only (exchange, routing key, body, lazily decoded properties, and `replace()` to
derive a changed copy), so it never sees how properties are encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class InboundMessage(Protocol):
    exchange: str
    routing_key: str
    header: bytes
    body: bytes

    @property
    def headers(self) -> Mapping[str, Any]: ...
    def typed_header(self, name: str) -> tuple[str, Any] | None: ...
    @property
    def persistent(self) -> bool: ...
    @property
    def priority(self) -> int: ...
    @property
    def has_priority(self) -> bool: ...
    @property
    def expiration(self) -> str | None: ...
    @property
    def properties(self) -> Any: ...
    @property
    def size(self) -> int: ...
    def replace(
        self, *, exchange: str | None = None, routing_key: str | None = None, **changes: Any
    ) -> InboundMessage: ...


class QueuedMessage:
    """One message in one queue: the shared message plus this queue's bookkeeping."""

    __slots__ = ("acquired", "delivery_count", "expires_at", "message", "priority",
                 "redelivered", "seq", "store_ref")

    def __init__(
        self, message: InboundMessage, seq: int, expires_at: int | None = None, priority: int = 0
    ) -> None:
        self.message = message
        self.seq = seq
        self.expires_at = expires_at
        self.priority = priority
        self.redelivered = False
        self.delivery_count = 0  # failed deliveries (a quorum queue's x-delivery-count)
        self.acquired = 0  # deliveries and gets (a quorum queue's x-acquired-count)
        self.store_ref: Any = None  # where a durable store keeps it (e.g. a log offset)

    def __repr__(self) -> str:
        return f"<QueuedMessage seq={self.seq} redelivered={self.redelivered}>"


class Confirm:
    """The publisher-confirm state of one publish: acked when every queue has settled it.

    Queues that settle later (durable writes, stream chunks) call defer() and then settle().
    """

    __slots__ = ("callback", "pending", "rejected", "sealed", "seq")

    def __init__(self, seq: int, callback: Callable[[Confirm], None]) -> None:
        self.seq = seq
        self.callback = callback
        self.pending = 0
        self.rejected = False
        self.sealed = False

    def defer(self) -> None:
        self.pending += 1

    def reject(self) -> None:
        self.rejected = True

    def settle(self, ok: bool = True) -> None:
        self.pending -= 1
        if not ok:
            self.rejected = True
        if self.pending == 0 and self.sealed:
            self.callback(self)

    def seal(self) -> None:
        """Routing is done: confirm now if nothing is outstanding."""
        self.sealed = True
        if self.pending == 0:
            self.callback(self)
