"""This node's member of a stream or a quorum queue in a cluster: the model's replication port
(broker/model/replication.py) as a cluster node answers it.

Every stream queue of a cluster node is made with a `StreamMember` (the broker's queue factory),
and keeps it. Until stream_replication.py attaches it to the record of a replicated stream this
node is a member of, and again once it is detached, it answers as one node does, except that:

- as the leader (`lead`), the commit point is not the log's own: the Shipper's `on_commit`
  moves it when a majority holds a chunk; while it ships (`ship`), the writer appends only in
  contact with a quorum and each append is shipped;
- as a replica (`replicate`), publishes go to the leader's queue (a RemoteQueue), consumer
  offsets go to the leader, which writes them into the log, and the single-active-consumer
  groups are the leader's (`use_groups`: broker/cluster/stream_sac.py);
- once attached, stream_status's member rows and a restart of the log are the replication's.

StreamReplication (and StreamSac) drive it through these methods; the queue only asks. What it
asks of them is typed here by what it uses (`Wiring`, `Groups`), so that this module imports
neither.

It knows the model's LogQueue (a stream or a quorum queue), Queue and Consumer, and the
Shipper; not etcd, links, AMQP.
Single-threaded, on the event loop.
"""

from __future__ import annotations

from typing import Any, Protocol

from leveret.broker.cluster.replication import Shipper
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.log_queue import LogQueue
from leveret.broker.model.queue import Queue
from leveret.broker.model.stream import StreamQueue


class Wiring(Protocol):
    """What an attached member asks of its node's replication (StreamReplication)."""

    def restarted(self, queue: LogQueue, key: str) -> None: ...

    def member_rows(self, queue: LogQueue, key: str,
                    local: dict[str, Any]) -> list[dict[str, Any]]: ...

    def send_offsets(self, key: str, leader: str, offsets: dict[bytes, int]) -> None: ...


class Groups(Protocol):
    """The leader's single-active-consumer groups, as a replica's node reaches them."""

    def join(self, queue: StreamQueue, consumer: Consumer) -> bool: ...

    def leave(self, queue: StreamQueue, consumer: Consumer) -> None: ...

    def stepped_down(self, queue: StreamQueue, consumer: Consumer) -> None: ...


class StreamMember:
    """A stream's replication on a cluster node (model/replication.Replication)."""

    def __init__(self) -> None:
        self.role = ""
        self.members: tuple[str, ...] = ()
        self.commit_bound: int | None = None
        self.local = True  # the leader's commit point is the Shipper's (from `lead` on)
        self.forward_to: Queue | None = None  # a replica's: the leader's queue
        self._shipper: Shipper | None = None  # the leader's, while its writer ships
        self._leader: str | None = None  # a replica's: the node that stores its offsets
        self._groups: Groups | None = None  # a replica's: the leader's SAC groups
        # once attached: its queue, its key, and the replication that drives it
        self._attached: tuple[LogQueue, str, Wiring] | None = None

    # -- what the model asks (model/replication.py)

    def may_append(self) -> bool:
        return self._shipper.may_write() if self._shipper is not None else True

    def appended(self) -> None:
        if self._shipper is not None:
            self._shipper.appended()

    def store_at_leader(self, offsets: dict[bytes, int]) -> bool:
        if self._leader is None or self._attached is None:
            return False
        _queue, key, wiring = self._attached
        wiring.send_offsets(key, self._leader, offsets)
        return True

    def restarted(self) -> None:
        if self._attached is not None:
            queue, key, wiring = self._attached
            wiring.restarted(queue, key)

    def member_rows(self, local: dict[str, Any]) -> list[dict[str, Any]]:
        if self._attached is None:
            return [local]
        queue, key, wiring = self._attached
        return wiring.member_rows(queue, key, local)

    def join_group(self, consumer: Consumer) -> bool:
        queue = self._queue()
        return self._groups is not None and queue is not None and self._groups.join(
            queue, consumer)

    def leave_group(self, consumer: Consumer) -> None:
        queue = self._queue()
        if self._groups is not None and queue is not None:
            self._groups.leave(queue, consumer)

    def stepped_down(self, consumer: Consumer) -> None:
        queue = self._queue()
        if self._groups is not None and queue is not None:
            self._groups.stepped_down(queue, consumer)

    def _queue(self) -> StreamQueue | None:
        """The stream whose groups these are (a quorum queue's are never elsewhere)."""
        queue = self._attached[0] if self._attached is not None else None
        return queue if isinstance(queue, StreamQueue) else None

    # -- what the replication does with it (stream_replication.py, stream_sac.py)

    def attach(self, queue: LogQueue, key: str, wiring: Wiring,
               members: tuple[str, ...]) -> None:
        """A member of the replicated stream `key`: its rows and restarts are `wiring`'s."""
        self._attached = (queue, key, wiring)
        self.members = members

    def members_changed(self, members: tuple[str, ...]) -> None:
        """add_replica or delete_replica: the same role, with these members."""
        self.members = members

    def lead(self) -> None:
        """The leader: nothing is readable, or committed, until a majority holds it."""
        self.role = "leader"
        self.commit_bound = -1
        self.local = False

    def ship(self, shipper: Shipper | None) -> None:
        """The writer's appends go to `shipper`, and wait for its quorum (None: neither)."""
        self._shipper = shipper

    def replicate(self, leader: str, leader_queue: Queue) -> None:
        """A replica of `leader`'s log: nothing is readable until the leader says it is
        committed; publishes go to `leader_queue`, consumer offsets to `leader`."""
        self.role = "replica"
        self.commit_bound = -1
        self._leader = leader
        self.forward_to = leader_queue

    def detach(self) -> None:
        """Neither leader nor replica (the commit bound stays until it is attached again)."""
        self.forward_to = None
        self._leader = None
        self.role = ""

    def committed(self, offset: int) -> None:
        """A majority holds everything up to `offset`: readers may go that far."""
        self.commit_bound = max(offset, self.commit_bound or -1)

    def keep_bound(self, bound: int | None) -> None:
        """Attached again: readers never go back behind what they could read (`bound`)."""
        if bound is not None and self.commit_bound is not None:
            self.commit_bound = max(self.commit_bound, bound)

    def use_groups(self, groups: Groups | None) -> None:
        """A replica's groups are the leader's, reached through `groups` (None: its own)."""
        self._groups = groups


def member_of(queue: object) -> StreamMember | None:
    """The cluster member a stream or a quorum queue was made with (None: another type, or
    one node's)."""
    replication = getattr(queue, "replication", None)
    return replication if isinstance(replication, StreamMember) else None
