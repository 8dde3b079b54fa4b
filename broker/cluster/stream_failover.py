"""Failover of a replicated stream: when its leader's node goes, a member with the most
advanced log becomes the leader, fenced by one etcd transaction.

Every node checks, twice a second, the replicated streams it holds as a replica: when the
leader's node is lost while this node is in the cluster, it asks the running members whether
they lost the leader too (`stream.tail`). The leader's node is lost when its node record is gone
from etcd (a clean stop, or its lease expired), or, sooner, when a quorum of the members (this
one included) has been without a link to it for `stream_failover_after_s`: `kill -9` breaks
every link at once, and the lease takes longer to expire. A node's link only counts once it has
been up since the node's record appeared, so a node still starting is never taken for lost.

With a quorum that lost it, the election (`stream_leadership.fenced_election`): read the
leadership key, fence this member and ask the others but the old leader to fence themselves at
the next epoch (`stream.tail` with `fence`: from then on they take nothing of the old epoch, so
the old leader commits nothing more) and answer their tails; the greatest tail among a fenced
quorum holds every committed chunk and is chosen (ties by name). Only the chosen node acts: one
txn compares the leadership key's and the queue record's mod revisions with those it read, and
puts both: the leadership with the next epoch, and the queue record with the new leader as
`node` (members reordered, leader first). Of two candidates acting on the same state exactly
one wins. Every node's topology sync then applies the record: the new leader's replica becomes
the leader (`StreamReplication.rerole`: its writer ships and commits at the quorum, in the new
epoch), the other members follow it (their logs synced, a divergent uncommitted tail cut), and
publishes through any node go to it. An election that fenced but never finished costs the old
leader a new epoch: its next sync is answered with the fence (stream_replication.py).

It knows what it asks of the replication wiring (`FailoverWiring`, which
stream_replication.py's StreamReplication is; this module does not import it), the leadership
key and the queue record; nothing of AMQP. Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.cluster.etcd_types import Compare, Put
from leveret.broker.cluster.link import Link, LinkError
from leveret.broker.cluster.replication import Replicas, quorum
from leveret.broker.cluster.stream_leadership import (
    StreamLeadership,
    StreamLeaderships,
    Tail,
    fenced_election,
)
from leveret.broker.cluster.stream_leadership import _encode as encode_leadership
from leveret.broker.cluster.topology_records import QueueRecord, encode
from leveret.broker.process import logs
from leveret.storage import Log, LogClosedError

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime

log = logs.get("leveret.cluster.failover")
TAIL = "stream.tail"
CHECK_S = 0.5
TAIL_TIMEOUT_S = 3.0


class TailAnswer(TypedDict):
    """`stream.tail`'s reply: a member's log tail, and whether it lost the leader too."""

    epoch: int
    next_offset: int
    leader_lost: bool


class FailoverWiring(Protocol):
    """What failover asks of its node's replication (StreamReplication): the streams this
    node follows as a replica, their logs, and the streams' leadership keys."""

    cluster: ClusterRuntime
    replicas: Replicas
    following: dict[str, QueueRecord]  # streams replicated here, by key
    leaderships: StreamLeaderships

    def log_of(self, key: str) -> Log | None: ...


