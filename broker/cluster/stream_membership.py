"""Changing the members of a replicated stream or quorum queue (add_replica, delete_replica;
add_member, delete_member), moving its leadership (transfer_leadership) and reading every
member's status from any node. Streams and quorum queues replicate their logs the same way
(stream_replication.py), so one module changes both; only RabbitMQ's texts and rules differ by
type (`TEXTS`, and the in-sync rule of a stream's add_replica).

A change is one etcd transaction that compares the mod revisions of the stream's queue record
and of its leadership key with those just read, and puts both with the new `members` (the
leader and the epoch unchanged): of two changes racing on the same stream only one is written
(fencing), the other is told to try again. Every node's topology sync then applies the record:
a new member's node makes a replica on an empty log (the leader's shipper syncs it from offset
0, so it catches up with the whole log), a removed member's node deletes its replica and its
local log, and the leader ships to the new set of replicas.

RabbitMQ's rules (rabbit_stream_queue and rabbit_stream_coordinator for streams,
rabbit_quorum_queue and rabbit_queue_type_ra for quorum queues): the node must be running
(`node_not_running`); no replica of a stream may be out of sync when one is added; adding a
member that is already one, or deleting a node that is not one, changes nothing and succeeds;
the last member cannot be deleted (`last_node`). Deleting the leader's own membership elects
another leader first, as RabbitMQ's coordinator does: the leader's node stops committing (what
waits for the quorum is nack'ed), and the replica that holds the most of its log (everything
committed, at least) leads in the next epoch, in one fenced txn (`step_down`).

transfer_leadership is the same step down with a chosen successor that stays with the old
leader among the members: the leader first waits (`CATCH_UP_S` at most) for the target to hold
its whole log, stops committing, and the target leads in the next epoch if it holds everything
committed (else the leader resumes and the transfer is refused); the old leader's node then
follows it as a replica (its uncommitted tail, if any, is cut by the sync). Publishes that
waited for the quorum when the leader stopped are nack'ed, as at a failover.

Status: the leader knows every member's progress (its shipper's acknowledgements), so a node
that does not lead the stream asks the leader's node (`stream.status` over the node link).

It knows the queue records, the leadership key, the links, and what it asks of the replication
wiring (`MembershipWiring`, which stream_replication.py's StreamReplication is; this module does
not import it); nothing of HTTP or AMQP. Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
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
from leveret.broker.model.delayed_log import TYPE as DELAYED_LOG

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime

STATUS = "stream.status"
HANDOVER = "stream.handover"
HANDOVER_TIMEOUT_S = 20.0
STATUS_TIMEOUT_S = 5.0
CATCH_UP_S = 5.0  # transfer_leadership: how long the target may take to hold the whole log
NOT_RUNNING_TEXT = "node_not_running: node '{node}' is not a running node of this cluster"
OUT_OF_SYNC_TEXT = ("disallowed, out_of_sync_replica: the replica of stream '{name}' on node "
                    "'{replica}' is not in sync with its leader")
LAST_TEXT = "Cannot delete the last member of a stream"
NO_SUCCESSOR_TEXT = ("Cannot delete the replica of stream '{name}' on node '{node}': no other "
                     "member holds everything it committed; try again once they are in sync")
RACE_TEXT = "The members of stream '{name}' changed meanwhile; try again"
ALREADY_LEADER_TEXT = "The target node is already the leader of this queue"
UNKNOWN_MEMBER_TEXT = "unknown_member: node '{node}' is not a member of {what} '{name}'"
NOT_IN_SYNC_TEXT = ("not_in_sync: the member of {what} '{name}' on node '{node}' does not hold "
                    "everything its leader committed; try again once it is in sync")
REPLICATED = ("stream", "quorum", DELAYED_LOG)

# RabbitMQ's texts by queue type, where they differ (a quorum queue's are rabbit_quorum_queue's
# reasons, with what they mean)
TEXTS = {
    "stream": {"missing": "The stream does not exist", "last": LAST_TEXT,
               "no_successor": NO_SUCCESSOR_TEXT, "race": RACE_TEXT, "what": "stream"},
    "quorum": {"missing": "queue '{name}' was not found in virtual host '{vhost}'",
               "last": "last_node: the last node cannot be removed",
               "no_successor": ("Cannot delete the member of queue '{name}' on node '{node}': "
                                "no other member holds everything it committed; try again once "
                                "they are in sync"),
               "race": "The members of queue '{name}' changed meanwhile; try again",
               "what": "queue"},
}


class MembershipError(Exception):
    """A refused change or status, with the text the CLI prints; `status` is the HTTP one and
    `reason` RabbitMQ's word for it (last_node, node_not_running, not_found, ...)."""

    def __init__(self, text: str, status: int = 400, reason: str = "") -> None:
        super().__init__(text)
        self.text = text
        self.status = status
        self.reason = reason


