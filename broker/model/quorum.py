"""Quorum queues (`x-queue-type: quorum`): a durable queue whose every message and settlement
is a command in its log, replicated as a stream's log is.

Skeleton: the queue is a durable classic queue whose messages are all persisted, with the
log's replication given when it is created (one node's, or this node's member of a
cluster's). docs/QUORUM-QUEUES.md says what it does.

It must not know AMQP frames, the session or the cluster: it sees the replication port.
Single-threaded: runs on the event loop.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.model.durable import DurableClassicQueue
from leveret.broker.model.queue import QueueOwner
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv


class QuorumQueue(DurableClassicQueue):
    type = "quorum"

    def __init__(self, vhost: QueueOwner, name: str, *, env: StorageEnv,
                 storage_id: str | None = None, replication: Replication = ONE_NODE,
                 **kwargs: Any) -> None:
        super().__init__(vhost, name, env=env, storage_id=storage_id, replication=replication,
                         **kwargs)
        self.replication = replication