class Failover:
    def __init__(self, replication: FailoverWiring, after_s: float) -> None:
        self.replication = replication
        self.cluster = replication.cluster
        self.cluster.links.handlers.on_request(TAIL, self._tail)
        self._electing: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.after_s = after_s  # (stream_failover_after_s)
        self._lost: dict[str, float] = {}  # running nodes once linked: since when unlinked

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _tail(self, _link: Link, body: object) -> TailAnswer:
        """A member's tail, and whether it lost the leader too; with `fence` (an election's
        next epoch), the replica is fenced at it first, durably, so the tail cannot grow in the
        old epoch after it was told."""
        key = body.get("stream") if isinstance(body, dict) else None
        found = self.replication.log_of(key) if isinstance(key, str) else None
        if found is None or not isinstance(key, str) or not isinstance(body, dict):
            raise LookupError(f"this node holds no log of stream {key!r}")
        fence = body.get("fence")
        if isinstance(fence, int) and not isinstance(fence, bool):
            tail = self.replication.replicas.fence(key, fence)
            if tail is None:
                raise LookupError(f"this node holds no replica of stream {key!r}")
            epoch, next_offset = tail
        else:
            epoch, next_offset = found.tail
        record = self.replication.following.get(key)
        lost = record is not None and self._leader_lost(record.node)
        return {"epoch": epoch, "next_offset": next_offset, "leader_lost": lost}

    def _track_links(self) -> None:
        """Note since when this node has been without its link to each running node that it
        was linked to since that node's record appeared."""
        links = self.cluster.links
        now = asyncio.get_running_loop().time()
        for node in links.records:
            if links.link_to(node) is not None or node not in links.ever_linked:
                self._lost.pop(node, None)
            else:
                self._lost.setdefault(node, now)
        for node in [n for n in self._lost if n not in links.records]:
            del self._lost[node]

    def _leader_lost(self, node: str) -> bool:
        """Its record is gone, or this node has been without a link to it long enough."""
        if node not in self.cluster.links.records:
            return True
        since = self._lost.get(node)
        return since is not None and asyncio.get_running_loop().time() - since >= self.after_s

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                self._check()
            except Exception:  # the watch must go on
                log.exception("stream failover check failed")

    def _check(self) -> None:
        cluster = self.cluster
        if not cluster.membership.in_cluster or not cluster.links.started:
            return  # (before the links start, no node's record is known yet)
        self._track_links()
        for key, record in list(self.replication.following.items()):
            if not self._leader_lost(record.node) or key in self._electing:
                continue
            self._electing.add(key)
            task = asyncio.get_running_loop().create_task(self._elect(key, record))
            task.add_done_callback(self._elected(key))

    def _elected(self, key: str) -> Callable[[asyncio.Task[None]], None]:
        def done(_task: asyncio.Task[None]) -> None:
            self._electing.discard(key)
        return done

    async def _elect(self, key: str, record: QueueRecord) -> None:
        """Ask the members whether they lost the leader too; with a quorum that did, fence a
        quorum at the next epoch and compare their tails (stream_leadership.fenced_election);
        the chosen member takes over in one txn."""
        me = self.cluster.node
        if self.replication.replicas.logs.get(key) is None:
            return
        asks = [m for m in record.members if m not in (me, record.node)]
        answers = await asyncio.gather(*(self._ask(m, key) for m in asks))
        lost_by = 1 + sum(1 for answer in answers if answer is not None and answer[1])
        if record.node in self.cluster.links.records and lost_by < quorum(len(record.members)):
            return  # its record is there and a quorum still reaches it: only this link broke
        try:
            current = await self.replication.leaderships.get(record.vhost, record.name)
            if current is None or current.leader != record.node:
                return  # already elected, or gone
            chosen = await fenced_election(
                me, record.members, record.node, current.epoch + 1,
                lambda fence: self.replication.replicas.fence(key, fence),
                lambda member, fence: self._ask_fenced(member, key, fence))
            if chosen != me:
                if chosen is None:
                    log.warning("no quorum of members to elect a stream's leader",
                                stream=record.name, vhost=record.vhost)
                return  # the chosen member acts; every member checks again meanwhile
            await self._take_over(record, current)
        except EtcdException as exc:
            log.warning("cannot elect a stream's leader yet", stream=record.name, error=str(exc))
        except LogClosedError:
            return  # this member's log closed meanwhile: the node is stopping, or left

    async def _ask(self, node: str, key: str) -> tuple[Tail, bool] | None:
        """A member's tail, and whether it lost the leader too."""
        answer = await self._call_tail(node, {"stream": key})
        if answer is None:
            return None
        return (answer["epoch"], answer["next_offset"]), answer["leader_lost"]

    async def _ask_fenced(self, node: str, key: str, fence: int) -> Tail | None:
        answer = await self._call_tail(node, {"stream": key, "fence": fence})
        return None if answer is None else (answer["epoch"], answer["next_offset"])

    async def _call_tail(self, node: str, body: dict[str, Any]) -> TailAnswer | None:
        link = self.cluster.links.link_to(node)
        if link is None or link.closed:
            return None
        with contextlib.suppress(LinkError, TimeoutError, ValueError, KeyError, TypeError):
            answer = await link.call(TAIL, body, timeout=TAIL_TIMEOUT_S)
            return TailAnswer(epoch=int(answer["epoch"]), next_offset=int(answer["next_offset"]),
                              leader_lost=answer.get("leader_lost") is True)
        return None

    async def _take_over(self, record: QueueRecord, current: StreamLeadership) -> None:
        """One txn: the next epoch with this node leading, and the queue record naming it."""
        me = self.cluster.node
        members = (me, *(m for m in current.members if m != me))
        leadership = StreamLeadership(record.vhost, record.name, members, me, current.epoch + 1)
        queue_key = self.cluster.store.keys.queue(record.vhost, record.name)
        lead_key = self.replication.leaderships.key(record.vhost, record.name)
        new_record = dataclasses.replace(record, node=me, members=members)
        result = await self.cluster.client.txn(
            [Compare.mod_revision(lead_key, "==", current.mod_revision),
             Compare.mod_revision(queue_key, "==", record.mod_revision)],
            [Put(lead_key, encode_leadership(leadership)), Put(queue_key, encode(new_record))])
        if result.succeeded:
            log.info("elected the leader of a replicated stream", stream=record.name,
                     vhost=record.vhost, epoch=leadership.epoch, previous=record.node)
            with contextlib.suppress(TimeoutError):
                await self.cluster.settle(result.revision)


def install(replication: FailoverWiring, after_s: float) -> Failover:
    """Answer `stream.tail`, and watch the leaders of the streams replicated here (a leader
    unlinked from a quorum for `after_s` is lost)."""
    failover = Failover(replication, after_s)
    with contextlib.suppress(RuntimeError):  # no running loop: nothing to watch yet
        failover.start()
    return failover
