"""Single active consumer across nodes: one group per stream and name for the whole cluster,
whatever node its members read from.

A replicated stream's single-active-consumer groups live on its leader (`SacGroups` of the
leader's queue, broker/model/sac.py); AMQP 0.9.1 consumers get there by forwarding. A
stream-protocol subscription reads from its own node's member, so on a replica's node it is
registered with the leader's group over the node-to-node link, and keeps reading locally (a
replica's `StreamMember`, stream_member.py, hands its members here: `use_groups`):

- `sac.join` (member's node to the leader; `vhost`, `stream`, `member`, `reference`,
  `connection`: its connection's name there): add a remote member, at the end of its group as
  a local one joins.
- `sac.leave` (member's node to the leader; `vhost`, `stream`, `member`): it went
  (unsubscribed, its connection closed).
- `sac.state` (the leader to the member's node; `member`, `active`, `stored`): the group made
  it active (with the offset the leader has stored for it) or inactive; with `retry`, the node
  does not lead the stream (or not yet): register again later.
- `sac.stepped` (member's node to the leader; `vhost`, `stream`, `member`): a member made
  inactive is done (its client answered the inactive ConsumerUpdate): as RabbitMQ's
  coordinator, the group starts the next member only then (or after the drain timeout).

On the leader a remote member is a model Consumer whose sink (`RemoteMember`) has
`step_up`/`step_down`: the group tells the member's node instead of opening a reader. On the
member's node, activation is what a local group does (`attach` after the stored offset, then
the subscription's ConsumerUpdate; its answer applies locally), once the replica holds the
stored offset the leader named (or after `CATCH_UP_S`); deactivation is `deactivate` (a
ConsumerUpdate saying inactive). A member leaves when its subscription goes; all of a node's
members leave the leader's groups when that node's link closes, and the members of a lost
link are made inactive at once and register again when a link to the leader is back. When the
stream's leader changes (`StreamReplication` calls `detached`, then `attached`), the members
step down and join the new leader's group (this node's own, if it became the leader); a
leader that steps down hands its own stream-protocol members over the same way.

It knows the model's StreamQueue, Consumer and Cursor, the link and the stream members; it is
given the cluster runtime and the broker's vhosts (`Vhosts`), not the replication wiring that
installs it (stream_replication.py). It must not know stream-protocol frames or sessions (the
subscription is a Consumer whose sink speaks ConsumerUpdate itself), AMQP, or etcd.
Asyncio: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from leveret.broker.cluster.link import Link, LinkError
from leveret.broker.cluster.stream_member import member_of
from leveret.broker.model import stream_args as sargs
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.message import QueuedMessage
from leveret.broker.model.stream import StreamQueue
from leveret.broker.model.stream_cursor import Cursor
from leveret.broker.model.vhost import VHost
from leveret.broker.process import logs

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime

log = logs.get("leveret.cluster.sac")
JOIN, LEAVE, STATE, STEPPED = "sac.join", "sac.leave", "sac.state", "sac.stepped"
RETRY_S = 0.5  # how often members without a group try to register again
CATCH_UP_S = 5.0  # how long an activated member waits for the leader's stored offset
CATCH_UP_POLL_S = 0.05


@dataclass(eq=False)
class Member:
    """A subscription on this node whose group is on another node."""

    id: int
    queue: StreamQueue
    consumer: Consumer
    link: Link | None = None  # the link it is registered over (None: not registered)
    choice: int = 0  # counts the leader's choices: a late catch-up acts only on the latest


class RemoteMember:
    """The leader's sink for a member on another node: the group's choices go there."""

    def __init__(self, sac: StreamSac, link: Link, queue: StreamQueue, member: int,
                 connection: str = "") -> None:
        self.sac, self.link, self.queue, self.member = sac, link, queue, member
        self.node = link.peer_node
        self.connection_name = connection  # on its node, for the management API

    def step_up(self, consumer: Consumer) -> None:
        consumer.state.active = True
        stored = self.queue.log.consumer_offset(consumer.state.name)
        self.tell({"member": self.member, "active": True, "stored": stored})

    def step_down(self, consumer: Consumer) -> None:
        """Inactive; the group waits for its node's `sac.stepped` (its client answered the
        ConsumerUpdate) before the next member starts."""
        consumer.state.active = False
        self.queue.await_hand_over(consumer)
        self.tell({"member": self.member, "active": False})

    def tell(self, body: dict[str, Any]) -> None:
        try:
            self.link.post(STATE, body)
        except LinkError:  # its node is gone: the link's close removes it from the group
            pass

    # a remote member never receives from this node
    def can_send(self, consumer: Consumer) -> bool:
        return False

    def credit(self, consumer: Consumer) -> int:
        return 0

    def send(self, consumer: Consumer, entry: QueuedMessage, queue: object) -> None:
        raise AssertionError("a remote member reads on its own node")

    def send_records(self, consumer: Consumer, offsets: Sequence[int],
                     records: Sequence[bytes]) -> None:
        raise AssertionError("a remote member reads on its own node")

    def server_cancel(self, consumer: Consumer) -> None:
        pass


class Vhosts(Protocol):
    """What of the broker a leader's groups are found in."""

    @property
    def vhosts(self) -> Mapping[str, VHost]: ...


