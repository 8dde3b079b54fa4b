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
cannot be deleted. Deleting the leader's own membership elects another leader first, as
RabbitMQ's coordinator does: the leader's node stops committing (what waits for the quorum is
nack'ed), and the replica that holds the most of its log (everything committed, at least) leads
in the next epoch, in one fenced txn (`step_down`).

Status: the leader knows every member's progress (its shipper's acknowledgements), so a node
that does not lead the stream asks the leader's node (`stream.status` over the node link).

It knows the queue records, the leadership key, the links, and what it asks of the replication
wiring (`MembershipWiring`, which stream_replication.py's StreamReplication is; this module does
not import it); nothing of HTTP or AMQP. Asyncio: one event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.cluster.etcd_types import Compare, Put
from leveret.broker.cluster.link import Link, LinkError, RemoteError
from leveret.broker.cluster.stream_leadership import StreamLeadership, StreamLeaderships
from leveret.broker.cluster.stream_leadership import _decode as decode_leadership
from leveret.broker.cluster.stream_leadership import _encode as encode_leadership
from leveret.broker.cluster.stream_led import Led
from leveret.broker.cluster.topology_records import QueueRecord, decode, encode

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime

STATUS = "stream.status"
HANDOVER = "stream.handover"
HANDOVER_TIMEOUT_S = 20.0
STATUS_TIMEOUT_S = 5.0
NOT_RUNNING_TEXT = "node_not_running: node '{node}' is not a running node of this cluster"
OUT_OF_SYNC_TEXT = ("disallowed, out_of_sync_replica: the replica of stream '{name}' on node "
                    "'{replica}' is not in sync with its leader")
LAST_TEXT = "Cannot delete the last member of a stream"
NO_SUCCESSOR_TEXT = ("Cannot delete the replica of stream '{name}' on node '{node}': no other "
                     "member holds everything it committed; try again once they are in sync")
RACE_TEXT = "The members of stream '{name}' changed meanwhile; try again"


class MembershipError(Exception):
    """A refused change or status, with the text the CLI prints; `status` is the HTTP one."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


StatusOf = Callable[[str, str], dict[str, Any] | None]


class MembershipWiring(Protocol):
    """What a membership change asks of its node's replication (StreamReplication): the
    streams' leadership keys, and stopping and resuming the leading of a stream here."""

    cluster: ClusterRuntime
    leaderships: StreamLeaderships

    async def stop_leading(self, key: str) -> Led | None: ...

    def resume_leading(self, led: Led) -> None: ...


class StreamMembership:
    def __init__(self, replication: MembershipWiring) -> None:
        self.replication = replication
        self.cluster = replication.cluster
        # the management layer says how a local stream's status reads (streamops.status)
        self.local_status: StatusOf = lambda _vhost, _name: None
        self.cluster.links.handlers.on_request(STATUS, self._status)
        self.cluster.links.handlers.on_request(HANDOVER, self._handover)

    # -- status

    async def _status(self, _link: Link, body: object) -> dict[str, Any]:
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
            await self._hand_over(record)
            return True
        await self._write(record, leadership, tuple(m for m in members if m != node))
        return True

    # -- the leader's own membership: it stops, and the replica holding all it committed leads

    async def _hand_over(self, record: QueueRecord) -> None:
        if record.node == self.cluster.node:
            await self.step_down(record.vhost, record.name)
            return
        link = self.cluster.links.link_to(record.node)
        if link is None:
            raise MembershipError(NOT_RUNNING_TEXT.format(node=record.node))
        try:
            await link.call(HANDOVER, {"vhost": record.vhost, "name": record.name},
                            timeout=HANDOVER_TIMEOUT_S)
        except RemoteError as exc:
            raise MembershipError(exc.remote_message) from None
        except (LinkError, TimeoutError) as exc:
            raise MembershipError(f"the leader's node '{record.node}' did not answer: {exc}",
                                  503) from None

    async def _handover(self, _link: Link, body: object) -> bool:
        if not isinstance(body, dict):
            raise ValueError("stream.handover needs {vhost, name}")
        try:
            await self.step_down(str(body.get("vhost")), str(body.get("name")))
        except MembershipError as exc:
            raise ValueError(exc.text) from None
        return True

    async def step_down(self, vhost: str, name: str) -> None:
        """On the leader's node: stop committing, then one txn makes the replica that holds
        the most of this log (all that was committed, at least) the leader in the next epoch,
        without this node among the members. Its topology sync then deletes the local log."""
        record, leadership = await self._read(vhost, name)
        me = self.cluster.node
        if record.node != me or leadership is None:
            raise MembershipError(RACE_TEXT.format(name=name), 409)
        key = record.storage_id or f"{vhost}/{name}"
        led = await self.replication.stop_leading(key)
        if led is None or led.shipper is None:
            raise MembershipError(RACE_TEXT.format(name=name), 409)
        shipper = led.shipper
        held = {n: s.next_offset for n, s in shipper.replicas.items()
                if s.synced and n in record.members and s.next_offset - 1 >= shipper.committed}
        if not held:
            self.replication.resume_leading(led)
            raise MembershipError(NO_SUCCESSOR_TEXT.format(name=name, node=me))
        successor = max(held, key=lambda n: (held[n], tuple(-ord(ch) for ch in n)))
        members = (successor, *(m for m in record.members if m not in (me, successor)))
        new_lead = StreamLeadership(vhost, name, members, successor, leadership.epoch + 1)
        queue_key = self.cluster.store.keys.queue(vhost, name)
        lead_key = self.replication.leaderships.key(vhost, name)
        new_record = dataclasses.replace(record, node=successor, members=members)
        try:
            result = await self.cluster.client.txn(
                [Compare.mod_revision(lead_key, "==", leadership.mod_revision),
                 Compare.mod_revision(queue_key, "==", record.mod_revision)],
                [Put(lead_key, encode_leadership(new_lead)), Put(queue_key, encode(new_record))])
        except EtcdException as exc:
            self.replication.resume_leading(led)
            raise MembershipError(f"cannot reach etcd: {exc}", 503) from None
        if not result.succeeded:
            self.replication.resume_leading(led)
            raise MembershipError(RACE_TEXT.format(name=name), 409)
        with contextlib.suppress(TimeoutError):
            await self.cluster.settle(result.revision)

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
