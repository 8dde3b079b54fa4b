"""The exchange.* and queue.* methods of a channel in cluster mode.

Each handler runs the same permission and model checks as the single-node handlers
(`session.topology`), synchronously and in RabbitMQ's order, so the refusals are the same; then
it starts a step (`backlog.run_step`: the channel's later frames wait) that calls the topology
port (`broker.topology`, `topology.cluster.ClusterTopology`: placement, the etcd txn, and the
wait until every running node has applied its revision) and only then answers. The model is
changed by the topology's sync (`cluster.topology_sync`) as the change comes back from etcd, on
every node alike; a queue.delete of a queue held here removes it at once. A method on a queue
held by another node (passive declare, purge, delete) goes to `forwarding.forward_queue_method`.

A name this node does not know yet (a declaration whose watch event is still on its way) is
read from etcd before a 404: for a passive declare, a bind, and a publish (only on a miss).

etcd unreachable: 541 INTERNAL_ERROR `failed to <action> because the metadata store is
unavailable`, as RabbitMQ answers a Khepri timeout (docs/CLUSTER.md). A queue declaration that
may have been applied anyway is undone by the port, for every front end alike.

It knows the session, the model and the cluster runtime; nothing of etcd's wire.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from pamqp import commands as m

from leveret.amqp import codec
from leveret.broker.model.errors import (
    AccessRefused,
    InternalError,
    NotFound,
    PreconditionFailed,
)
from leveret.broker.model.vhost import DEFAULT_EXCHANGE_TEXT
from leveret.broker.remote import forwarding
from leveret.broker.remote.remote_queue import RemoteQueue
from leveret.broker.session import backlog
from leveret.broker.session.topology import (
    _binding_permissions,
    _cancels_after_reply,
    queue_name,
    queue_purge,
    strip_cr_lf,
)
from leveret.broker.topology.port import (
    BindingSpec,
    ExchangeSpec,
    NotSettled,
    QueueSpec,
    StoreUnavailable,
    TopologyPort,
)

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.model.queue import Queue
    from leveret.broker.session.channel import Channel

Step = Coroutine[Any, Any, None]


def unavailable(action: str) -> InternalError:
    return InternalError(f"failed to {action} because the metadata store is unavailable")


def _cluster(channel: Channel) -> ClusterRuntime:
    cluster = channel.session.broker.cluster
    assert cluster is not None
    return cluster


def _port(channel: Channel) -> TopologyPort:
    return channel.session.broker.topology


@asynccontextmanager
async def _answering(action: str) -> AsyncIterator[None]:
    """The port's refusals as RabbitMQ words a Khepri timeout: 541 INTERNAL_ERROR."""
    try:
        yield
    except StoreUnavailable:  # OutOfCluster too: no lease for a leased entity
        raise unavailable(action) from None
    except NotSettled:
        raise InternalError(f"failed to {action}: this node did not see the change in time")\
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


def _checked(channel: Channel, index: int, check: Callable[[], Any], exchanges: list[str],
             queues: list[str], then: Callable[[Any], Step | None]) -> None:
    """Run `check`; on a 404, read etcd for the names first and run it again in a step."""
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
        backlog.run_step(channel, index, step())
        return
    follow = then(checked)
    if follow is not None:
        backlog.run_step(channel, index, follow)


async def _started_inside(channel: Channel) -> None:
    """A step started by what this step called (forwarding starts its own): wait for it, so
    the channel's waiting frames run after it, in order."""
    running = channel.backlog.task if channel.backlog is not None else None
    if running is not None and running is not asyncio.current_task():
        await running


def _forward(channel: Channel, queue: RemoteQueue, method: Any) -> None:
    """A method on a queue held by another node: forwarding asks the holder, in a step of
    its own, and answers with its reply or its error."""
    forwarding.forward_queue_method(channel, queue, method)


# -- exchanges --------------------------------------------------------------------------------


def exchange_declare(channel: Channel, method: Any) -> None:
    vhost = channel.vhost
    name = strip_cr_lf(method.exchange)
    arguments = method.arguments or {}
    if method.passive:
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_TEXT)
        _checked(channel, method.index, lambda: vhost.exchange(name), [name], [],
                 lambda _x: _reply(channel, method, m.Exchange.DeclareOk()))
        return
    vhost.check_exchange_declaration(
        name, method.exchange_type, durable=method.durable, auto_delete=method.auto_delete,
        internal=method.internal, arguments=arguments, check=channel.check)
    spec = ExchangeSpec(name, method.exchange_type, method.durable, method.auto_delete,
                        method.internal, dict(arguments))
    backlog.run_step(channel, method.index, _declare_exchange(channel, method, spec))


