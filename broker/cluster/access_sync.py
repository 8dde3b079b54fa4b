"""Applies the cluster's vhosts, users, permissions and policies from the topology cache to
this node. (Being built.)

It must not know AMQP or the sessions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leveret.broker.broker import Broker


def install(broker: Broker) -> None:
    """Register the cache callbacks that keep `broker`'s vhosts, users and policies current."""
