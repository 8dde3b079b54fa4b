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

from leveret.broker.model.queue import QueueOwner
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