async def _declare_exchange(channel: Channel, method: Any, spec: ExchangeSpec) -> None:
    async with _answering(f"declare {channel.vhost.rs('exchange', spec.name)}"):
        await _port(channel).declare_exchange(channel.vhost, spec)
    _reply(channel, method, m.Exchange.DeclareOk())


def exchange_delete(channel: Channel, method: Any) -> None:
    name = strip_cr_lf(method.exchange)
    if name and not name.startswith("amq."):
        channel.check("configure", "exchange", name)
    channel.vhost.check_exchange_delete(name, method.if_unused)

    async def step() -> None:
        async with _answering(f"delete {channel.vhost.rs('exchange', name)}"):
            await _port(channel).delete_exchange(channel.vhost, name)
        _reply(channel, method, m.Exchange.DeleteOk())
    backlog.run_step(channel, method.index, step())


def exchange_bind(channel: Channel, method: Any) -> None:
    _binding_permissions(channel, "exchange", method.destination, method.source)
    _bind(channel, method, method.source, "exchange", method.destination, method.routing_key,
          m.Exchange.BindOk())


def exchange_unbind(channel: Channel, method: Any) -> None:
    _binding_permissions(channel, "exchange", method.destination, method.source)
    _unbind(channel, method, method.source, "exchange", method.destination,
            method.routing_key, m.Exchange.UnbindOk())


# -- bindings ---------------------------------------------------------------------------------


def _bind(channel: Channel, method: Any, source: str, kind: str, destination: str, key: str,
          ok: Any) -> None:
    vhost, session = channel.vhost, channel.session
    arguments = method.arguments or {}
    spec = _binding(source, kind, destination, key, arguments)
    _checked(channel, method.index,
             lambda: vhost.check_bind(source, kind, destination, key, arguments, owner=session),
             [source] + ([destination] if kind == "exchange" else []),
             [destination] if kind == "queue" else [],
             lambda _b: _store_bind(channel, method, spec, ok))


def _binding(source: str, kind: str, destination: str, key: str,
             arguments: dict[str, Any]) -> BindingSpec:
    return BindingSpec(source, "queue" if kind == "queue" else "exchange", destination, key,
                       dict(arguments))


async def _store_bind(channel: Channel, method: Any, spec: BindingSpec, ok: Any) -> None:
    async with _answering("create binding"):
        await _port(channel).bind(channel.vhost, spec)
    _reply(channel, method, ok)


def _unbind(channel: Channel, method: Any, source: str, kind: str, destination: str, key: str,
            ok: Any) -> None:
    vhost = channel.vhost
    arguments = method.arguments or {}
    vhost.check_unbind(source, kind, destination, key, arguments, owner=channel.session)
    spec = _binding(source, kind, destination, key, arguments)

    async def step() -> None:
        async with _answering("delete binding"):
            await _port(channel).unbind(channel.vhost, spec)
        _reply(channel, method, ok)
    backlog.run_step(channel, method.index, step())


# -- queues -----------------------------------------------------------------------------------


def queue_declare(channel: Channel, method: Any) -> None:
    vhost, session = channel.vhost, channel.session
    arguments = dict(method.arguments or {})
    if method.passive:
        name = strip_cr_lf(method.queue)
        _checked(channel, method.index, lambda: vhost.queue(name), [], [name],
                 lambda queue: _passive_queue(channel, method, queue))
        return
    name, queue_type, _existing = vhost.check_queue_declaration(
        strip_cr_lf(method.queue), owner=session, durable=method.durable,
        exclusive=method.exclusive, auto_delete=method.auto_delete, arguments=arguments,
        check=channel.check)
    spec = QueueSpec(
        name, queue_type, durable=method.durable, auto_delete=method.auto_delete,
        exclusive=method.exclusive, arguments=arguments, owner=session,
        owner_key=session.broker.cluster_key(session) if method.exclusive else None,
        new=_existing is None)
    backlog.run_step(channel, method.index, _declare_queue(channel, method, spec))


def _passive_queue(channel: Channel, method: Any, queue: Queue) -> None:
    channel.vhost.check_exclusive(queue, channel.session)
    channel.last_queue = queue.name
    if isinstance(queue, RemoteQueue):
        _forward(channel, queue, method)
        return None
    queue.touch()
    if not method.nowait:
        channel.session.write(codec.encode_declare_ok(
            channel.number, queue.name, queue.message_count, queue.consumer_count))
    return None


async def _declare_queue(channel: Channel, method: Any, spec: QueueSpec) -> None:
    vhost, port = channel.vhost, _port(channel)
    async with _answering(f"declare {vhost.rs('queue', spec.name)}"):
        declared = await port.declare_queue(vhost, spec)
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


