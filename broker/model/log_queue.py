"""A queue kept in a log that a cluster replicates: what the cluster's replication drives.

Streams (stream.py) and quorum queues (quorum.py) are both a log with a writer; in a cluster,
each member node holds the queue and its log, and broker/cluster/stream_replication.py makes
this node's copy the leader (its writer ships, confirms at a quorum) or a replica (its log
takes the leader's chunks). It tells the queue when its role changed (`took_role`): a stream
has nothing to do then; a quorum queue builds its state from its log as a new leader, and
drops it as a replica.

It must not know the cluster, etcd or AMQP.
"""

from __future__ import annotations

from typing import Any, Protocol

from leveret.broker.model.queue import Queue, QueueOwner
from leveret.broker.model.replication import Replication
from leveret.broker.model.writer import Writer
from leveret.storage import Log


class LogQueue(Protocol):
    """A stream or a quorum queue, as its replication drives it."""

    name: str
    storage_id: str
    deleted: bool
    replication: Replication
    log: Log
    writer: Writer[Any]

    @property
    def vhost(self) -> QueueOwner: ...

    @property
    def role(self) -> str: ...

    @property
    def commit_bound(self) -> int | None: ...

    def dispatch(self) -> None:
        """The commit point moved (a replica's): what is committed may be read or applied."""
        ...

    def took_role(self) -> None:
        """The replication made this copy the leader, a replica, or neither (`role`)."""
        ...


class MemberAnswers:
    """What a log queue answers from its replication, one place for streams, quorum queues and
    delayed exchanges' logs: put it first among a queue class's bases."""

    replication: Replication

    @property
    def role(self) -> str:
        """"" on one node (or not a member yet), "leader" or "replica"."""
        return self.replication.role

    @property
    def members(self) -> tuple[str, ...]:
        return self.replication.members

    @property
    def commit_bound(self) -> int | None:
        """The commit point readers, counts and deliveries stop at (what a majority holds);
        None: the log's own committed offset."""
        return self.replication.commit_bound

    @property
    def forward_to(self) -> Queue | None:
        """A replica's: the leader's queue, which serves everything but the log."""
        return self.replication.forward_to
