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

With a write-ahead log (`ThreadSyncer(wal=...)`, the broker's under `queue_fsync = always`
unless `queue_wal_from` is 0; storage/wal.py), a round of `syncfs_from` logs or more
(`queue_wal_from`, 8 by default) is neither: each log's bytes written since its last durable
point (`SyncTicket.start`..`end`, read back from the page cache through the ticket's own
descriptor on the loop's thread) become one WRITE record of the node's WAL file, written on a
pool thread, then ONE fdatasync of
that file makes them all durable, whatever else is dirty on the file system. A log whose durable
point is not known (its first sync since it was opened or truncated) and every log of a smaller
round fdatasyncs its segment in place instead (cheaper than writing its bytes twice; a log
synced in place needs no WAL record). The WAL is replayed at `leveret serve`'s start before any
log opens (broker/server.py); before a log removes or rewrites bytes (truncate_from, reset_to,
a deleted log: `Log.discard`) it makes its segment durable in place and the WAL writes a
FORGET of it, so that replay never brings removed bytes back; a WAL file past 64 MB is
checkpointed in the background. If the WAL fails to write or fdatasync, the round fdatasyncs
each of its logs and the syncer keeps to that from then on. With a WAL, a second round may
start while one is in flight (at the loop's next turn, so that it gathers what that turn's
callbacks ask): traced in bench/quorum_many.py, a WAL round's disk time was 10-25 ms but it then
waited 30-150 ms for the busy loop to take its end, and everything asked meanwhile waited for
that; two rounds may write the same log's bytes twice (a ticket's range starts at the log's
durable point, which only a round's end advances), which is harmless. The invariants and the
tests that prove them: docs/QUORUM-QUEUES.md, "Many queues".

`InlineSyncer` fsyncs at once on the caller's thread: for the model's tests on a manual
scheduler, and wherever no event loop runs.

Must not know: AMQP, queues, the cluster. It sees storage Logs and asyncio.
Threading: `sync`, the callbacks and the WAL's reads run on the event loop's thread; only a
round's syncs (`SyncTicket.run`, `syncfs`, the WAL's write and fdatasync) run on the pool's
threads, on descriptors of their own: a round on one thread of the pool, which fdatasyncs its
first log itself (a round of one log, the usual one-queue round, wakes no second thread) and
hands the others to the pool at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from leveret.broker.process import logs
from leveret.storage import Log, StorageError
from leveret.storage.log import SyncTicket
from leveret.storage.wal import Write, WriteAheadLog

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
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


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

    __slots__ = ("each", "each_s", "fs_wide", "started", "syncfs_s", "wal_ok", "walled")

    def __init__(self) -> None:
        self.started = 0.0
        self.syncfs_s = 0.0  # how long its syncfs calls took (on the pool's thread)
        self.each_s = 0.0  # how long its fdatasyncs took, all at once (on the pool's threads)
        self.each: list[tuple[Log, SyncTicket, list[Done]]] = []  # fdatasynced one by one
        # covered by one syncfs of their file system (st_dev first)
        self.fs_wide: list[tuple[int, Log, SyncTicket, list[Done]]] = []
        # copied to the write-ahead log, one fdatasync of it (their bytes, read at the start)
        self.walled: list[tuple[Write, Log, SyncTicket, list[Done]]] = []
        self.wal_ok = False  # the WAL made them durable (else each was fdatasynced in place)


