"""bench/cluster.py --stub-remote only: what the topology applier does, for a checkout that
lacks it. At its start the node creates a RemoteQueue for each `node:queue:type:durable` of
LEVERET_DEV_REMOTE, and forwards a passive queue.declare, queue.purge and queue.delete of one.
Loaded as `sitecustomize` from PYTHONPATH; it does nothing without LEVERET_DEV_REMOTE."""

from __future__ import annotations

import os
from typing import Any

SPEC = os.environ.get("LEVERET_DEV_REMOTE")


def _install_stubs() -> None:
    from pamqp import commands as m

    from leveret.broker.model.remote_queue import RemoteQueue
    from leveret.broker.session import forwarding, topology

    original = forwarding.install

    def install(broker: Any) -> None:
        original(broker)
        vhost = broker.vhosts["/"]
        for item in (SPEC or "").split(","):
            node, name, queue_type, durable = item.split(":")
            arguments = {"x-queue-type": queue_type} if queue_type != "classic" else {}
            vhost.queues[name] = RemoteQueue(
                vhost, name, queue_type=queue_type, node=node, durable=durable == "1",
                auto_delete=False, arguments=arguments, exclusive_elsewhere=False,
                forwarder=broker.forwarder)

    def forwarded(handler: Any, passive_only: bool) -> Any:
        def handle(channel: Any, method: Any) -> None:
            queue = channel.vhost.queues.get(method.queue)
            if isinstance(queue, RemoteQueue) and (not passive_only or method.passive):
                forwarding.forward_queue_method(channel, queue, method)
                return
            handler(channel, method)
        return handle

    forwarding.install = install
    for kind, passive_only in ((m.Queue.Declare, True), (m.Queue.Purge, False),
                               (m.Queue.Delete, False)):
        topology.HANDLERS[kind] = forwarded(topology.HANDLERS[kind], passive_only)


if SPEC:
    _install_stubs()