def queue_bind(channel: Channel, method: Any) -> None:
    queue = queue_name(channel, strip_cr_lf(method.queue))
    key = method.routing_key
    if not method.queue and not key:
        key = queue
    _binding_permissions(channel, "queue", queue, method.exchange)
    _bind(channel, method, method.exchange, "queue", queue, key, m.Queue.BindOk())


def queue_unbind(channel: Channel, method: Any) -> None:
    queue = queue_name(channel, strip_cr_lf(method.queue))
    _binding_permissions(channel, "queue", queue, method.exchange)
    _unbind(channel, method, method.exchange, "queue", queue, method.routing_key,
            m.Queue.UnbindOk())


def cluster_queue_purge(channel: Channel, method: Any) -> None:
    name = queue_name(channel, strip_cr_lf(method.queue))
    queue = channel.vhost.queues.get(name)
    if isinstance(queue, RemoteQueue):
        channel.check("read", "queue", name)
        channel.vhost.check_exclusive(queue, channel.session)
        _forward(channel, queue, method)
        return
    queue_purge(channel, method)  # held here: purged here, as on one node


def _reachable(channel: Channel, queue: RemoteQueue) -> bool:
    link = _cluster(channel).links.link_to(queue.node)
    return link is not None and not link.closed


def queue_delete(channel: Channel, method: Any) -> None:
    vhost = channel.vhost
    name = queue_name(channel, strip_cr_lf(method.queue))
    channel.check("configure", "queue", name)
    queue = vhost.queues.get(name)
    if queue is not None:
        vhost.check_exclusive(queue, channel.session)
        if isinstance(queue, RemoteQueue):
            if _reachable(channel, queue):
                _forward(channel, queue, method)
                return
            # its node is down: deleted from the metadata alone, as RabbitMQ force-deletes a
            # classic queue whose process is gone (but not if_empty: it may hold messages)
            if method.if_empty:
                raise PreconditionFailed(f"{queue.resource} not empty")
            queue = None
        else:
            queue.check_delete(method.if_unused, method.if_empty)
    backlog.run_step(channel, method.index, _delete_queue(channel, method, name, queue))


async def _delete_queue(channel: Channel, method: Any, name: str, queue: Queue | None) -> None:
    vhost = channel.vhost
    count, later = 0, []
    if queue is not None:  # the cache may apply the delete before this step resumes
        count = queue.count_on_delete
        later = _cancels_after_reply(channel, queue)
    async with _answering(f"delete {vhost.rs('queue', name)}"):
        try:
            deleted = await _port(channel).delete_queue(vhost, name)
        except StoreUnavailable:
            for owner, consumer in later:  # still consuming: the closing channel cancels them
                owner.consumers[consumer.tag] = consumer
            raise
    if deleted is not None and deleted.message_count is not None and queue is not None:
        count = deleted.message_count
    if channel.closed:
        return
    if not method.nowait:
        channel.reply(m.Queue.DeleteOk(message_count=count))
    for owner, consumer in later:
        owner.notify_cancel(consumer)


# -- replies and publishing -------------------------------------------------------------------


def _reply(channel: Channel, method: Any, ok: Any) -> None:
    """Answer unless the method says nowait (queue.unbind has no nowait) or the channel
    closed while its step ran."""
    if not getattr(method, "nowait", False) and not channel.closed:
        channel.reply(ok)


def _publish_with_lookup(channel: Channel) -> Callable[..., None]:
    """The channel's publish, reading etcd first for an exchange this node does not know."""
    ref = weakref.ref(channel)  # no cycle: the channel holds this function
    publish = type(channel).publish

    def cluster_publish(exchange: str, *rest: Any) -> None:
        owner = ref()
        assert owner is not None
        if exchange in owner.vhost.exchanges:
            publish(owner, exchange, *rest)
            return

        async def step() -> None:
            current = ref()
            if current is None:
                return
            await _known(current, [exchange])
            publish(current, exchange, *rest)
        backlog.run_step(owner, backlog.PUBLISH_INDEX, step())
    return cluster_publish


HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    m.Exchange.Declare: exchange_declare,
    m.Exchange.Delete: exchange_delete,
    m.Exchange.Bind: exchange_bind,
    m.Exchange.Unbind: exchange_unbind,
    m.Queue.Declare: queue_declare,
    m.Queue.Bind: queue_bind,
    m.Queue.Unbind: queue_unbind,
    m.Queue.Purge: cluster_queue_purge,
    m.Queue.Delete: queue_delete,
}


def handlers(channel: Channel) -> dict[type, Callable[[Channel, Any], None]]:
    """The cluster-mode handlers of a channel (and its publish, which reads etcd on a miss)."""
    channel.publish = _publish_with_lookup(channel)  # type: ignore[method-assign]
    return HANDLERS
