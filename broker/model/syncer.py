"""The syncer: the fsyncs of queue logs, off the event loop.

Under fsync `always`, a durable or quorum queue's log leaves what it writes uncommitted
(`LogConfig.fsync_on_write` False) until it is fsynced, and whoever must wait for that asks the
syncer: the committer before it confirms a batch, a replica before it acknowledges a chunk.
`sync(log, done)` has everything written to `log` so far fsynced, commits it (`Log.synced`),
then calls `done(ok)`; ok is False if the fsync failed (the log is broken then).

`ThreadSyncer`, the broker's, is the node's group commit, off the event loop. One round at a
time: a round takes a ticket (what each log has written so far) of every log that asked since
the last round started, makes them durable on a thread of a small pool, then answers them all;
what is asked meanwhile waits for the next round. So a busy node pays one round per round trip
to the disk, however many logs and batches it holds, as a shared write-ahead log would, while
each queue keeps its own log and its own files.

How a round makes its tickets durable: a round of fewer than `SYNCFS_FROM` logs fdatasyncs each
(on the pool's threads, at once: the file system's journal commits them together); a round of
more is one `syncfs(2)` of their file system. `bench/group_sync.py` on this project's 2-core
machine (ext4, one virtual disk; noisy, shared): 2 files: fdatasync each 0.2 ms, syncfs 0.1 ms;
8 files: 0.8-0.9 ms against 0.5 ms; 32 files: 1.5 ms on 16 threads against 0.6 ms; 300 files:
18 ms on 16 threads against 4.3 ms. But syncfs writes back everything dirty on the file system,
not only the logs: with 16 MB of another process's unsynced data it took 8-12 ms whatever the
number of logs, with 64 MB 27-38 ms (about 0.5 ms a MB), where fdatasync each stayed at 0.3-
1.3 ms for up to 16 files. So a node's data directory wants a file system of its own (its
queues under `fsync` policies other than `always` are its own dirty data); on a shared one, a
neighbour's bulk writes lengthen the rounds. In the 1,000-queue benchmark (three nodes,
etcd and other processes on one file system) a node's syncfs took 0.1-1.3 s: there a syncfs
slower than fdatasyncs of the same logs (timed on the threads) makes the next rounds fdatasync
each, for BACKOFF_S, doubled while it stays slower. With it a node's fsync calls there went from
519-684 to 29-36 a second at 1,000 msgs/s (docs/QUORUM-QUEUES.md, "Many queues").

Descriptors: a round that fdatasyncs each log holds a duplicate of each log's segment
descriptor (a held `SyncTicket`) until its fdatasync ends; a syncfs round's tickets hold none
(the round's syncfs needs only its file system's descriptor), which is decided before the tickets
are taken. Either way, once a log's ticket is taken, what it wrote no longer keeps its own files
open: under the node's cap on open logs (storage/openlogs.py) it may release them while the
round runs, and reopens them for its next write.

Why syncfs is as safe as an fdatasync of each: a syncfs that returns 0 has written and flushed
every page that was dirty when it started, the tickets' included, and since Linux 5.8 it
reports a writeback error of any file of the file system that happened since the descriptor it
is called on last saw one (errseq). That descriptor is opened before the first fdatasync of any
log it will cover (each log's first round is an fdatasync of its own), so an error of any byte
a syncfs covers is reported to it. A syncfs error does not say which file: the round then
fdatasyncs each of its logs (each file's own error is still unseen: its descriptor is not the
syncfs one), and the syncer keeps to fdatasync each from then on (the consumed error may have
been of a log not in that round).

`InlineSyncer` fsyncs at once on the caller's thread: for the model's tests on a manual
scheduler, and wherever no event loop runs.

Must not know: AMQP, queues, the cluster. It sees storage Logs and asyncio.
Threading: `sync` and the callbacks run on the event loop's thread; only a round's syncs
(`SyncTicket.run`, `syncfs`) run off it: on the rounds' own thread (one round at a time, its
first fdatasync or its syncfs) and, for the other logs of a round, on the pool's threads, on
descriptors of their own.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from leveret.broker.process import logs
from leveret.storage import Log, StorageError
from leveret.storage.log import SyncTicket

log = logs.get("leveret.syncer")

Done = Callable[[bool], None]
THREADS = 16  # concurrent fdatasyncs: the journal commits them together
SYNCFS_FROM = 8  # a round of this many logs or more is one syncfs, fewer are fdatasync each
SLOWER = 2.0  # a syncfs this many times slower than fdatasync each is taken for slow
BACKOFF_S = 1.0  # then fdatasync each for this long, doubled while it stays slow
BACKOFF_MAX_S = 60.0
_LIBC = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    """syncfs(2): write back and flush everything dirty on the file system of `fd`. Raises
    OSError with the first writeback error on that file system since `fd` was opened (or since
    it last reported one), of any file (Linux 5.8 and later)."""
    if _LIBC.syncfs(fd) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


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


class _Round:
    """One group commit: the tickets taken when it started, and whose callbacks wait on each."""

    __slots__ = ("each", "each_s", "fs_wide", "started", "syncfs_s")

    def __init__(self) -> None:
        self.started = 0.0
        self.syncfs_s = 0.0  # how long its syncfs calls took (on the pool's thread)
        self.each_s = 0.0  # how long its fdatasyncs took, all at once (on the pool's threads)
        self.each: list[tuple[Log, SyncTicket, list[Done]]] = []  # fdatasynced one by one
        # covered by one syncfs of their file system (st_dev first)
        self.fs_wide: list[tuple[int, Log, SyncTicket, list[Done]]] = []


class ThreadSyncer:
    """A node-wide group commit on a pool of threads: one round at a time."""

    def __init__(self, threads: int = THREADS, syncfs_from: int = SYNCFS_FROM) -> None:
        self._threads = threads
        self._syncfs_from = syncfs_from
        self._pool: ThreadPoolExecutor | None = None
        self._waiting: dict[Log, list[Done]] = {}  # for the next round
        self._round: _Round | None = None  # in flight
        # the rounds' own thread and what it is handed (a round and the loop to answer on)
        self._rounds: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, _Round] | None] | None \
            = None
        self._round_thread: threading.Thread | None = None
        # logs that had their first round (an fdatasync of their own), with their st_dev
        self._seen: weakref.WeakKeyDictionary[Log, int] = weakref.WeakKeyDictionary()
        self._fs_fds: dict[int, int] = {}  # st_dev -> a descriptor to syncfs it by
        self._degraded = False  # a syncfs failed once: fdatasync each from then on
        self._batch_s = 0.0  # what a batch of `threads` fdatasyncs at once takes (moving mean)
        self._syncfs_after = 0.0  # (loop time) a slow syncfs: fdatasync each until then
        self._backoff_s = BACKOFF_S
        self.rounds = self.syncfs_calls = self.fdatasync_calls = 0  # (for tests and figures)

    def sync(self, log_: Log, done: Done) -> None:
        self._waiting.setdefault(log_, []).append(done)
        if self._round is None:
            self._start()

    def _start(self) -> None:
        while self._waiting and self._round is None:
            waiting, self._waiting = self._waiting, {}
            this = self._round = _Round()
            answered: list[Done] = []
            # decided before the tickets are taken: a syncfs round's tickets hold no
            # descriptor (the round's syncfs needs none of theirs), so the logs it covers may
            # release their files at once under the node's cap on open logs (OpenLogs)
            wide = (not self._degraded and self._now() >= self._syncfs_after
                    and sum(log_ in self._seen for log_ in waiting) >= self._syncfs_from)
            for log_, dones in waiting.items():
                device = self._seen.get(log_)
                ticket = log_.sync_ticket(hold=not wide or device is None)
                if ticket is None:  # nothing left to fsync (a roll or a close synced it)
                    answered += dones
                    continue
                if device is None or not wide:
                    this.each.append((log_, ticket, dones))
                    if device is None:
                        self._first(log_, ticket)
                else:
                    this.fs_wide.append((device, log_, ticket, dones))
            loop = asyncio.get_running_loop() if this.each or this.fs_wide else None
            this.started = loop.time() if loop is not None else 0.0
            if loop is not None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="fsync")
                self.rounds += 1
                self._post(loop, this)
            else:
                self._round = None
            for done in answered:  # (they may sync again: into _waiting, for the next round)
                done(True)

    @staticmethod
    def _now() -> float:
        """The loop's time (0 with no running loop: nothing is waited for then)."""
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return 0.0

    def _first(self, log_: Log, ticket: SyncTicket) -> None:
        """`log_`'s first round, an fdatasync of its own. The descriptor its file system is
        syncfs'ed by is opened before that fdatasync starts, so every write of `log_` a later
        syncfs covers came after that descriptor was opened, and a writeback error of it is
        reported to that descriptor's syncfs (errseq: each descriptor sees each error once)."""
        device = ticket.device()
        if device not in self._fs_fds:
            self._fs_fds[device] = os.open(ticket.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        self._seen[log_] = device

    def _run(self, this: _Round) -> None:
        """On a pool thread: the round's syncs, all begun after its tickets were taken."""
        pool = self._pool
        assert pool is not None
        began_each = time.monotonic()
        # with no syncfs to make here, the first on this thread and the others on the pool's
        # (a round of one log, the usual one-queue round, wakes no second thread)
        inline = this.each[0][1] if this.each and not this.fs_wide else None
        pending = [pool.submit(ticket.run) for _log, ticket, _d in this.each
                   if ticket is not inline]
        self.fdatasync_calls += len(this.each)
        by_fs: dict[int, list[SyncTicket]] = {}
        for device, _log, ticket, _d in this.fs_wide:
            by_fs.setdefault(device, []).append(ticket)
        for device, tickets in by_fs.items():
            self.syncfs_calls += 1
            began = time.monotonic()
            try:
                syncfs(self._fs_fds[device])
                this.syncfs_s += time.monotonic() - began
            except OSError as error:  # of some file on it, maybe not ours: find which
                log.error("syncfs failed; fdatasync of each log from now on", error=str(error))
                self._degraded = True
                for ticket in tickets:
                    ticket.run()
                self.fdatasync_calls += len(tickets)
                continue
            for ticket in tickets:
                ticket.covered()
        try:
            if inline is not None:
                inline.run()
        finally:
            for future in pending:
                future.result()
        if this.each and not this.fs_wide:  # (else the syncfs ran meanwhile: not comparable)
            this.each_s = time.monotonic() - began_each

    def _post(self, loop: asyncio.AbstractEventLoop, this: _Round) -> None:
        """Hand a round to the rounds' own thread, which answers on `loop` when it ended: a
        queue put and a call_soon_threadsafe, with no futures chained per round."""
        if self._rounds is None:
            self._rounds = queue.SimpleQueue()
            self._round_thread = threading.Thread(
                target=self._serve, args=(self._rounds,), name="fsync-rounds", daemon=True)
            self._round_thread.start()
        self._rounds.put((loop, this))

    def _serve(self, rounds: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, _Round] | None]
               ) -> None:
        """The rounds' thread: each round's syncs, then its end on the loop that asked. A
        round that raised ends all the same (its tickets' errors are their logs' to report)."""
        while True:
            item = rounds.get()
            if item is None:
                return
            loop, this = item
            try:
                self._run(this)
            except Exception as error:  # noqa: BLE001 - the thread goes on serving rounds
                log.error("fsync round failed", error=repr(error))
            try:
                loop.call_soon_threadsafe(self._ended, this)
            except RuntimeError:  # that loop is closed: nobody waits for the answer
                pass

    def _ended(self, this: _Round) -> None:
        self._round = None
        self._learn(this)
        for log_, ticket, dones in this.each + [(g, t, d) for _v, g, t, d in this.fs_wide]:
            ok = _commit(log_, ticket)
            for done in dones:
                done(ok)
        self._start()

    def _learn(self, this: _Round) -> None:
        """What this round says of the two ways: a syncfs slower than fdatasyncs of the same
        logs would have been (another process's dirty data on the file system, other syncfs
        callers) makes the next rounds fdatasync each, for BACKOFF_S, doubled while syncfs
        stays slow (up to BACKOFF_MAX_S)."""
        if this.fs_wide:
            batches = -(-len(this.fs_wide) // self._threads)
            if self._batch_s and this.syncfs_s > SLOWER * self._batch_s * batches:
                self._syncfs_after = asyncio.get_running_loop().time() + self._backoff_s
                log.info("syncfs slower than fdatasync of each log; fdatasync each for now",
                         syncfs_ms=round(this.syncfs_s * 1000, 1), logs=len(this.fs_wide),
                         backoff_s=self._backoff_s)
                self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)
            else:
                self._backoff_s = BACKOFF_S
        elif this.each_s:  # (the disk's time, not the loop's: measured on the threads)
            batch_s = this.each_s / -(-len(this.each) // self._threads)
            self._batch_s = batch_s if not self._batch_s else 0.9 * self._batch_s + 0.1 * batch_s

    def close(self) -> None:
        """At shutdown, once the logs are closed: let the rounds' and the pool's threads end."""
        if self._rounds is not None and self._round_thread is not None:
            self._rounds.put(None)
            self._round_thread.join()
            self._rounds = self._round_thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for fd in self._fs_fds.values():
            os.close(fd)
        self._fs_fds.clear()
