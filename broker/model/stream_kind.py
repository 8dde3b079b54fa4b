"""The stream queue type as a declaration sees it: RabbitMQ's rules for rabbit_stream_queue
(no server-named streams; durable, not exclusive, not auto-delete; its segment and filter
size limits, stream_args.py) and the stream it builds, with the replication the composition
root chose for it (one node's, or this node's member of a cluster's).

It must not know the vhost, the session or the cluster (queue_kind.py says what a kind is).
"""

from __future__ import annotations

from collections.abc import Callable

from leveret.broker.model import stream_args
from leveret.broker.model.fields import FieldTable
from leveret.broker.model.queue import Queue, QueueOwner
from leveret.broker.model.queue_kind import DeclareRules
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.storage_env import StorageEnv
from leveret.broker.model.stream import StreamQueue


def one_node() -> Replication:
    return ONE_NODE


class StreamKind(DeclareRules):
    """Streams, kept in `env`; `replication` gives each new stream its replication."""

    server_named = False
    durable_only = True

    def __init__(self, env: StorageEnv, replication: Callable[[], Replication] = one_node) -> None:
        super().__init__("stream")
        self.env = env
        self.replication = replication

    def validate_arguments(self, rs: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                           arguments: FieldTable) -> None:
        super().validate_arguments(rs, durable=durable, exclusive=exclusive,
                                   auto_delete=auto_delete, arguments=arguments)
        stream_args.check_declaration(rs, arguments=arguments)

    def create(self, owner: QueueOwner, name: str, *, durable: bool, exclusive_owner: object,
               auto_delete: bool, arguments: FieldTable, storage_id: str | None) -> Queue:
        return StreamQueue(owner, name, env=self.env, storage_id=storage_id,
                           replication=self.replication(), durable=durable,
                           exclusive_owner=exclusive_owner, auto_delete=auto_delete,
                           arguments=arguments)