StatusOf = Callable[[str, str], dict[str, Any] | None]


class MembershipWiring(Protocol):
    """What a membership change asks of its node's replication (StreamReplication): the
    streams' leadership keys, what this node leads, and stopping and resuming the leading of
    a stream here."""

    cluster: ClusterRuntime
    leaderships: StreamLeaderships
    led: dict[str, Led]

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

    async def add(self, vhost: str, name: str, node: str,
                  types: tuple[str, ...] = ("stream",)) -> bool:
        """Add `node` as a member; False if it already is one (nothing changes)."""
        if node not in self.running():
            raise MembershipError(NOT_RUNNING_TEXT.format(node=node), reason="node_not_running")
        record, leadership = await self._read(vhost, name, types)
        members = record.members or (record.node,)
        if node in members:
            return False
        in_sync_rule = record.type == "stream" and len(members) > 1  # (rabbit_stream_queue's)
        status = await self.status(record) if in_sync_rule else None
        if in_sync_rule:
            rows = (status or {}).get("members") or []
            if status is None:
                raise MembershipError(OUT_OF_SYNC_TEXT.format(name=name, replica=record.node))
            for row in rows:
                if row.get("role") == "replica" and not row.get("synced", True):
                    raise MembershipError(OUT_OF_SYNC_TEXT.format(name=name,
                                                                  replica=row.get("node")))
        await self._write(record, leadership, (*members, node))
        return True

    async def delete(self, vhost: str, name: str, node: str,
                     types: tuple[str, ...] = ("stream",)) -> bool:
        """Remove `node`'s membership; False if it is not a member (nothing changes)."""
        record, leadership = await self._read(vhost, name, types)
        members = record.members or (record.node,)
        # a quorum queue: a node that is no member first (rabbit_queue_type_ra:delete_member),
        # a stream: the last member first (rabbit_stream_coordinator)
        if record.type != "stream" and node not in members:
            return False
        if len(members) <= 1:
            raise MembershipError(_text(record, "last"), reason="last_node")
        if node not in members:
            return False
        if node == record.node:
            await self._hand_over(record)
            return True
        await self._write(record, leadership, tuple(m for m in members if m != node))
        return True

    async def transfer(self, vhost: str, name: str, node: str,
                       types: tuple[str, ...] = REPLICATED) -> str:
        """transfer_leadership: `node` (a running member that holds everything committed)
        leads from the next epoch; the old leader stays a member. Returns the new leader."""
        record, _leadership = await self._read(vhost, name, types)
        members = record.members or (record.node,)
        if node == record.node:
            raise MembershipError(ALREADY_LEADER_TEXT, reason="already_leader")
        if node not in members:
            raise MembershipError(UNKNOWN_MEMBER_TEXT.format(
                node=node, what=_text(record, "what"), name=name), reason="unknown_member")
        if node not in self.running():
            raise MembershipError(NOT_RUNNING_TEXT.format(node=node), reason="node_not_running")
        await self._hand_over(record, target=node)
        return node

    # -- the leader's own membership: it stops, and the replica holding all it committed leads

    async def _hand_over(self, record: QueueRecord, target: str | None = None) -> None:
        if record.node == self.cluster.node:
            await self.step_down(record.vhost, record.name, target, (record.type,))
            return
        link = self.cluster.links.link_to(record.node)
        if link is None:
            raise MembershipError(NOT_RUNNING_TEXT.format(node=record.node),
                                  reason="node_not_running")
        try:
            await link.call(HANDOVER, {"vhost": record.vhost, "name": record.name,
                                       "target": target, "type": record.type},
                            timeout=HANDOVER_TIMEOUT_S + CATCH_UP_S)
        except RemoteError as exc:
            raise MembershipError(exc.remote_message) from None
        except (LinkError, TimeoutError) as exc:
            raise MembershipError(f"the leader's node '{record.node}' did not answer: {exc}",
                                  503) from None

    async def _handover(self, _link: Link, body: object) -> bool:
        if not isinstance(body, dict):
            raise ValueError("stream.handover needs {vhost, name}")
        target = body.get("target")
        kind = str(body.get("type") or "stream")
        try:
            await self.step_down(str(body.get("vhost")), str(body.get("name")),
                                 str(target) if target is not None else None, (kind,))
        except MembershipError as exc:
            raise ValueError(exc.text) from None
        return True

    async def step_down(self, vhost: str, name: str, target: str | None = None,
                        types: tuple[str, ...] = ("stream",)) -> None:
        """On the leader's node: stop committing, then one txn makes the replica that holds
        the most of this log (all that was committed, at least) the leader in the next epoch,
        without this node among the members (its topology sync then deletes the local log);
        or, given a `target` (transfer_leadership), that member, with this node kept as one."""
        record, leadership = await self._read(vhost, name, types)
        me = self.cluster.node
        if record.node != me or leadership is None:
            raise MembershipError(_text(record, "race").format(name=name), 409)
        key = record.storage_id or f"{vhost}/{name}"
        if target is not None:
            await self._caught_up(key, target)
        led = await self.replication.stop_leading(key)
        if led is None or led.shipper is None:
            raise MembershipError(_text(record, "race").format(name=name), 409)
        shipper = led.shipper
        held = {n: s.next_offset for n, s in shipper.replicas.items()
                if s.synced and n in record.members and s.next_offset - 1 >= shipper.committed
                and (target is None or n == target)}
        if not held:
            self.replication.resume_leading(led)
            if target is not None:
                raise MembershipError(NOT_IN_SYNC_TEXT.format(
                    what=_text(record, "what"), name=name, node=target), reason="not_in_sync")
            raise MembershipError(_text(record, "no_successor").format(name=name, node=me))
        successor = max(held, key=lambda n: (held[n], tuple(-ord(ch) for ch in n)))
        kept = (me,) if target is not None else ()
        members = (successor, *kept,
                   *(m for m in record.members if m not in (me, successor)))
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
            raise MembershipError(_text(record, "race").format(name=name), 409)
        with contextlib.suppress(TimeoutError):
            await self.cluster.settle(result.revision)

    async def _caught_up(self, key: str, target: str) -> None:
        """Wait (CATCH_UP_S at most) until `target`'s replica holds the leader's whole log, so
        that stopping the leader nacks as little as can be."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        while loop.time() < deadline:
            led = self.replication.led.get(key)
            state = led.shipper.replicas.get(target) if led and led.shipper else None
            if led is None or (state is not None and state.synced
                               and state.next_offset >= led.queue.log.next_offset):
                return
            await asyncio.sleep(0.05)

    async def _read(self, vhost: str, name: str, types: tuple[str, ...] = ("stream",)
                    ) -> tuple[QueueRecord, StreamLeadership | None]:
        store = self.cluster.store
        queue_key = store.keys.queue(vhost, name)
        try:
            kv = await self.cluster.client.get(queue_key)
            lead_kv = await self.cluster.client.get(
                self.replication.leaderships.key(vhost, name))
        except EtcdException as exc:
            raise MembershipError(f"cannot reach etcd: {exc}", 503) from None
        record = decode("queues", kv) if kv is not None else None
        if not isinstance(record, QueueRecord) or record.type not in types:
            texts = TEXTS.get(types[0], TEXTS["stream"])
            raise MembershipError(texts["missing"].format(name=name, vhost=vhost), 404,
                                  "not_found")
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
            raise MembershipError(_text(record, "race").format(name=record.name), 409)
        with contextlib.suppress(TimeoutError):
            await self.cluster.settle(result.revision)


def _text(record: QueueRecord, which: str) -> str:
    return TEXTS.get(record.type, TEXTS["stream"])[which]


__all__ = ["REPLICATED", "STATUS", "MembershipError", "StreamMembership"]