class StreamSac:
    def __init__(self, cluster: ClusterRuntime, broker: Vhosts) -> None:
        self.broker = broker
        self.cluster = cluster
        handlers = self.cluster.links.handlers
        handlers.on_message(JOIN, self._joined)
        handlers.on_message(LEAVE, self._left)
        handlers.on_message(STATE, self._state)
        handlers.on_message(STEPPED, self._stepped)
        self.members: dict[int, Member] = {}  # this node's members of groups elsewhere
        self.by_consumer: dict[Consumer, Member] = {}
        self.remote: dict[tuple[str, int], Consumer] = {}  # the leader's remote members
        self._ids = itertools.count(1)
        self._watched: set[int] = set()  # links whose close is handled (by id())
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._retry())

    # -- the replication's hooks: a stream's role on this node changes --------------------

    def attached(self, queue: StreamQueue) -> None:
        """`queue` became the leader or a replica: members waiting step down (the new group
        chooses again) and join its group."""
        waiting = [m for m in self.members.values() if m.queue is queue]
        for member in waiting:
            if member.consumer.state.active and not queue.deleted:
                queue.deactivate(member.consumer)
        if queue.role == "replica":
            self._hand_groups(queue, self)
            for member in waiting:
                self._register(member)
            return
        self._hand_groups(queue, None)
        for member in waiting:  # this node leads now: the group is its own
            self._forget(member)
            if not queue.deleted:
                queue.groups.join(member.consumer)

    def detached(self, queue: StreamQueue) -> None:
        """`queue` stops being the leader or a replica here (its leader moves, it restarts or
        is deleted): its members leave their group, and wait for `attached` (if it comes)."""
        self._hand_groups(queue, None)
        if queue.role == "leader":
            self._hand_over(queue)
        for member in [m for m in self.members.values() if m.queue is queue]:
            self._unregister(member, tell=True, step_down=False)

    @staticmethod
    def _hand_groups(queue: StreamQueue, groups: StreamSac | None) -> None:
        """The queue's SAC members join the leader's groups through `groups` (None: the
        queue's own)."""
        stream_member = member_of(queue)
        if stream_member is not None:
            stream_member.use_groups(groups)

    def _hand_over(self, queue: StreamQueue) -> None:
        """A leader steps down (or restarts its log): its remote members are dropped and
        their nodes told to register them again (`retry`), with whoever leads then; its own
        stream-protocol members wait for `attached`."""
        for key, consumer in list(self.remote.items()):
            if consumer.queue is queue:
                del self.remote[key]
                sink = consumer.sink
                if isinstance(sink, RemoteMember):
                    sink.tell({"member": sink.member, "retry": True})
        for tag, group in list(queue.groups.groups.items()):
            for consumer in list(group):
                sink = consumer.sink
                if isinstance(sink, RemoteMember):
                    group.remove(consumer)
                elif getattr(sink, "reads_locally", False):
                    group.remove(consumer)
                    self._track(queue, consumer)
            if not group:
                del queue.groups.groups[tag]

    # -- this node's members (SacGroups.join / leave on a replica) ------------------------

    def join(self, queue: StreamQueue, consumer: Consumer) -> bool:
        """A member of a replica's group: registered with the leader's. False (a group of
        this node's) for what does not read locally, or a queue that is not a replica."""
        if queue.role != "replica" or not getattr(consumer.sink, "reads_locally", False):
            return False
        self._register(self._track(queue, consumer))
        return True

    def leave(self, queue: StreamQueue, consumer: Consumer) -> None:
        member = self.by_consumer.get(consumer)
        if member is not None:
            self._unregister(member, tell=True, step_down=False)  # (it goes)
            self._forget(member)

    def _track(self, queue: StreamQueue, consumer: Consumer) -> Member:
        member = Member(next(self._ids), queue, consumer)
        self.members[member.id] = member
        self.by_consumer[consumer] = member
        return member

    def _forget(self, member: Member) -> None:
        self.members.pop(member.id, None)
        self.by_consumer.pop(member.consumer, None)

    def _register(self, member: Member) -> None:
        """Join the leader's group, if a link to the leader is up (else the retry will)."""
        queue = member.queue
        leader = getattr(queue.forward_to, "node", None)
        link = self.cluster.links.link_to(leader) if leader else None
        if link is None or link.closed or queue.deleted:
            return
        try:
            link.post(JOIN, {"vhost": queue.vhost.name, "stream": queue.name,
                             "member": member.id, "reference": member.consumer.tag,
                             "connection": getattr(member.consumer.sink, "connection_name", "")})
        except LinkError:
            return
        member.link = link
        self._watch(link)

    def _unregister(self, member: Member, tell: bool, step_down: bool = True) -> None:
        """Out of the leader's group: the leader told when it can be, and (`step_down`)
        inactive here at once (ConsumerUpdate)."""
        link, member.link = member.link, None
        member.choice += 1
        if tell and link is not None and not link.closed:
            with contextlib.suppress(LinkError):
                link.post(LEAVE, {"vhost": member.queue.vhost.name, "stream": member.queue.name,
                                  "member": member.id})
        cursor = member.consumer.state
        if step_down and cursor is not None and cursor.active and not member.queue.deleted:
            member.queue.deactivate(member.consumer)

    async def _state(self, link: Link, body: object) -> None:
        """The leader's group chose: this member is active, or inactive (or: ask again)."""
        if not isinstance(body, dict):
            return
        found = body.get("member")
        member = self.members.get(found) if isinstance(found, int) else None
        if member is None or member.link is not link:
            return  # gone, or a choice of a group it has left since
        member.choice += 1
        if body.get("retry"):  # out of that group: the retry registers it with whoever leads
            self._unregister(member, tell=False)
            return
        cursor = member.consumer.state
        if not body.get("active"):
            if cursor.active:  # it says `sac.stepped` once its client has answered
                member.queue.deactivate(member.consumer)
            else:  # nothing to hand over
                self.stepped_down(member.queue, member.consumer)
            return
        stored = body.get("stored")
        deadline = asyncio.get_running_loop().time() + CATCH_UP_S
        self._activate(member, member.choice, stored if isinstance(stored, int) else -1,
                       deadline)

    def _activate(self, member: Member, choice: int, stored: int, deadline: float) -> None:
        """Start the member as a local group does, once this node's copy holds the offset
        the leader stored for it (the client's ConsumerUpdate answer may ask for it)."""
        queue, consumer = member.queue, member.consumer
        if (member.choice != choice or self.members.get(member.id) is not member
                or queue.deleted or consumer.state.active):
            return
        loop = asyncio.get_running_loop()
        local = queue.log.consumer_offset(consumer.state.name)
        behind = stored >= 0 and (local is None or local < stored)
        if behind and loop.time() < deadline:
            loop.call_later(CATCH_UP_POLL_S, self._activate, member, choice, stored, deadline)
            return
        queue.attach(consumer, prefer_stored=True)
        queue.pump(consumer)

    def stepped_down(self, queue: StreamQueue, consumer: Consumer) -> None:
        """A member here made inactive is done (its client answered, or it had nothing to
        answer): the leader's group may start the next member."""
        member = self.by_consumer.get(consumer)
        link = member.link if member is not None else None
        if member is None or link is None or link.closed:
            return
        with contextlib.suppress(LinkError):
            link.post(STEPPED, {"vhost": queue.vhost.name, "stream": queue.name,
                                "member": member.id})

    # -- the leader's side ----------------------------------------------------------------

    def _led(self, body: dict[str, Any]) -> StreamQueue | None:
        vhost_name, name = body.get("vhost"), body.get("stream")
        if not isinstance(vhost_name, str) or not isinstance(name, str):
            return None
        vhost = self.broker.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if isinstance(queue, StreamQueue) and queue.role == "leader" and not queue.deleted:
            return queue
        return None

    async def _joined(self, link: Link, body: object) -> None:
        if not isinstance(body, dict):
            return
        member, reference = body.get("member"), body.get("reference")
        if not isinstance(member, int) or not isinstance(reference, str):
            return
        queue = self._led(body)
        if queue is None:  # not (or no longer, or not yet) the leader here
            with contextlib.suppress(LinkError):
                link.post(STATE, {"member": member, "retry": True})
            return
        key = (link.peer_node, member)
        old = self.remote.pop(key, None)
        if old is not None:
            old.queue.groups.leave(old)
        self._watch(link)
        connection = body.get("connection")
        sink = RemoteMember(self, link, queue, member,
                            connection if isinstance(connection, str) else "")
        consumer = Consumer(reference, queue, sink,
                            arguments={"x-single-active-consumer": True})
        consumer.state = Cursor(reference.encode("utf-8")[:255], True, sargs.StartSpec("next"))
        self.remote[key] = consumer
        queue.groups.join(consumer)

    async def _left(self, link: Link, body: object) -> None:
        member = body.get("member") if isinstance(body, dict) else None
        if not isinstance(member, int):
            return
        key = (link.peer_node, member)
        consumer = self.remote.get(key)
        if consumer is not None and _link_of(consumer) is link:
            del self.remote[key]
            consumer.queue.groups.leave(consumer)

    async def _stepped(self, link: Link, body: object) -> None:
        member = body.get("member") if isinstance(body, dict) else None
        consumer = self.remote.get((link.peer_node, member)) if isinstance(member, int) else None
        if consumer is not None and _link_of(consumer) is link:
            consumer.queue.handed_over(consumer)

    # -- links ----------------------------------------------------------------------------

    def _watch(self, link: Link) -> None:
        if id(link) not in self._watched:
            self._watched.add(id(link))
            link.on_close(self._link_closed)

    def _link_closed(self, link: Link) -> None:
        """The peer's members leave this node's groups; this node's members registered over
        it step down and register again when they can."""
        self._watched.discard(id(link))
        for key, consumer in list(self.remote.items()):
            if _link_of(consumer) is link:
                del self.remote[key]
                if not consumer.queue.deleted:
                    consumer.queue.groups.leave(consumer)
        for member in list(self.members.values()):
            if member.link is link:
                self._unregister(member, tell=False)

    async def _retry(self) -> None:
        while True:
            await asyncio.sleep(RETRY_S)
            try:
                for member in list(self.members.values()):
                    queue = member.queue
                    if queue.deleted:
                        self._forget(member)
                    elif member.link is None and queue.role == "replica" and not queue.deleted:
                        self._register(member)
            except Exception:  # the retry must go on
                log.exception("registering single-active-consumer members failed")


def _link_of(consumer: Consumer) -> Link | None:
    sink = consumer.sink
    return sink.link if isinstance(sink, RemoteMember) else None


def install(cluster: ClusterRuntime, broker: Vhosts) -> StreamSac:
    """Answer the `sac.*` kinds, and register members waiting for a group from now on."""
    sac = StreamSac(cluster, broker)
    with contextlib.suppress(RuntimeError):  # no running loop: nothing to retry yet
        sac.start()
    return sac
