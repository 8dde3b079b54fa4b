"""The quorum queue type as a declaration sees it: RabbitMQ's rules for rabbit_quorum_queue
(no server-named queues; the arguments args.py lists for the type, checked by its generic
validators, the keys of other types refused; durable, not exclusive, not auto-delete, checked
after the arguments) and the quorum queue it builds, with the replication the composition root
chose for it (one node's, or this node's member of a cluster's). docs/QUORUM-QUEUES.md
("Declaring") lists the rules and where RabbitMQ 3.10 differs.

It must not know the vhost, the session or the cluster (queue_kind.py says what a kind is).
"""

from __future__ import annotations

from collections.abc import Callable

from leveret.broker.model.fields import FieldTable
from leveret.broker.model.queue import Queue, QueueOwner
from leveret.broker.model.queue_kind import DeclareRules
from leveret.broker.model.quorum import QuorumQueue
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv


def one_node() -> Replication:
    return ONE_NODE


class QuorumKind(DeclareRules):
    """Quorum queues, kept in `env`; `replication` gives each new queue its replication."""

    server_named = False
    durable_only = True

    def __init__(self, env: StorageEnv, replication: Callable[[], Replication] = one_node) -> None:
        super().__init__("quorum")
        self.env = env
        self.replication = replication

    def create(self, owner: QueueOwner, name: str, *, durable: bool, exclusive_owner: object,
               auto_delete: bool, arguments: FieldTable, storage_id: str | None) -> Queue:
        return QuorumQueue(owner, name, env=self.env, storage_id=storage_id,
                           replication=self.replication(), durable=durable,
                           exclusive_owner=exclusive_owner, auto_delete=auto_delete,
                           arguments=arguments)
