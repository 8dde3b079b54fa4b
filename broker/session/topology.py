"""The exchange.* and queue.* methods of a channel: declare, bind, unbind, purge, delete.

One handler per method, on one node and in a cluster alike. Each runs the user's permission
checks and the model's (`VHost.check_*`) synchronously and in RabbitMQ's order, so that the
refusals are the same everywhere; then it starts a step (`backlog.start_step`) that asks the
topology port (`broker.topology`: `topology.local` on one node, `topology.cluster` in a
cluster) and answers unless the method says nowait. The local port never waits, so on one node
the step ends in the turn that read the method, and its reply and its errors are those of a
synchronous handler; the cluster's port waits for etcd, and the channel's later frames wait
for it. `HANDLERS` maps the pamqp method classes to the handlers; `Channel.handle` dispatches
through it and maps domain errors to reply codes.

A name this node does not know yet (a declaration made through another node, whose event is
still on its way) is read from the port's store before a 404: for a passive declare, a bind,
and a publish (`look_up_exchange`, only on a miss). A method on a queue held by another node
(passive declare, purge, delete) is handed to it by the queue itself (the queue-type
interface's `forward` and `forward_delete`), which a queue of this node declines.

The port's refusals are answered as RabbitMQ words a Khepri timeout: 541 INTERNAL_ERROR
`failed to <action> because the metadata store is unavailable` (docs/CLUSTER.md).

Of consuming it knows only which basic.cancel a queue.delete sends after its delete-ok;
nothing of publishing or confirms but the lookup. It reaches its channel and connection
through the Protocols below, never by importing them.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pamqp import commands as m
from pamqp.base import Frame

from leveret.amqp import codec
from leveret.broker.model.errors import AccessRefused, InternalError, NotFound
from leveret.broker.model.queue_client import QueueClient
from leveret.broker.model.vhost import DEFAULT_EXCHANGE_TEXT
from leveret.broker.session import backlog
from leveret.broker.topology.port import (
    BindingSpec,
    ExchangeSpec,
    NotSettled,
    QueueSpec,
    StoreUnavailable,
    TopologyPort,
)

if TYPE_CHECKING:
    from leveret.broker.model.consumer import Consumer
    from leveret.broker.model.queue import Queue
    from leveret.broker.model.queue_client import QueueMethod
    from leveret.broker.model.vhost import VHost

T = TypeVar("T")
Step = Coroutine[Any, Any, None]


class Host(Protocol):
    """What the handlers need of the broker (`broker.Broker`): its topology port."""

    @property
    def topology(self) -> TopologyPort: ...


class Session(backlog.Session, Protocol):
    """What the handlers need of the connection (`connection.Session`)."""

    @property
    def broker(self) -> Host: ...

    @property
    def cluster_key(self) -> str:
        """This connection's name across the cluster (an exclusive queue's owner in etcd)."""
        ...

    @property
    def channels(self) -> Mapping[int, Channel]: ...

    def write(self, data: bytes) -> None: ...


class Channel(backlog.Channel, QueueClient, Protocol):
    """What the handlers need of their channel (`channel.Channel`)."""

    last_queue: str | None

    @property
    def session(self) -> Session: ...

    @property
    def vhost(self) -> VHost: ...

    @property
    def consumers(self) -> dict[str, Consumer]: ...

    def check(self, kind: str, resource_kind: str, name: str) -> None: ...

    def reply(self, method: Frame) -> None: ...

    def notify_cancel(self, consumer: Consumer) -> None: ...


def strip_cr_lf(name: str) -> str:
    """RabbitMQ strips CR and LF from names in declarations."""
    return name.replace("\r", "").replace("\n", "") if ("\r" in name or "\n" in name) else name


def queue_name(channel: Channel, name: str) -> str:
    """An empty queue name means the last queue declared on this channel."""
    if name:
        return name
    if channel.last_queue is None:
        raise NotFound("no previously declared queue")
    return channel.last_queue


def unavailable(action: str) -> InternalError:
    return InternalError(f"failed to {action} because the metadata store is unavailable")


def _port(channel: Channel) -> TopologyPort:
    return channel.session.broker.topology


def _binding_permissions(channel: Channel, kind: str, destination: str, source: str) -> None:
    channel.check("write", kind, destination)
    if source and destination:
        channel.check("read", "exchange", source)


async def _ask(change: Awaitable[T], action: Callable[[], str],
               unanswered: Callable[[], None] | None = None) -> T:
    """The port's answer to `change`; its refusals as RabbitMQ words a Khepri timeout:
    541 INTERNAL_ERROR, `failed to <action>` (worded only then). `unanswered` runs first when
    the store did not answer."""
    try:
        return await change
    except StoreUnavailable:  # OutOfCluster too: no lease for a leased entity
        if unanswered is not None:
            unanswered()
        raise unavailable(action()) from None
    except NotSettled:
        raise InternalError(f"failed to {action()}: this node did not see the change in time")\
            from None


async def _known(channel: Channel, exchanges: Sequence[str] = (),
                 queues: Sequence[str] = ()) -> None:
    """The names this node's model lacks, read from the topology's store (a declaration's
    event may still be on its way); the model's answer stands if the store cannot say."""
    try:
        await _port(channel).refresh(channel.vhost, exchanges, queues)
    except NotSettled:
        raise InternalError("failed to read the topology: this node did not see a change "
                            "in time") from None


