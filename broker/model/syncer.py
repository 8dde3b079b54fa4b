"""The syncer: the fsyncs of queue logs, off the event loop.

Under fsync `always`, a durable or quorum queue's log leaves what it writes uncommitted
(`LogConfig.fsync_on_write` False) until it is fsynced, and whoever must wait for that asks the
syncer: the committer before it confirms a batch, a replica before it acknowledges a chunk.
`sync(log, done)` has everything written to `log` so far fsynced, commits it (`Log.synced`),
then calls `done(ok)`; ok is False if the fsync failed (the log is broken then).

`ThreadSyncer`, the broker's, runs each fdatasync on a thread of a small pool: the event loop
goes on reading, routing and delivering while the disk works, and the fsyncs of many logs run
at once, which the file system's journal commits together. On this project's 2-core machine,
300 fdatasyncs of appended files took 0.20 ms each one after another and 0.06 ms each on 16
threads; a node with 1,000 quorum queues spent 62% of its event loop in fdatasync before this
existed (docs/QUORUM-QUEUES.md, "Many queues"). A log has at most one fsync in flight: what is
written meanwhile is covered by the next, started when the first ends, so a busy log pays one
fsync per round trip to the disk, however many batches it wrote meanwhile.

`InlineSyncer` fsyncs at once on the caller's thread: for the model's tests on a manual
scheduler, and wherever no event loop runs.

Must not know: AMQP, queues, the cluster. It sees storage Logs and asyncio.
Threading: `sync` and the callbacks run on the event loop's thread; only `SyncTicket.run`
runs on the pool's threads, on a descriptor of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from leveret.broker.process import logs
from leveret.storage import Log, StorageError
from leveret.storage.log import SyncTicket

log = logs.get("leveret.syncer")

Done = Callable[[bool], None]
THREADS = 16  # concurrent fdatasyncs: the journal commits them together


class Syncer(Protocol):
    def sync(self, log_: Log, done: Done) -> None:
        """fsync what `log_` has written so far, commit it, then call done(ok)."""
        ...


def _commit(log_: Log, ticket: SyncTicket) -> bool:
    """Hand an fsync that ended back to its log; False if it failed (the log is broken)."""
    try:
        log_.synced(ticket)
    except StorageError as error:
        log.error("fsync failed", path=str(ticket.path), error=str(error))
        return False
    return True


class InlineSyncer:
    """fsyncs at once, on the caller's thread."""

    def sync(self, log_: Log, done: Done) -> None:
        ticket = log_.sync_ticket()
        if ticket is None:
            done(True)
            return
        ticket.run()
        done(_commit(log_, ticket))


INLINE = InlineSyncer()


class _InFlight:
    __slots__ = ("next", "waiting")

    def __init__(self, done: Done) -> None:
        self.waiting: list[Done] = [done]  # covered by the fsync in flight
        self.next: list[Done] = []  # wrote after it started: wait for the one after


class ThreadSyncer:
    """fsyncs on a pool of threads, one at a time per log."""

    def __init__(self, threads: int = THREADS) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: dict[Log, _InFlight] = {}

    def sync(self, log_: Log, done: Done) -> None:
        busy = self._in_flight.get(log_)
        if busy is not None:
            busy.next.append(done)
            return
        self._start(log_, _InFlight(done))

    def _start(self, log_: Log, flight: _InFlight) -> None:
        ticket = log_.sync_ticket()
        if ticket is None:  # nothing left to fsync (a roll or a close synced it)
            for done in flight.waiting:
                done(True)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="fsync")
        self._in_flight[log_] = flight
        future = asyncio.get_running_loop().run_in_executor(self._pool, ticket.run)
        future.add_done_callback(lambda _f: self._ended(log_, ticket))

    def _ended(self, log_: Log, ticket: SyncTicket) -> None:
        flight = self._in_flight.pop(log_)
        ok = _commit(log_, ticket)
        for done in flight.waiting:
            done(ok)
        if flight.next:
            following = _InFlight(flight.next[0])
            following.waiting += flight.next[1:]
            self._start(log_, following)

    def close(self) -> None:
        """At shutdown, once the logs are closed: let the pool's threads end."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
