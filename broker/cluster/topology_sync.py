"""Applies the cluster's exchanges, queues and bindings from the topology cache to this node's
model. (Being built: see docs/CLUSTER.md, "Topology in etcd".)

It must not know AMQP or the sessions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leveret.broker.broker import Broker


def install(broker: Broker) -> None:
    """Register the cache callbacks that keep `broker`'s vhosts in step with etcd."""