class ThreadSyncer:
    """A node-wide group commit on a pool of threads: one round at a time (two with a WAL)."""

    def __init__(self, threads: int = THREADS, syncfs_from: int = SYNCFS_FROM,
                 wal: WriteAheadLog | None = None) -> None:
        self._threads = threads
        self._wal = wal  # with one, a round of many logs is a WAL write instead of a syncfs
        self._syncfs_from = syncfs_from
        self._pool: ThreadPoolExecutor | None = None
        self._waiting: dict[Log, list[Done]] = {}  # for the next round
        self._in_flight = 0  # rounds
        # with a WAL, a second round may start while one waits for the loop to take its end
        # (a WAL round's disk time is one fdatasync; a busy loop's turn is often longer)
        self._max_in_flight = 2 if wal is not None else 1
        self._start_soon = False
        # logs that had their first round (an fdatasync of their own), with their st_dev
        self._seen: weakref.WeakKeyDictionary[Log, int] = weakref.WeakKeyDictionary()
        self._fs_fds: dict[int, int] = {}  # st_dev -> a descriptor to syncfs it by
        self._degraded = False  # a syncfs failed once: fdatasync each from then on
        self._batch_s = 0.0  # what a batch of `threads` fdatasyncs at once takes (moving mean)
        self._syncfs_after = 0.0  # (loop time) a slow syncfs: fdatasync each until then
        self._backoff_s = BACKOFF_S
        self.rounds = self.syncfs_calls = self.fdatasync_calls = 0  # (for tests and figures)
        self.wal_rounds = 0

    def sync(self, log_: Log, done: Done) -> None:
        self._waiting.setdefault(log_, []).append(done)
        if not self._in_flight:
            self._start()
        elif self._in_flight < self._max_in_flight and not self._start_soon:
            # at the loop's next turn: with what else this turn's callbacks ask
            self._start_soon = True
            asyncio.get_running_loop().call_soon(self._start_deferred)

    def _start_deferred(self) -> None:
        self._start_soon = False
        self._start()

    def _start(self) -> None:
        while self._waiting and self._in_flight < self._max_in_flight:
            waiting, self._waiting = self._waiting, {}
            this = _Round()
            answered: list[Done] = []
            # decided before the tickets are taken: a syncfs round's tickets hold no
            # descriptor (the round's syncfs needs none of theirs), so the logs it covers may
            # release their files at once under the node's cap on open logs (OpenLogs); with a
            # WAL there is no syncfs (see _plan_wal)
            wide = (self._wal is None and not self._degraded and self._now() >= self._syncfs_after
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
            busy = this.each or this.fs_wide or this.walled
            loop = asyncio.get_running_loop() if busy else None
            this.started = loop.time() if loop is not None else 0.0
            if self._wal is not None:
                self._plan_wal(this)
            if loop is not None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="fsync")
                self.rounds += 1
                self._in_flight += 1
                self._pool.submit(self._run_then_answer, this, loop)
            for done in answered:  # (they may sync again: into _waiting, for the next round)
                done(True)

    @staticmethod
    def _now() -> float:
        """The loop's time (0 with no running loop: nothing is waited for then)."""
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return 0.0

    def _plan_wal(self, this: _Round) -> None:
        """With a write-ahead log: a round of `syncfs_from` logs or more whose durable point
        is known (not their first sync since they opened) copies their new bytes to the WAL,
        one fdatasync in all; the others, and every log of a smaller round, fdatasync each
        (cheaper than writing the bytes twice; a log synced in place needs no WAL record)."""
        wal = self._wal
        assert wal is not None
        if self._degraded:
            return
        known = [entry for entry in this.each if entry[1].start is not None]
        if len(known) < self._syncfs_from:
            return
        # their bytes are read here, on the loop's thread (from the page cache, a few
        # microseconds each): read on a pool thread, each pread would give up the GIL and wait
        # up to a switch interval (5 ms) for the busy loop to hand it back, hundreds per round
        walled, each = [], [entry for entry in this.each if entry[1].start is None]
        for log_, ticket, dones in known:
            data = ticket.read()
            ticket.release()  # (read: a WAL round needs no descriptor of its logs, OpenLogs)
            if data is None or ticket.start is None:  # (cut under it: fdatasync it instead)
                each.append((log_, ticket, dones))
            else:
                walled.append((Write(ticket.folder, str(ticket.path), ticket.start, data,
                                     wal.forgets(ticket.folder)), log_, ticket, dones))
        wal.reserve(write.folder for write, _log, _t, _d in walled)  # (before a truncation)
        this.walled, this.each = walled, each

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
        if this.walled:
            self._run_wal(this)
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
        if this.each and not this.fs_wide and not this.walled:  # (else not comparable)
            this.each_s = time.monotonic() - began_each

    def _run_wal(self, this: _Round) -> None:
        """On a pool thread: one WAL write of the round's records and one fdatasync (their
        tickets' descriptors are closed on the loop's thread, at the round's end: a close here
        would wait for the GIL as a pread would). If the WAL fails, each ticket's segment is
        fdatasynced in place, and the syncer fdatasyncs each from then on."""
        wal = self._wal
        assert wal is not None
        try:
            wal.append([write for write, _log, _t, _d in this.walled])
        except OSError as error:
            log.error("WAL write failed; fdatasync of each log from now on", error=str(error))
            self._degraded = True
            for _w, _log, ticket, _d in this.walled:
                ticket.run()
            self.fdatasync_calls += len(this.walled)
        else:
            this.wal_ok = True
            self.wal_rounds += 1

    def _run_then_answer(self, this: _Round, loop: asyncio.AbstractEventLoop) -> None:
        """On a pool thread: the round, then its end handed straight to the loop (one turn of
        a busy loop, where an executor future's result and then its callback took two)."""
        try:
            self._run(this)
        except BaseException as error:  # (a bug, not a disk's error: those are OSErrors kept)
            log.exception("a sync round failed; its logs are taken for broken")
            for ticket in [t for _l, t, _d in this.each] + [t for _v, _l, t, _d in
                                                            this.fs_wide + this.walled]:
                if ticket.error is None:  # whatever it did, nothing of it is known durable
                    ticket.error = OSError(errno.EIO, f"sync round failed: {error!r}")
            this.wal_ok = False
            raise
        finally:
            with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile: at exit)
                loop.call_soon_threadsafe(self._ended, this)

    def _ended(self, this: _Round) -> None:
        self._in_flight -= 1
        self._learn(this)
        if this.wal_ok:
            for _w, _log, ticket, _d in this.walled:
                ticket.covered()
        for log_, ticket, dones in this.each + [(g, t, d) for _v, g, t, d in
                                                this.fs_wide + this.walled]:
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
        """At shutdown, once the logs are closed: let the pool's threads end."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for fd in self._fs_fds.values():
            os.close(fd)
        self._fs_fds.clear()
        if self._wal is not None:
            self._wal.close()
