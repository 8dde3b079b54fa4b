"""Publishes that wait for a replicated log's next leader (an election), and the bound on it.

A member of a replicated log whose leader is lost, the next one not known yet, does not nack
what its node's clients publish into it: each publish (its confirm deferred) waits here, in
order, and goes to the next leader once one is known, as RabbitMQ's quorum queues do. A
publish that waited HOLD_MS without a leader is nacked. Quorum queues (quorum.py) use the
bound; a delayed exchange's log (delayed_log.py) uses the bound and this class.

It must not know the cluster, the log or AMQP: it is told whether the log awaits a leader and
whom to hand a publish to once it does not.
Threading: single-threaded, on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from leveret.broker.model.message import Confirm, InboundMessage

if TYPE_CHECKING:
    from leveret.broker.model.scheduler import Scheduler, Timer

RESUME_RETRY_MS = 250  # how often what waits for a leader looks again
HOLD_MS = 30_000  # how long a publish waits for a leader before it is nack'ed


class WaitingPublishes:
    """One log's publishes waiting for its next leader, in the order they came."""

    def __init__(self, scheduler: Scheduler, awaiting: Callable[[], bool],
                 send: Callable[[InboundMessage, Confirm | None], object]) -> None:
        self.scheduler = scheduler
        self.awaiting = awaiting  # True while the log has no leader to send to
        self.send = send  # hands a publish to the leader (here or on its node)
        self.items: list[tuple[InboundMessage, Confirm | None, int]] = []
        self._timer: Timer | None = None

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, message: InboundMessage, confirm: Confirm | None) -> None:
        if confirm is not None:
            confirm.defer()
        self.items.append((message, confirm, self.scheduler.now_ms()))
        self._later()

    def _later(self) -> None:
        if self._timer is None:
            self._timer = self.scheduler.call_later(RESUME_RETRY_MS, self.release)

    def release(self) -> None:
        """Send what waits, in order, once a leader is known; nack what waited HOLD_MS."""
        if self._timer is not None:
            self._timer.cancel()  # (called early: a role was taken)
            self._timer = None
        items = self.items
        now = self.scheduler.now_ms()
        while items:
            message, confirm, since = items[0]
            if self.awaiting():
                if now - since < HOLD_MS:
                    self._later()
                    return
                del items[0]
                if confirm is not None:
                    confirm.settle(False)
                continue
            del items[0]
            self.send(message, confirm)
            if confirm is not None:
                confirm.settle()  # the wait's own hold on it

    def drop(self) -> None:
        """The log is gone (deleted, or its node stops): nack what waits."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, self.items = self.items, []
        for _message, confirm, _since in items:
            if confirm is not None:
                confirm.settle(False)