def _checked(channel: Channel, index: int, check: Callable[[], T], exchanges: list[str],
             queues: list[str], then: Callable[[T], Step | None]) -> None:
    """Run `check`; on a 404, read the store for the names first and run it again in a step
    (which, on one node, ends at once with the same 404)."""
    try:
        checked = check()
    except NotFound:
        async def step() -> None:
            await _known(channel, exchanges, queues)
            follow = then(check())
            if follow is not None:
                await follow
            else:
                await _started_inside(channel)
        backlog.start_step(channel, index, step())
        return
    follow = then(checked)
    if follow is not None:
        backlog.start_step(channel, index, follow)


async def _started_inside(channel: Channel) -> None:
    """A step started by what this step called (forwarding starts its own): wait for it, so
    the channel's waiting frames run after it, in order."""
    running = channel.backlog.task if channel.backlog is not None else None
    if running is not None and running is not asyncio.current_task():
        await running


def _reply(channel: Channel, nowait: bool, ok: Frame) -> None:
    """Answer unless the method says nowait or the channel closed while its step ran."""
    if not nowait and not channel.closed:
        channel.reply(ok)


def _holder_answers(channel: Channel, queue: Queue) -> Callable[[QueueMethod], None]:
    """How the reply of the node that holds `queue` to a method handed to it (`forward`,
    `forward_delete`: in a step of its own) becomes the client's: declare-ok with this
    queue's name and the holder's counts, purge-ok and delete-ok as they came."""
    def answer(reply: QueueMethod) -> None:
        if isinstance(reply, m.Queue.DeclareOk):
            channel.session.write(codec.encode_declare_ok(
                channel.number, queue.name, reply.message_count or 0, reply.consumer_count or 0))
        elif isinstance(reply, Frame):
            channel.reply(reply)
    return answer


# -- exchanges --------------------------------------------------------------------------------


def exchange_declare(channel: Channel, method: m.Exchange.Declare) -> None:
    vhost = channel.vhost
    name = strip_cr_lf(method.exchange)
    arguments = method.arguments or {}
    if method.passive:
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        _checked(channel, method.index, lambda: vhost.exchange(name), [name], [],
                 lambda _x: _reply(channel, method.nowait, m.Exchange.DeclareOk()))
        return
    vhost.check_exchange_declaration(
        name, method.exchange_type, durable=method.durable, auto_delete=method.auto_delete,
        internal=method.internal, arguments=arguments, check=channel.check)
    spec = ExchangeSpec(name, method.exchange_type, method.durable, method.auto_delete,
                        method.internal, dict(arguments))
    backlog.start_step(channel, method.index, _declare_exchange(channel, method, spec))


