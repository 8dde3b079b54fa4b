"""One stream consumer's position: its reader, its unread part of a chunk, its acked offsets.

A cursor is plain state that `stream.StreamQueue` drives: the storage reader it owns, the
records of the chunk being delivered, the offsets delivered and not yet acked (in order), the
highest offset below which every delivery is acked (what offset tracking stores), and the
single-active-consumer handover flags. Knows nothing of AMQP or of the event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from leveret.broker.model import stream_args as sargs

if TYPE_CHECKING:
    from leveret.broker.model.scheduler import Timer


class Cursor:
    """One stream consumer's reader, its unread part of a chunk, and its acked position."""

    __slots__ = (
        "active",
        "delivered",
        "dirty",
        "drain_timer",
        "draining",
        "end",
        "name",
        "offsets",
        "pending",
        "reader",
        "records",
        "skip_below",
        "spec",
        "stored",
        "take",
        "tracking",
    )

    def __init__(
        self, name: bytes, tracking: bool, spec: sargs.StartSpec, end: int | None = None
    ) -> None:
        self.name = name
        self.tracking = tracking
        self.spec = spec
        self.end = end  # x-leveret-end-offset: deliver below it, then cancel
        self.reader: Any = None
        self.records: list[Any] = []
        self.offsets: Sequence[int] = ()
        self.take = 0
        self.skip_below = 0
        self.active = True
        self.draining = False  # handing over: no new deliveries, waiting for acks
        self.drain_timer: Timer | None = None
        self.pending: deque[int] = deque()  # delivered offsets, in order
        self.stored = -1  # highest offset with every delivery up to it acked
        self.delivered = -1  # the last offset delivered
        self.dirty = False

    def past_end(self) -> bool:
        """Everything below the consumer's x-leveret-end-offset was handed out or filtered
        out: the chunk in hand is used up and the reader has gone past the end."""
        return (self.end is not None and self.take >= len(self.records)
                and self.reader is not None and self.reader.position >= self.end)
