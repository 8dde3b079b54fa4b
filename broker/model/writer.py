"""The writer: the publish path's hop from a queue to its log, one per log.

Streams and durable classic queues alike gather what arrives during one turn of the event loop
into a batch, and the writer owns it: it is scheduled once per turn on the model's Scheduler,
then appended (one chunk for a stream; a durable queue's messages, then its settled and delivered
ranges; a queue's log under fsync `always` is fsynced once per batch, off the event loop, by
the syncer), then committed as the fsync policy says, and then every confirm of the batch is settled
at once. What the batch holds and how it becomes chunks is the queue type's: the writer is given
a factory of empty batches, an `append` that writes one (raising StorageError), and a `failed`
that cleans up after a failed append and says whether the batch's writes still count (True: ack).

The commit point and the confirms are the committer's (`committer.py`), the writer's part: its
`committed_up_to(offset)` is the seam where replication plugs in. The log's replication (the
`Appends` part of the replication.py port, given at construction and kept) answers the rest:
one node's (`OneNode`) is local, so the committer calls it right after the append or fsync;
a replicated stream's leader's is not, and its Shipper calls it when a majority holds the chunk
(broker/cluster/stream_replication.py), so the confirms of the batch go out then, never before.
It says whether the writer may append now (`may_append`: a leader in contact with a quorum) and
is told after each append that wrote (`appended`: the Shipper ships it).

Must not know: AMQP, what the records hold, the queue types, the cluster. It sees a storage Log
through the committer, the model's Scheduler, Confirm objects and the log's replication.
Threading: single-threaded, on the event loop, like the queue that owns it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from leveret.broker.model.committer import Committer
from leveret.broker.model.message import Confirm
from leveret.broker.model.replication import ONE_NODE, Appends
from leveret.broker.model.scheduler import Scheduler
from leveret.broker.model.syncer import INLINE, Syncer
from leveret.storage import Log, StorageError
from leveret.storage.config import FsyncPolicy

B = TypeVar("B")


class Writer(Generic[B]):
    """Owns one log's batch of a turn, its append, the commit point and the confirms."""

    def __init__(self, scheduler: Scheduler, policy: FsyncPolicy, log_of: Callable[[], Log], *,
                 batch: Callable[[], B], append: Callable[[B], None],
                 failed: Callable[[B, StorageError], bool],
                 on_commit: Callable[[], None] | None = None, name: str = "",
                 replication: Appends = ONE_NODE, syncer: Syncer = INLINE) -> None:
        self._scheduler = scheduler
        self._new_batch = batch
        self._append = append
        self._failed = failed
        self._replication = replication
        self.batch = batch()  # what this turn gathered so far; the queue type fills it
        self.confirms: list[Confirm] = []  # the confirms of this turn's batch, in order
        self.scheduled = False
        self.deleted = False
        self.committer = Committer(scheduler, policy, log_of, on_commit, name, replication,
                                   syncer)
        # a replicated stream's new leader before it knows its epoch: it gathers, appends nothing
        self.held = False
        # the replication says the writer may not append now (a leader out of contact with a
        # quorum): the batch waits until resume() or discard()
        self.waiting = False

    @property
    def timer_armed(self) -> bool:
        return self.committer.timer_armed

    def confirm_later(self, confirm: Confirm) -> None:
        """The publish of `confirm` is in this turn's batch: it is settled with the batch."""
        confirm.defer()
        self.confirms.append(confirm)

    def schedule(self) -> None:
        """Something was added to the batch: write it at the end of this turn (once)."""
        if not self.scheduled:
            self.scheduled = True
            self._scheduler.call_soon(self.flush)

    def flush(self) -> None:
        """Append this turn's batch now; its confirms are settled once the commit point covers
        it (at once, after the fsync that covers it, or when a majority holds it). A failed
        append nacks them, unless `failed` says the writes still count."""
        self.scheduled = False
        if self.held and not self.deleted:
            return  # release() writes it, or discard() nacks it
        if not self.deleted and not self._replication.may_append():
            self.waiting = True  # resume() writes it, or discard() nacks it
            return
        batch, self.batch = self.batch, self._new_batch()
        confirms, self.confirms = self.confirms, []
        if self.deleted:
            for confirm in confirms:
                confirm.settle(False)
            return
        try:
            self._append(batch)
        except StorageError as error:
            self.committer.appended(confirms, ok=self._failed(batch, error))
            return
        self.committer.appended(confirms)
        self._replication.appended()

    def hold(self) -> None:
        """Append nothing until release() or discard(): what arrives waits in the batch."""
        self.held = True

    def release(self) -> None:
        """Append what waited, and from now on as usual."""
        self.held = False
        self.flush()

    def resume(self) -> None:
        """The replication's `may_append` may say yes again: write what waited for it."""
        if self.waiting:
            self.waiting = False
            self.schedule()

    def discard(self) -> None:
        """Drop what waited unwritten and nack its confirms (this node will not write it)."""
        self.held = False
        self.waiting = False
        self.scheduled = False
        self.batch = self._new_batch()
        confirms, self.confirms = self.confirms, []
        for confirm in confirms:
            confirm.settle(False)

    def committed_up_to(self, offset: int) -> None:
        """The commit point: see Committer.committed_up_to."""
        self.committer.committed_up_to(offset)

    def commit(self) -> None:
        """fsync now what the policy left pending, and settle what that commits."""
        self.committer.commit()

    def commit_pending(self) -> None:
        """Shutdown, before connections close: write this turn's batch, fsync what the policy
        left pending and confirm it."""
        if self.scheduled:
            self.flush()
        self.committer.commit()

    def close(self) -> None:
        """Shutdown or a restart of the log (before it closes): write this turn's batch, cancel
        the timer, fsync what is pending and settle its confirms."""
        if self.held or self.waiting:
            self.discard()
        if not self.deleted:
            self.flush()
        self.committer.close()

    def delete(self) -> None:
        """The queue is deleted (before its log closes): what it gathers from now on is nacked;
        what was written is fsynced and confirmed, and the timer is cancelled."""
        self.deleted = True
        self.committer.close()
