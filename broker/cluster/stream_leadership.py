"""Who leads a replicated stream, in which epoch, with which members: one etcd key per stream.

Role: the key `/leveret/<cluster>/streams/<escaped vhost>/<escaped name>` holds JSON `members`
(node names, the leader first), `leader` and `epoch`. Every change is one etcd transaction that
compares the key's mod revision with the one the writer read, so of two nodes acting on the same
state only one succeeds (fencing): an election writes `epoch + 1` with the winning candidate,
and a candidate that lost the race reads the new state instead. Epochs only grow.

`choose_leader` is the election's rule, as osiris and RabbitMQ's stream coordinator choose: of
the members that answered with their log's tail (epoch of the last chunk, next offset), there
must be a quorum; the one with the greatest tail wins (ties by node name, so every node picks the
same one), since it holds every chunk a quorum acknowledged.

It must not know AMQP, the model or the links: tails are gathered by the caller.
Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from leveret.broker.cluster.etcd import EtcdClient
from leveret.broker.cluster.etcd_types import Compare, Delete, Get, KeyValue, Put, TxnResult
from leveret.broker.cluster.replication import quorum
from leveret.broker.cluster.topology_keys import escape

Tail = tuple[int, int]  # (epoch of the last chunk, next offset), as Log.tail


@dataclass(frozen=True)
class StreamLeadership:
    vhost: str
    name: str
    members: tuple[str, ...]
    leader: str
    epoch: int
    mod_revision: int = 0  # the key's, when read: what the next change compares against

    @property
    def replicas(self) -> tuple[str, ...]:
        return tuple(m for m in self.members if m != self.leader)


class StaleLeadership(Exception):
    """The key changed since it was read (another node elected or changed members first)."""

    def __init__(self, current: StreamLeadership | None) -> None:
        super().__init__("the stream's leadership changed since it was read")
        self.current = current


def choose_leader(members: tuple[str, ...], tails: dict[str, Tail]) -> str | None:
    """The member with the greatest tail among those that answered, or None without a quorum
    of answers among the members."""
    answered = {node: tail for node, tail in tails.items() if node in members}
    if len(answered) < quorum(len(members)):
        return None
    return max(answered, key=lambda node: (answered[node], _reverse(node)))


def needs_new_epoch(epoch: int, last_chunk_epoch: int, fenced_at: int) -> bool:
    """Whether a leader must take the next epoch rather than lead in `epoch` (its leadership
    key's): its log already holds chunks of `epoch` (it led in it before a restart, and every
    epoch must be one run of one leader, which the replicas' sync relies on), or a replica was
    fenced past it by an election that did not finish (which no sync in `epoch` passes)."""
    return last_chunk_epoch >= epoch or fenced_at > epoch


async def fenced_election(me: str, members: tuple[str, ...], leader: str, fence: int,
                          fence_own: Callable[[int], Tail | None],
                          ask: Callable[[str, int], Awaitable[Tail | None]]) -> str | None:
    """An election by `me` of a new leader in epoch `fence` (the leadership's next): fence this
    member and ask every other member but the old leader to fence itself and answer its tail,
    then choose among those that did. A fenced member takes nothing more of the old epoch, so
    with a quorum fenced the old leader can commit nothing more, and the greatest tail among
    them holds every committed chunk. None without a quorum of fenced answers."""
    own = fence_own(fence)
    if own is None:
        return None
    others = [m for m in members if m not in (me, leader)]
    answers = await asyncio.gather(*(ask(m, fence) for m in others))
    tails = {me: own} | {m: tail for m, tail in zip(others, answers, strict=True)
                          if tail is not None}
    return choose_leader(members, tails)


def _reverse(name: str) -> tuple[int, ...]:
    """Sorts names backwards, so that max() prefers the smallest name among equal tails."""
    return tuple(-ord(ch) for ch in name)


class StreamLeaderships:
    def __init__(self, client: EtcdClient, cluster: str) -> None:
        self.client = client
        self.root = f"/leveret/{cluster}/streams/"

    def key(self, vhost: str, name: str) -> bytes:
        return f"{self.root}{escape(vhost)}/{escape(name)}".encode()

    async def create(self, vhost: str, name: str, members: list[str]) -> StreamLeadership:
        """The first leader (members[0]) in epoch 1; StaleLeadership if the stream already
        has a leadership record."""
        if not members:
            raise ValueError("a stream has at least one member")
        record = StreamLeadership(vhost, name, tuple(members), members[0], 1)
        key = self.key(vhost, name)
        result = await self.client.txn([Compare.version(key, "==", 0)], [Put(key, _encode(record))],
                                       [Get(key)])
        return self._written(result, record)

    def vhost_prefix(self, vhost: str) -> bytes:
        return f"{self.root}{escape(vhost)}/".encode()

    def create_op(self, vhost: str, name: str, members: list[str]) -> Put:
        """The put of a new stream's first leadership (members[0], epoch 1), for the txn that
        declares the stream's queue record (TopologyStore.declare_queue)."""
        if not members:
            raise ValueError("a stream has at least one member")
        record = StreamLeadership(vhost, name, tuple(members), members[0], 1)
        return Put(self.key(vhost, name), _encode(record))

    async def get(self, vhost: str, name: str) -> StreamLeadership | None:
        found = await self.client.range(self.key(vhost, name))
        return _decode(vhost, name, found.kvs[0]) if found.kvs else None

    async def elect(self, current: StreamLeadership, leader: str) -> StreamLeadership:
        """`leader` leads from epoch `current.epoch + 1`; StaleLeadership if someone changed the
        record first."""
        if leader not in current.members:
            raise ValueError(f"{leader} is not a member of stream {current.name!r}")
        members = (leader, *(m for m in current.members if m != leader))
        return await self._replace(current, StreamLeadership(
            current.vhost, current.name, members, leader, current.epoch + 1))

    async def set_members(self, current: StreamLeadership,
                          members: list[str]) -> StreamLeadership:
        """New members, the leader and epoch unchanged (add_replica, delete_replica)."""
        if current.leader not in members:
            raise ValueError("the leader stays a member; elect another one first")
        ordered = (current.leader, *(m for m in members if m != current.leader))
        return await self._replace(current, StreamLeadership(
            current.vhost, current.name, ordered, current.leader, current.epoch))

    async def delete(self, vhost: str, name: str) -> None:
        await self.client.txn([], [Delete(self.key(vhost, name))])

    async def _replace(self, current: StreamLeadership,
                       record: StreamLeadership) -> StreamLeadership:
        key = self.key(current.vhost, current.name)
        result = await self.client.txn(
            [Compare.mod_revision(key, "==", current.mod_revision)],
            [Put(key, _encode(record))], [Get(key)])
        return self._written(result, record)

    @staticmethod
    def _written(result: TxnResult, record: StreamLeadership) -> StreamLeadership:
        if result.succeeded:
            return StreamLeadership(record.vhost, record.name, record.members, record.leader,
                                    record.epoch, result.revision)
        kvs = getattr(result.responses[0], "kvs", []) if result.responses else []
        raise StaleLeadership(_decode(record.vhost, record.name, kvs[0]) if kvs else None)


def _encode(record: StreamLeadership) -> bytes:
    return json.dumps({"members": list(record.members), "leader": record.leader,
                       "epoch": record.epoch}).encode()


def _decode(vhost: str, name: str, kv: KeyValue) -> StreamLeadership:
    data: Any = json.loads(kv.value)
    return StreamLeadership(vhost, name, tuple(str(m) for m in data["members"]),
                            str(data["leader"]), int(data["epoch"]), kv.mod_revision)
