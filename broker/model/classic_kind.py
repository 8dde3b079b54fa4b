"""The classic queue type as a declaration sees it: RabbitMQ's rules for rabbit_classic_queue,
and which classic queue it builds (one kept in the log when durable and the broker gave a
storage environment; one in memory otherwise).

It must not know the vhost, the session or the cluster (queue_kind.py says what a kind is).
"""

from __future__ import annotations

from leveret.broker.model.durable import DurableClassicQueue
from leveret.broker.model.fields import FieldTable
from leveret.broker.model.queue import ClassicQueue, Queue, QueueOwner
from leveret.broker.model.queue_kind import DeclareRules
from leveret.broker.model.storage_env import StorageEnv


class ClassicKind(DeclareRules):
    """Classic queues; `env`: where durable ones keep their messages (None: all in memory,
    as in unit tests)."""

    def __init__(self, env: StorageEnv | None = None) -> None:
        super().__init__("classic")
        self.env = env

    def create(self, owner: QueueOwner, name: str, *, durable: bool, exclusive_owner: object,
               auto_delete: bool, arguments: FieldTable, storage_id: str | None) -> Queue:
        if durable and self.env is not None:
            return DurableClassicQueue(owner, name, durable=True, env=self.env,
                                       storage_id=storage_id, exclusive_owner=exclusive_owner,
                                       auto_delete=auto_delete, arguments=arguments)
        return ClassicQueue(owner, name, durable=durable, exclusive_owner=exclusive_owner,
                            auto_delete=auto_delete, arguments=arguments)
