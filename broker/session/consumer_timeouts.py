"""A channel's consumer timeouts (RabbitMQ 4.3's, for the queue types that have one: quorum
queues): a delivery left unacked longer than its consumer's timeout comes back to its queue,
and the consumer is cancelled (basic.cancel, if the client understands it) or, otherwise and
for a basic.get, the channel is closed with RabbitMQ's 406.

The queue says each consumer's timeout (`consumer_timeout`); the channel tells this tracker
which consumers and gets have one. Nothing is added to the delivery path: once a second the
tracker notes the channel's next delivery tag, so that a tag's delivery time is known to within
that second, and looks at the oldest unacked deliveries only.

It must not know AMQP frames or the queue types: it calls back into its `Holder` (the channel).
Single-threaded: runs on the event loop of the channel's connection.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from leveret.broker.model.consumer import Consumer

TICK_S = 1.0
TIMED_OUT = ("delivery acknowledgement on channel {} timed out. Timeout value used: -1 ms. "
             "This timeout value can be configured, see consumers doc guide to learn more")


class Holder(Protocol):
    """What the tracker asks of the channel."""

    next_tag: int
    closed: bool

    @property
    def unacked(self) -> dict[int, Any]: ...

    def expire(self, consumer: Consumer | None, tags: list[int]) -> None:
        """These deliveries of `consumer` (None: basic.get) timed out."""
        ...


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ConsumerTimeouts:
    def __init__(self, holder: Holder, clock: Callable[[], int] = _now_ms) -> None:
        self.holder = holder
        self.clock = clock
        self.consumers: dict[Consumer, int] = {}  # consumer: its timeout (ms)
        self.gets: dict[int, int] = {}  # an unacked basic.get's tag: its timeout (ms)
        self._marks: deque[tuple[int, int]] = deque()  # (time, next tag then), oldest first
        self._timer: asyncio.TimerHandle | None = None

    def track_consumer(self, consumer: Consumer, timeout_ms: int) -> None:
        self.consumers[consumer] = timeout_ms
        self._start()

    def forget_consumer(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer, None)

    def track_get(self, tag: int, timeout_ms: int) -> None:
        self.gets[tag] = timeout_ms
        self._start()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.consumers.clear()
        self.gets.clear()

    def _start(self) -> None:
        if self._timer is None:
            self._mark()
            self._timer = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _mark(self) -> None:
        """Every tag below the channel's next one was delivered by now."""
        marks = self._marks
        tag = self.holder.next_tag
        if not marks or marks[-1][1] != tag:
            marks.append((self.clock(), tag))

    def delivered_by(self, tag: int) -> int | None:
        """The time by which delivery `tag` had been made (None: after the last mark)."""
        marks = self._marks
        at = bisect.bisect_right([m[1] for m in marks], tag)
        return marks[at][0] if at < len(marks) else None

    def _tick(self) -> None:
        self._timer = None
        holder = self.holder
        if holder.closed or not (self.consumers or self.gets):
            self._marks.clear()
            return
        now = self.clock()
        self._mark()
        expired: dict[Consumer | None, list[int]] = {}
        shortest = min([*self.consumers.values(), *self.gets.values()])
        for tag, item in list(holder.unacked.items()):
            delivered = self.delivered_by(tag)
            if delivered is None or now - delivered <= shortest:
                break  # younger deliveries follow
            consumer = item.consumer
            timeout = self.consumers.get(consumer) if consumer is not None else self.gets.get(
                tag)
            if timeout is not None and now - delivered > timeout:
                expired.setdefault(consumer, []).append(tag)
        self._forget_marks_before(next(iter(holder.unacked), holder.next_tag))
        for consumer, tags in expired.items():
            if holder.closed:
                break
            holder.expire(consumer, tags)
        if not holder.closed:
            self._timer = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def _forget_marks_before(self, oldest_tag: int) -> None:
        """Marks no unacked delivery needs any more (keeping the one that covers the oldest)."""
        marks = self._marks
        while len(marks) > 1 and marks[1][1] <= oldest_tag:
            marks.popleft()
