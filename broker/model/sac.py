"""Single active consumer on streams, over AMQP 0.9.1 (a Leveret extension).

Consumers of one stream that pass `x-single-active-consumer: true` and share a consumer tag
form a group named by that tag. Only one member receives messages. On a plain stream it is the
earliest registered member; on a partition of a super stream it is member `index mod n` in
registration order, where index is the partition's position, so a group that subscribes to
every partition spreads across them as RabbitMQ's super stream SAC does. When the active member
goes away, or a member joins and the choice changes, the old one stops receiving, and once it
has settled what it was given (or after a timeout) its position is stored and the new one
resumes right after it, so nothing is delivered twice while members ack.

In a cluster, a replicated stream's groups live on its leader. Every member first goes to the
stream's replication (replication.py, `join_group`): one node's keeps it here; a replica's
member that reads from that replica (a stream-protocol subscription) is registered with the
leader's group instead (broker/cluster/stream_sac.py); in that group it is a member whose sink
has `step_up`/`step_down`: the group tells it, not the queue, when it becomes active or inactive.

Must not know: the cluster, AMQP. Single-threaded; knows the stream queue only through
attach/deactivate/pump/partition_index, and its replication.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.model.consumer import Consumer
from leveret.broker.model.replication import Replication

SUPER_STREAM_ARG = "x-super-stream"  # a member's super stream, by name


class SacGroups:
    def __init__(self, stream: Any, replication: Replication) -> None:
        self.stream = stream
        self.replication = replication
        self.groups: dict[str, list[Consumer]] = {}

    def join(self, consumer: Consumer) -> None:
        consumer.state.tracking = True
        consumer.state.active = False
        if self.replication.join_group(consumer):
            return  # a replica's member: the group is the leader's
        self.groups.setdefault(consumer.tag, []).append(consumer)
        self.rebalance(consumer.tag)

    def leave(self, consumer: Consumer) -> None:
        self.replication.leave_group(consumer)
        members = self.groups.get(consumer.tag)
        if not members or consumer not in members:
            return
        members.remove(consumer)
        if members:
            self.rebalance(consumer.tag)
        else:
            del self.groups[consumer.tag]

    def active(self, tag: str) -> Consumer | None:
        for member in self.groups.get(tag, []):
            if member.state is not None and member.state.active:
                return member
        return None

    def rebalance(self, tag: str) -> None:
        members = self.groups.get(tag)
        if not members:
            return
        # the super stream its first member named (a stream-protocol subscription's), as
        # RabbitMQ's coordinator takes the index its group was made with
        index = self.stream.partition_index(members[0].arguments.get(SUPER_STREAM_ARG))
        wanted = members[0] if index < 0 else members[index % len(members)]
        for member in members:
            if member is not wanted and member.state.active:
                step_down = getattr(member.sink, "step_down", None)  # a member elsewhere
                if step_down is not None:
                    step_down(member)
                else:
                    self.stream.deactivate(member)
        if any(member.state.draining for member in members):
            return  # the next owner starts once the old one has settled what it was given
        if not wanted.state.active:
            step_up = getattr(wanted.sink, "step_up", None)
            if step_up is not None:
                step_up(wanted)
                return
            self.stream.attach(wanted, prefer_stored=True)
            self.stream.pump(wanted)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "reference": tag,
                "consumers": [
                    {"tag": m.tag, "active": bool(m.state and m.state.active)} for m in members
                ],
            }
            for tag, members in self.groups.items()
        ]