async def _declare_exchange(channel: Channel, method: m.Exchange.Declare,
                            spec: ExchangeSpec) -> None:
    vhost = channel.vhost
    await _ask(_port(channel).declare_exchange(vhost, spec),
               lambda: f"declare {vhost.rs('exchange', spec.name)}")
    _reply(channel, method.nowait, m.Exchange.DeclareOk())


def exchange_delete(channel: Channel, method: m.Exchange.Delete) -> None:
    name = strip_cr_lf(method.exchange)
    if name and not name.startswith("amq."):
        channel.check("configure", "exchange", name)
    channel.vhost.check_exchange_delete(name, method.if_unused)

    async def step() -> None:
        vhost = channel.vhost
        await _ask(_port(channel).delete_exchange(vhost, name),
                   lambda: f"delete {vhost.rs('exchange', name)}")
        _reply(channel, method.nowait, m.Exchange.DeleteOk())
    backlog.start_step(channel, method.index, step())


def exchange_bind(channel: Channel, method: m.Exchange.Bind) -> None:
    _binding_permissions(channel, "exchange", method.destination, method.source)
    _bind(channel, method, method.source, "exchange", method.destination, method.routing_key,
          m.Exchange.BindOk())


def exchange_unbind(channel: Channel, method: m.Exchange.Unbind) -> None:
    _binding_permissions(channel, "exchange", method.destination, method.source)
    _unbind(channel, method, method.source, "exchange", method.destination,
            method.routing_key, m.Exchange.UnbindOk())


# -- bindings ---------------------------------------------------------------------------------

BindMethod = m.Exchange.Bind | m.Queue.Bind
UnbindMethod = m.Exchange.Unbind | m.Queue.Unbind


def _bind(channel: Channel, method: BindMethod, source: str, kind: str, destination: str,
          key: str, ok: Frame) -> None:
    vhost, session = channel.vhost, channel.session
    arguments = method.arguments or {}
    spec = _binding(source, kind, destination, key, arguments, session)
    _checked(channel, method.index,
             lambda: vhost.check_bind(source, kind, destination, key, arguments, owner=session),
             [source] + ([destination] if kind == "exchange" else []),
             [destination] if kind == "queue" else [],
             lambda _b: _store_bind(channel, method.nowait, spec, ok))


def _binding(source: str, kind: str, destination: str, key: str,
             arguments: Mapping[str, object], owner: object) -> BindingSpec:
    return BindingSpec(source, "queue" if kind == "queue" else "exchange", destination, key,
                       dict(arguments), owner)


async def _store_bind(channel: Channel, nowait: bool, spec: BindingSpec, ok: Frame) -> None:
    await _ask(_port(channel).bind(channel.vhost, spec), lambda: "create binding")
    _reply(channel, nowait, ok)


def _unbind(channel: Channel, method: UnbindMethod, source: str, kind: str, destination: str,
            key: str, ok: Frame) -> None:
    vhost, session = channel.vhost, channel.session
    arguments = method.arguments or {}
    vhost.check_unbind(source, kind, destination, key, arguments, owner=session)
    spec = _binding(source, kind, destination, key, arguments, session)
    nowait = isinstance(method, m.Exchange.Unbind) and method.nowait  # queue.unbind has none

    async def step() -> None:
        await _ask(_port(channel).unbind(channel.vhost, spec), lambda: "delete binding")
        _reply(channel, nowait, ok)
    backlog.start_step(channel, method.index, step())


# -- queues -----------------------------------------------------------------------------------


def queue_declare(channel: Channel, method: m.Queue.Declare) -> None:
    # Unlike bind, purge, delete, consume and get, declare does not read an empty name as
    # the last declared queue: a passive declare of "" is 404 "no queue ''" in RabbitMQ.
    vhost, session = channel.vhost, channel.session
    arguments = dict(method.arguments or {})
    if method.passive:
        name = strip_cr_lf(method.queue)
        _checked(channel, method.index, lambda: vhost.queue(name), [], [name],
                 lambda queue: _passive_queue(channel, method, queue))
        return
    name, queue_type, existing = vhost.check_queue_declaration(
        strip_cr_lf(method.queue), owner=session, durable=method.durable,
        exclusive=method.exclusive, auto_delete=method.auto_delete, arguments=arguments,
        check=channel.check)
    spec = QueueSpec(
        name, queue_type, durable=method.durable, auto_delete=method.auto_delete,
        exclusive=method.exclusive, arguments=arguments, owner=session,
        owner_key=session.cluster_key if method.exclusive else None, new=existing is None)
    backlog.start_step(channel, method.index, _declare_queue(channel, method, spec))


