"""A stream this node leads (`Led`): what the replication keeps per led stream, shared by the
replication that makes it (stream_replication.py) and the membership change that stops and
resumes it (stream_membership.py), so that neither imports the other for it.

A record of plain state: it knows the model's LogQueue (a stream or a quorum queue), the
stream member, the queue record and the shipper; it must not know the replication that drives
it, etcd or AMQP.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from leveret.broker.cluster.replication import Shipper
from leveret.broker.cluster.stream_member import StreamMember
from leveret.broker.cluster.topology_records import QueueRecord
from leveret.broker.model.log_queue import LogQueue


@dataclass
class Led:
    """A stream this node leads."""

    queue: LogQueue
    member: StreamMember
    key: str
    record: QueueRecord
    shipper: Shipper | None = None
    task: asyncio.Task[None] | None = None
    closed: bool = field(default=False)
    fence: int = 0  # the newest epoch a replica said it was fenced at


__all__ = ["Led"]
