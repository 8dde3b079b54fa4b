"""The committer: the writer's part that owns the commit point, the fsync timer and the confirms.

The writer (`writer.py`) appends a turn's batch; what must follow the append lives here. The
confirms of an append wait for the last offset written so far, and are settled, in the order the
appends came, when the commit point covers it. The commit point moves through one method,
`committed_up_to(offset)`: when the log's replication says it is `local` (one node: the
replication.py port's `OneNode`), the committer calls it itself with the log's committed offset,
right after an append or an fsync; otherwise (a replicated stream's leader) the replication has
it called when a majority holds the chunk (broker/cluster/stream_replication.py). The storage
engine commits according to the fsync policy:

- `never`: at the write, with no fsync; the confirms go at once.
- `always`: at the write, after the fsync of every chunk; the confirms go at once. A queue's log
  (`LogConfig.fsync_on_write` False) is fsynced after the append instead, once for the batch,
  by the syncer (`syncer.py`: a thread, off the event loop); the commit point moves, and the
  confirms go, when that fsync ends. A replicated leader's own copy counts towards the
  majority from then on (`Log.kept_next`), so the replication is told again (`appended`).
- every N ms: at an fsync. The engine fsyncs inline on an append once N ms have passed since
  its last fsync; otherwise the committer's timer, armed by the first append left unsynced,
  fires N ms later, fsyncs and settles what that covered. So a lone publish is confirmed at
  most N ms (plus a turn of the loop) after its write, never before its fsync.

A failed write or fsync nacks the confirms that wait on it, in the same order.

Must not know: AMQP, what the records hold, the queue types, the cluster. It sees a storage Log
(synchronous), the model's Scheduler for its timer, Confirm objects, and the `Appends` part of
the log's replication, given at construction.
Threading: single-threaded, on the event loop, like the queue that owns it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from leveret.broker.model.message import Confirm
from leveret.broker.model.replication import ONE_NODE, Appends
from leveret.broker.model.scheduler import Scheduler, Timer
from leveret.broker.model.syncer import INLINE, Syncer
from leveret.broker.process import logs
from leveret.storage import Log, StorageError
from leveret.storage.config import FsyncPolicy

log = logs.get("leveret.committer")


def interval_ms(policy: FsyncPolicy) -> int | None:
    """The N of fsync every N ms, or None for `never` and `always`."""
    return policy if isinstance(policy, int) and not isinstance(policy, bool) else None


class Committer:
    """Settles confirms once their writes are committed; owns the fsync timer of one log."""

    def __init__(self, scheduler: Scheduler, policy: FsyncPolicy, log_of: Callable[[], Log],
                 on_commit: Callable[[], None] | None = None, name: str = "",
                 replication: Appends = ONE_NODE, syncer: Syncer = INLINE) -> None:
        self._scheduler = scheduler
        self._syncer = syncer
        self._closed = False
        self._interval = interval_ms(policy)
        self._log_of = log_of  # the log now (a stream's restart reopens it)
        self._on_commit = on_commit  # what newly committed data wakes (a stream's consumers)
        self._name = name
        # local: the log's own committed offset is the commit point; if not, the replication
        # (a majority holds the chunk) calls committed_up_to
        self._replication = replication
        self.committed = log_of().committed_offset  # the commit point
        # (the last offset written when the append was made, its confirms, ack or nack)
        self._waiting: deque[tuple[int, list[Confirm], bool]] = deque()
        self._timer: Timer | None = None

    @property
    def timer_armed(self) -> bool:
        return self._timer is not None

    def appended(self, confirms: list[Confirm], ok: bool = True) -> None:
        """After an append (or a turn with nothing to write, or a failed write when `ok` is
        False): `confirms` wait behind everything written so far. Settle what is committed;
        under fsync every N ms, arm the timer if something written is not committed yet."""
        current = self._log_of()
        if confirms:
            self._waiting.append((current.next_offset - 1, confirms, ok))
        self.committed_up_to(current.committed_offset if self._replication.local
                             else self.committed)
        if self._interval is not None and self._timer is None and self._uncommitted(current):
            self._timer = self._scheduler.call_later(self._interval, self._due)
        if current.awaits_sync:
            self._syncer.sync(current, self._synced)

    def _synced(self, ok: bool) -> None:
        """The syncer's fsync of what was appended ended (ok False: it failed, the log is
        broken, and every waiting confirm is nacked)."""
        if self._closed:
            return
        if not ok:
            self._fail()
            return
        if self._replication.local:
            self.committed_up_to(self._log_of().committed_offset)
        else:
            self._replication.appended()  # the leader's own copy is kept now: it counts

    def commit(self) -> bool:
        """fsync now if something written is not committed yet, and settle what is committed.
        True if the committed offset moved. A failed fsync nacks every waiting confirm."""
        current = self._log_of()
        before = current.committed_offset
        if self._uncommitted(current):
            try:
                current.sync()
            except StorageError as error:
                log.error("fsync failed; waiting publishes are nacked", log=self._name,
                          error=str(error))
                self._fail()
                return False
        if self._replication.local:
            self.committed_up_to(current.committed_offset)
        return current.committed_offset != before

    def committed_up_to(self, offset: int) -> None:
        """The seam: everything up to `offset` is committed. Settle the confirms that covers, in
        order, and wake what newly committed data wakes."""
        moved = offset > self.committed
        self.committed = offset
        waiting = self._waiting
        while waiting and waiting[0][0] <= offset:
            _offset, confirms, ok = waiting.popleft()
            for confirm in confirms:
                confirm.settle(ok)
        if moved and self._on_commit is not None:
            self._on_commit()

    def close(self) -> None:
        """Shutdown, a restart of the log or the queue's deletion (before the log closes):
        cancel the timer, fsync what is pending and settle its confirms."""
        self._closed = True  # a syncer's fsync that ends later changes nothing here
        self._cancel()
        self.commit()
        self._fail()  # nothing should be left; if it is, its data cannot be committed now

    def _due(self) -> None:
        self._timer = None
        self.commit()

    @staticmethod
    def _uncommitted(current: Log) -> bool:
        return current.committed_offset < current.next_offset - 1

    def _fail(self) -> None:
        waiting, self._waiting = self._waiting, deque()
        for _offset, confirms, _ok in waiting:
            for confirm in confirms:
                confirm.settle(False)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