ELECTION_WAIT_S = 30.0  # as long as a quorum queue holds a publish for its next leader
ELECTION_POLL_S = 0.1


def _after_election(channel: Channel, method: m.Queue.Declare | m.Queue.Purge | m.Queue.Delete,
                    queue: Queue,
                    again: Callable[[], None]) -> bool:
    """A replicated queue between two leaders: `method` waits (the channel's later methods
    behind it) until the next leader is known, then is handled `again` from the start; after
    ELECTION_WAIT_S without one, 404 (the publishes held meanwhile are nack'ed then too). False
    if the queue has a leader: handle it now."""
    if not queue.awaiting_leader():
        return False

    async def step() -> None:
        deadline = asyncio.get_running_loop().time() + ELECTION_WAIT_S
        while queue.awaiting_leader():
            if asyncio.get_running_loop().time() >= deadline:
                raise NotFound(f"{queue.resource} has no leader: too few of its members are "
                               "running to elect one")
            await asyncio.sleep(ELECTION_POLL_S)
        if not channel.closed:
            again()
    backlog.start_step(channel, method.index, step())
    return True


def _passive_queue(channel: Channel, method: m.Queue.Declare, queue: Queue) -> None:
    if _after_election(channel, method, queue,
                       lambda: _passive_queue(channel, method, channel.vhost.queue(queue.name))):
        return
    channel.vhost.check_exclusive(queue, channel.session)
    channel.last_queue = queue.name
    if queue.forward(channel, method, _holder_answers(channel, queue)):
        return
    queue.touch()
    if not method.nowait:
        channel.session.write(codec.encode_declare_ok(
            channel.number, queue.name, queue.message_count, queue.consumer_count))


async def _declare_queue(channel: Channel, method: m.Queue.Declare, spec: QueueSpec) -> None:
    vhost, port = channel.vhost, _port(channel)
    declared = await _ask(port.declare_queue(vhost, spec),
                          lambda: f"declare {vhost.rs('queue', spec.name)}")
    queue = vhost.queues.get(spec.name)
    if queue is None and declared.created and declared.placement.node == port.node:
        raise InternalError(f"cannot create {vhost.rs('queue', spec.name)} on this node")
    if channel.closed:
        return
    channel.last_queue = spec.name
    if queue is not None and not declared.created:
        queue.touch()
    if not method.nowait:
        count, consumers = (queue.message_count, queue.consumer_count) if queue else (0, 0)
        channel.session.write(codec.encode_declare_ok(channel.number, spec.name, count,
                                                      consumers))


def queue_bind(channel: Channel, method: m.Queue.Bind) -> None:
    queue = queue_name(channel, strip_cr_lf(method.queue))
    key = method.routing_key
    if not method.queue and not key:
        key = queue
    _binding_permissions(channel, "queue", queue, method.exchange)
    _bind(channel, method, method.exchange, "queue", queue, key, m.Queue.BindOk())


def queue_unbind(channel: Channel, method: m.Queue.Unbind) -> None:
    queue = queue_name(channel, strip_cr_lf(method.queue))
    _binding_permissions(channel, "queue", queue, method.exchange)
    _unbind(channel, method, method.exchange, "queue", queue, method.routing_key,
            m.Queue.UnbindOk())


