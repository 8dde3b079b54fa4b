"""A queue held by another node of the cluster, as this node's model sees it.

Every node has every queue of the cluster in its vhosts, so that bindings and routing work the
same everywhere; a queue whose record names another node is one of these. It has the queue's
identity, type, flags and arguments, and hands what must happen to the queue (a routed message,
a consumer, a get) to `forwarder`, which reaches the holding node. (Being built: forwarding.)

It must not know the link or AMQP: the forwarder is given to it.
Single-threaded: every method runs on the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.model.queue import Queue

if TYPE_CHECKING:
    from leveret.broker.model.vhost import VHost

ELSEWHERE = object()  # the exclusive owner of a queue exclusive to a connection on another node


class RemoteQueue(Queue):
    def __init__(self, vhost: VHost, name: str, *, queue_type: str, node: str, durable: bool,
                 auto_delete: bool, arguments: dict[str, Any], exclusive_elsewhere: bool,
                 forwarder: Any) -> None:
        super().__init__(vhost, name, durable=durable,
                         exclusive_owner=ELSEWHERE if exclusive_elsewhere else None,
                         auto_delete=auto_delete, arguments=arguments)
        self.type = queue_type
        self.node = node
        self.forwarder = forwarder
