"""Forwarding to the node that holds a queue, over the node-to-node link. (Being built.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leveret.broker.broker import Broker


def install(broker: Broker) -> None:
    """Register the link handlers with which this node serves queues to the other nodes."""