def queue_purge(channel: Channel, method: m.Queue.Purge) -> None:
    name = queue_name(channel, strip_cr_lf(method.queue))
    channel.check("read", "queue", name)
    queue = channel.vhost.queue(name)
    if _after_election(channel, method, queue, lambda: queue_purge(channel, method)):
        return
    channel.vhost.check_exclusive(queue, channel.session)
    if queue.forward(channel, method, _holder_answers(channel, queue)):
        return
    count = queue.purge()  # held here: purged here
    if not method.nowait:
        channel.reply(m.Queue.PurgeOk(message_count=count))


def queue_delete(channel: Channel, method: m.Queue.Delete) -> None:
    vhost = channel.vhost
    name = queue_name(channel, strip_cr_lf(method.queue))
    channel.check("configure", "queue", name)
    queue = vhost.queues.get(name)
    if queue is not None and _after_election(channel, method, queue,
                                             lambda: queue_delete(channel, method)):
        return
    if queue is not None:
        vhost.check_exclusive(queue, channel.session)
        if queue.forward_delete(channel, method, _holder_answers(channel, queue)):
            return
        queue.check_delete(method.if_unused, method.if_empty)
        if queue.holder is not None:
            # its node is down: deleted from the metadata alone, with nothing here to count
            # or to cancel after delete-ok
            queue = None
    backlog.start_step(channel, method.index, _delete_queue(channel, method, name, queue))


async def _delete_queue(channel: Channel, method: m.Queue.Delete, name: str,
                        queue: Queue | None) -> None:
    vhost = channel.vhost
    count, later = 0, []
    if queue is not None:  # the cache may apply the delete before this step resumes
        count = queue.count_on_delete
        later = _cancels_after_reply(channel, queue)

    def still_consuming() -> None:  # the closing channel cancels them
        for owner, consumer in later:
            owner.consumers[consumer.tag] = consumer
    deleted = await _ask(_port(channel).delete_queue(vhost, name),
                         lambda: f"delete {vhost.rs('queue', name)}", still_consuming)
    if deleted is not None and deleted.message_count is not None and queue is not None:
        count = deleted.message_count
    if channel.closed:
        return
    if not method.nowait:
        channel.reply(m.Queue.DeleteOk(message_count=count))
    for owner, consumer in later:
        owner.notify_cancel(consumer)


def _cancels_after_reply(channel: Channel, queue: Queue) -> list[tuple[Channel, Consumer]]:
    """Take out of their channels the consumers whose basic.cancel must follow delete-ok.

    RabbitMQ's deleting channel hears that the queue is gone only once it has replied, so
    the cancels of its own consumers follow its delete-ok. The other channels of a classic
    queue hear of it at the same moment (usually before that delete-ok: a race, in RabbitMQ),
    and are cancelled at once by the queue; a stream's consumers hear of it later, from the
    stream coordinator, so on this connection all of them follow delete-ok.
    """
    owners = channel.session.channels.values() if queue.type == "stream" else (channel,)
    later = []
    for owner in owners:
        for consumer in [c for c in owner.consumers.values() if c.queue is queue]:
            del owner.consumers[consumer.tag]  # so the queue's own server_cancel skips it
            later.append((owner, consumer))
    return later


# -- publishing -------------------------------------------------------------------------------


def look_up_exchange(channel: Channel, exchange: str, publish: Callable[[], None]) -> None:
    """A publish to an exchange this node's model lacks: read it from the port's store first
    (a declaration made through another node may still be on its way), then `publish`, which
    finds it or answers 404. On one node there is nothing to read: `publish` runs now."""
    async def step() -> None:
        await _known(channel, [exchange])
        publish()
    backlog.start_step(channel, backlog.PUBLISH_INDEX, step())


Handler = Callable[[Channel, Any], None]  # called with an instance of its key in HANDLERS

HANDLERS: dict[type[Frame], Handler] = {
    m.Exchange.Declare: exchange_declare,
    m.Exchange.Delete: exchange_delete,
    m.Exchange.Bind: exchange_bind,
    m.Exchange.Unbind: exchange_unbind,
    m.Queue.Declare: queue_declare,
    m.Queue.Bind: queue_bind,
    m.Queue.Unbind: queue_unbind,
    m.Queue.Purge: queue_purge,
    m.Queue.Delete: queue_delete,
}
