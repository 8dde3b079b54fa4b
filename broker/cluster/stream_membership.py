"""Changing a replicated stream's members (add_replica, delete_replica) and reading every
member's status from any node.

A change is one etcd transaction that compares the mod revisions of the stream's queue record
and of its leadership key with those just read, and puts both with the new `members` (the
leader and the epoch unchanged): of two changes racing on the same stream only one is written
(fencing), the other is told to try again. Every node's topology sync then applies the record:
a new member's node makes a replica on an empty log (the leader's shipper syncs it from offset
0, so it catches up with the whole log), a removed member's node deletes its replica and its
local log, and the leader ships to the new set of replicas.

RabbitMQ's rules (rabbit_stream_queue and rabbit_stream_coordinator): the node must be running
(`node_not_running`); no replica may be out of sync when one is added; adding a member that is
already one, or deleting a node that is not one, changes nothing and succeeds; the last member
cannot be deleted. RabbitMQ deletes the leader's own membership by electing another leader;
Leveret refuses it (see LEADER_TEXT).

Status: the leader knows every member's progress (its shipper's acknowledgements), so a node
that does not lead the stream asks the leader's node (`stream.status` over the node link).

It knows the queue records, the leadership key, the links and the replication wiring; nothing
of HTTP or AMQP. Asyncio: one event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.cluster.etcd_types import Compare, Put
from leveret.broker.cluster.link import Link, LinkError
from leveret.broker.cluster.stream_leadership import StreamLeadership
from leveret.broker.cluster.stream_leadership import _decode as decode_leadership
from leveret.broker.cluster.stream_leadership import _encode as encode_leadership
from leveret.broker.cluster.topology_records import QueueRecord, decode, encode

if TYPE_CHECKING:
    from leveret.broker.cluster.stream_replication import StreamReplication

STATUS = "stream.status"
STATUS_TIMEOUT_S = 5.0
NOT_RUNNING_TEXT = "node_not_running: node '{node}' is not a running node of this cluster"
OUT_OF_SYNC_TEXT = ("disallowed, out_of_sync_replica: the replica of stream '{name}' on node "
                    "'{replica}' is not in sync with its leader")
LAST_TEXT = "Cannot delete the last member of a stream"
LEADER_TEXT = ("Cannot delete the replica of stream '{name}' on node '{node}': it is the "
               "stream's leader (Leveret does not move a leader on delete_replica)")
RACE_TEXT = "The members of stream '{name}' changed meanwhile; try again"


class MembershipError(Exception):
    """A refused change or status, with the text the CLI prints; `status` is the HTTP one."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


StatusOf = Callable[[str, str], dict[str, Any] | None]


class StreamMembership:
    def __init__(self, replication: StreamReplication) -> None:
        self.replication = replication
        self.cluster = replication.cluster
        # the management layer says how a local stream's status reads (streamops.status)
        self.local_status: StatusOf = lambda _vhost, _name: None
        self.cluster.links.handlers.on_request(STATUS, self._status)

    # -- status

    async def _status(self, _link: Link, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ValueError("stream.status needs {vhost, name}")
        found = self.local_status(str(body.get("vhost")), str(body.get("name")))
        if found is None:
            raise LookupError("this node does not lead that stream")
        return found

    async def status(self, record: QueueRecord) -> dict[str, Any] | None:
        """The stream's status as its leader's node reads it (every member's row), or None
        if that node cannot be asked."""
        if record.node == self.cluster.node:
            return self.local_status(record.vhost, record.name)
        link = self.cluster.links.link_to(record.node)
        if link is None:
            return None
        with contextlib.suppress(LinkError, TimeoutError, ValueError):
            answer = await link.call(STATUS, {"vhost": record.vhost, "name": record.name},
                                     timeout=STATUS_TIMEOUT_S)
            return answer if isinstance(answer, dict) else None
        return None

    # -- changes

    def running(self) -> set[str]:
        return {self.cluster.node, *self.cluster.links.records}

    async def add(self, vhost: str, name: str, node: str) -> bool:
        """Add `node` as a member; False if it already is one (nothing changes)."""
        if node not in self.running():
            raise MembershipError(NOT_RUNNING_TEXT.format(node=node))
        record, leadership = await self._read(vhost, name)
        members = record.members or (record.node,)
        if node in members:
            return False
        status = await self.status(record) if len(members) > 1 else None
        if len(members) > 1:
            rows = (status or {}).get("members") or []
            if status is None:
                raise MembershipError(OUT_OF_SYNC_TEXT.format(name=name, replica=record.node))
            for row in rows:
                if row.get("role") == "replica" and not row.get("synced", True):
                    raise MembershipError(OUT_OF_SYNC_TEXT.format(name=name,
                                                                  replica=row.get("node")))
        await self._write(record, leadership, (*members, node))
        return True

    async def delete(self, vhost: str, name: str, node: str) -> bool:
        """Remove `node`'s membership; False if it is not a member (nothing changes)."""
        record, leadership = await self._read(vhost, name)
        members = record.members or (record.node,)
        if len(members) <= 1:
            raise MembershipError(LAST_TEXT)
        if node not in members:
            return False
        if node == record.node:
            raise MembershipError(LEADER_TEXT.format(name=name, node=node))
        await self._write(record, leadership, tuple(m for m in members if m != node))
        return True

    async def _read(self, vhost: str, name: str) -> tuple[QueueRecord, StreamLeadership | None]:
        store = self.cluster.store
        queue_key = store.keys.queue(vhost, name)
        try:
            kv = await self.cluster.client.get(queue_key)
            lead_kv = await self.cluster.client.get(
                self.replication.leaderships.key(vhost, name))
        except EtcdException as exc:
            raise MembershipError(f"cannot reach etcd: {exc}", 503) from None
        record = decode("queues", kv) if kv is not None else None
        if not isinstance(record, QueueRecord) or record.type != "stream":
            raise MembershipError("The stream does not exist", 404)
        leadership = decode_leadership(vhost, name, lead_kv) if lead_kv is not None else None
        return record, leadership

    async def _write(self, record: QueueRecord, leadership: StreamLeadership | None,
                     members: tuple[str, ...]) -> None:
        """One txn: the queue record and the leadership key with `members`, both unchanged
        since they were read."""
        queue_key = self.cluster.store.keys.queue(record.vhost, record.name)
        lead_key = self.replication.leaderships.key(record.vhost, record.name)
        new_lead = StreamLeadership(record.vhost, record.name, members, record.node,
                                    leadership.epoch if leadership is not None else 1)
        compares = [Compare.mod_revision(queue_key, "==", record.mod_revision),
                    Compare.mod_revision(lead_key, "==", leadership.mod_revision)
                    if leadership is not None else Compare.version(lead_key, "==", 0)]
        new_record = dataclasses.replace(record, members=members)
        try:
            result = await self.cluster.client.txn(
                compares, [Put(queue_key, encode(new_record)),
                           Put(lead_key, encode_leadership(new_lead))])
        except EtcdException as exc:
            raise MembershipError(f"cannot reach etcd: {exc}", 503) from None
        if not result.succeeded:
            raise MembershipError(RACE_TEXT.format(name=record.name), 409)
        with contextlib.suppress(TimeoutError):
            await self.cluster.settle(result.revision)


__all__ = ["STATUS", "MembershipError", "StreamMembership"]
