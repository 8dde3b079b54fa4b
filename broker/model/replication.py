"""A stream's replication, as the model sees it: one port, given when the queue is created.

Everything in which a stream on one node and a member of a replicated stream differ is asked of
one object, its `Replication`, which the queue gets in its constructor and keeps:

- the writer and the committer (writer.py, committer.py) ask the `Appends` part: is the log's
  own committed offset the commit point (`local`), may the writer append now (`may_append`), and
  who is told after an append wrote (`appended`: a leader ships it);
- the stream queue (stream.py) asks where its readers and counts stop (`commit_bound`), its
  `role`, the leader's queue a replica's publishes go to (`forward_to`), whether consumer offsets
  are stored by the leader (`store_at_leader`), stream_status's rows of every member
  (`member_rows`), and what follows a restart of its log (`restarted`);
- the single-active-consumer groups (sac.py) ask whether a member's group lives on another node
  (`join_group`, `leave_group`, `stepped_down`).

`OneNode` (`ONE_NODE`) answers for one node: local, committed at fsync, every group here. A
cluster node's streams get a member of its own (broker/cluster/stream_member.py), driven by the
cluster's replication.

Must not know: the cluster, etcd, links, AMQP. It sees the model's Queue and Consumer.
Threading: single-threaded, on the event loop, like the queue that owns it.
"""

from __future__ import annotations

from typing import Any, Protocol

from leveret.broker.model.consumer import Consumer
from leveret.broker.model.queue import Queue


class Appends(Protocol):
    """The writer's and the committer's part of a log's replication."""

    @property
    def local(self) -> bool:
        """True: the log's own committed offset is the commit point. False: the replication
        moves it (`Writer.committed_up_to`), when a majority holds the chunk."""
        ...

    def may_append(self) -> bool:
        """May the writer append now? If not, its batch waits (Writer.resume, Writer.discard)."""
        ...

    def appended(self) -> None:
        """An append wrote (a leader ships it)."""
        ...


class Replication(Appends, Protocol):
    """A stream's replication: what its queue asks, beyond the writer's part."""

    @property
    def role(self) -> str:
        """"" (one node, or not a member yet), "leader" or "replica"."""
        ...

    @property
    def members(self) -> tuple[str, ...]:
        """The nodes of the stream's members (none on one node)."""
        ...

    @property
    def commit_bound(self) -> int | None:
        """The commit point readers and counts stop at; None: the log's own committed offset."""
        ...

    @property
    def forward_to(self) -> Queue | None:
        """A replica's: the leader's queue, which writes and confirms its publishes."""
        ...

    def store_at_leader(self, offsets: dict[bytes, int]) -> bool:
        """Consumer offsets to store: True if they went to the leader (a replica), False if
        this node's log stores them."""
        ...

    def restarted(self) -> None:
        """restart() reopened the log."""
        ...

    def member_rows(self, local: dict[str, Any]) -> list[dict[str, Any]]:
        """stream_status's rows of every member, given this node's (`local`)."""
        ...

    def join_group(self, consumer: Consumer) -> bool:
        """A single-active-consumer member joins: True if its group is on another node (the
        leader's), which then says when it is active; False: the group is this queue's."""
        ...

    def leave_group(self, consumer: Consumer) -> None:
        """A member leaves (its group may be on another node)."""
        ...

    def stepped_down(self, consumer: Consumer) -> None:
        """A member made inactive is done (its group may be on another node)."""
        ...


class OneNode:
    """One node: the log is local, committed at fsync, and every group is here."""

    local = True
    role = ""
    members: tuple[str, ...] = ()
    commit_bound: int | None = None
    forward_to: Queue | None = None

    def may_append(self) -> bool:
        return True

    def appended(self) -> None:
        pass

    def store_at_leader(self, offsets: dict[bytes, int]) -> bool:
        return False

    def restarted(self) -> None:
        pass

    def member_rows(self, local: dict[str, Any]) -> list[dict[str, Any]]:
        return [local]

    def join_group(self, consumer: Consumer) -> bool:
        return False

    def leave_group(self, consumer: Consumer) -> None:
        pass

    def stepped_down(self, consumer: Consumer) -> None:
        pass


ONE_NODE = OneNode()  # it holds no state: every one-node log shares it
