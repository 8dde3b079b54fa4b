"""The exchange.* and queue.* methods of a channel in cluster mode.

Each handler runs the same permission and model checks as the single-node handlers
(`session.topology`), synchronously and in RabbitMQ's order, so the refusals are the same; then
it starts a step (`backlog.run_step`: the channel's later frames wait) that runs the topology
store's etcd txn, waits until every running node has applied its revision
(`ClusterRuntime.settle`) and only then answers. The model is changed by the topology's sync
(`cluster.topology_sync`) as the change comes back from etcd, on every node alike; a queue.delete
of a queue held here removes it at once. A method on a queue held by another node (passive
declare, purge, delete) goes to `forwarding.forward_queue_method`.

A name this node does not know yet (a declaration whose watch event is still on its way) is
read from etcd before a 404: for a passive declare, a bind, and a publish (only on a miss).

etcd unreachable: 541 INTERNAL_ERROR `failed to <action> because the metadata store is
unavailable`, as RabbitMQ answers a Khepri timeout (docs/CLUSTER.md). A queue declaration that
may have been applied anyway is undone in the background, so a refused declaration leaves nothing.

It knows the session, the model and the cluster runtime; nothing of etcd's wire.
Single-threaded: runs on the event loop thread of its connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from pamqp import commands as m

from leveret.amqp import codec
from leveret.broker import logs
from leveret.broker.cluster import running_nodes, stream_placement
from leveret.broker.cluster.etcd import EtcdException, EtcdUnavailable
from leveret.broker.cluster.runtime import SETTLE_TIMEOUT_S
from leveret.broker.cluster.topology import Created
from leveret.broker.cluster.topology_records import BindingRecord, ExchangeRecord, QueueRecord
from leveret.broker.model.errors import (
    AccessRefused,
    InternalError,
    NotFound,
    PreconditionFailed,
)
from leveret.broker.model.policy import effective
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

if TYPE_CHECKING:
    from leveret.broker.cluster.runtime import ClusterRuntime
    from leveret.broker.cluster.topology_sync import TopologySync
    from leveret.broker.model.queue import Queue
    from leveret.broker.session.channel import Channel

log = logs.get("leveret.cluster.topology")
Step = Coroutine[Any, Any, None]
UNDO_PAUSE_S = 0.5
UNDO_WINDOW_S = 30.0  # how long a refused declaration is watched for once etcd answers


def unavailable(action: str) -> InternalError:
    return InternalError(f"failed to {action} because the metadata store is unavailable")


def _cluster(channel: Channel) -> ClusterRuntime:
    cluster = channel.session.broker.cluster
    assert cluster is not None
    return cluster


def _sync(channel: Channel) -> TopologySync:
    sync = channel.session.broker.topology_sync
    assert sync is not None
    return sync


def _lease(cluster: ClusterRuntime, action: str) -> int:
    lease = cluster.membership.lease
    if lease is None or not lease.alive:
        raise unavailable(action)
    return lease.id


async def _settle(cluster: ClusterRuntime, revision: int, action: str) -> None:
    try:
        await cluster.settle(revision)
    except TimeoutError:
        raise InternalError(f"failed to {action}: this node did not see the change in time")\
            from None


async def _known(channel: Channel, exchanges: Sequence[str] = (),
                 queues: Sequence[str] = ()) -> None:
    """Read from etcd the names this node's model lacks; return once the cache has applied
    those that exist (the declaration's event was still on its way)."""
    cluster, vhost = _cluster(channel), channel.vhost
    revision = 0
    try:
        for name in exchanges:
            if name not in vhost.exchanges:
                found: Any = await cluster.store.get_exchange(vhost.name, name)
                revision = max(revision, found.mod_revision if found else 0)
        for name in queues:
            if name not in vhost.queues:
                found = await cluster.store.get_queue(vhost.name, name)
                revision = max(revision, found.mod_revision if found else 0)
    except EtcdException:
        return  # the model's answer stands
    if revision:
        try:
            await cluster.cache.wait_for(revision, SETTLE_TIMEOUT_S)
        except TimeoutError:
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
    record = ExchangeRecord(vhost.name, name, method.exchange_type, method.durable,
                            method.auto_delete, method.internal, dict(arguments))
    backlog.run_step(channel, method.index, _declare_exchange(channel, method, record))


async def _declare_exchange(channel: Channel, method: Any, record: ExchangeRecord) -> None:
    cluster = _cluster(channel)
    action = f"declare {channel.vhost.rs('exchange', record.name)}"
    lease = _lease(cluster, action) if record.auto_delete or not record.durable else 0
    try:
        result = await cluster.store.declare_exchange(record, lease)
    except EtcdUnavailable:
        raise unavailable(action) from None
    await _settle(cluster, result.revision, action)
    _reply(channel, method, m.Exchange.DeclareOk())


def exchange_delete(channel: Channel, method: Any) -> None:
    name = strip_cr_lf(method.exchange)
    if name and not name.startswith("amq."):
        channel.check("configure", "exchange", name)
    channel.vhost.check_exchange_delete(name, method.if_unused)

    async def step() -> None:
        cluster = _cluster(channel)
        action = f"delete {channel.vhost.rs('exchange', name)}"
        try:
            revision = await cluster.store.delete_exchange(channel.vhost.name, name)
        except EtcdUnavailable:
            raise unavailable(action) from None
        if revision is not None:
            await _settle(cluster, revision, action)
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
    record = BindingRecord(vhost.name, source, "queue" if kind == "queue" else "exchange",
                           destination, key, dict(arguments))
    _checked(channel, method.index,
             lambda: vhost.check_bind(source, kind, destination, key, arguments, owner=session),
             [source] + ([destination] if kind == "exchange" else []),
             [destination] if kind == "queue" else [],
             lambda _b: _store_bind(channel, method, record, ok))


async def _store_bind(channel: Channel, method: Any, record: BindingRecord, ok: Any) -> None:
    cluster = _cluster(channel)
    try:
        result = await cluster.store.bind(record)
    except EtcdUnavailable:
        raise unavailable("create binding") from None
    await _settle(cluster, result.revision, "create binding")
    _reply(channel, method, ok)


def _unbind(channel: Channel, method: Any, source: str, kind: str, destination: str, key: str,
            ok: Any) -> None:
    vhost = channel.vhost
    arguments = method.arguments or {}
    vhost.check_unbind(source, kind, destination, key, arguments, owner=channel.session)
    record = BindingRecord(vhost.name, source, "queue" if kind == "queue" else "exchange",
                           destination, key, dict(arguments))

    async def step() -> None:
        cluster = _cluster(channel)
        try:
            revision = await cluster.store.unbind(record)
        except EtcdUnavailable:
            raise unavailable("delete binding") from None
        if revision is not None:
            await _settle(cluster, revision, "delete binding")
        _reply(channel, method, ok)
    backlog.run_step(channel, method.index, step())


# -- queues -----------------------------------------------------------------------------------


def _locator(channel: Channel, queue_type: str, name: str, arguments: dict[str, Any]) -> str:
    """The `queue-leader-locator` policy key, else the `x-queue-leader-locator` argument, else
    the node's `queue_leader_locator` setting (`client-local` by default), as in RabbitMQ."""
    policy = effective(channel.vhost.policies, "queues", queue_type, name)
    return stream_placement.locator(
        policy.definition if policy is not None else None, arguments,
        getattr(channel.session.broker.config, "queue_leader_locator", "client-local"))


def place(channel: Channel, queue_type: str, name: str, arguments: dict[str, Any],
          exclusive: bool) -> str:
    """The node that will hold a new queue: this one (`client-local`, and always for an
    exclusive queue) or, for `balanced`, the running node holding the fewest queues. The
    `queue-leader-locator` policy key wins over the argument, as in RabbitMQ."""
    cluster = _cluster(channel)
    if exclusive:
        return cluster.node
    if _locator(channel, queue_type, name, arguments) == "client-local":
        return cluster.node  # the others ask for balanced (RabbitMQ 3.10+)
    held = dict.fromkeys(running_nodes.reachable_nodes(cluster), 0)
    for record in cluster.cache.all("queues"):
        if isinstance(record, QueueRecord) and record.node in held:
            held[record.node] += 1
    return min(sorted(held), key=lambda node: held[node])


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
    durable = method.durable and not method.exclusive
    cluster = _cluster(channel)
    stream_locator: str | None = None  # a new stream: placed in the step (it may wait)
    if queue_type == "stream" and _existing is None:
        stream_locator = _locator(channel, "stream", name, arguments)
        node = cluster.node
    else:
        node = place(channel, queue_type, name, arguments, method.exclusive)
    record = QueueRecord(
        vhost.name, name, queue_type, durable=durable, auto_delete=method.auto_delete,
        exclusive=method.exclusive, arguments=arguments, node=node,
        storage_id=uuid.uuid4().hex,  # the declaration's identity; a durable one's folder
        owner_node=cluster.node if method.exclusive else None,
        exclusive_owner=session.broker.cluster_key(session) if method.exclusive else None)
    backlog.run_step(channel, method.index,
                     _declare_queue(channel, method, record, stream_locator))


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


async def _declare_queue(channel: Channel, method: Any, record: QueueRecord,
                         stream_locator: str | None = None) -> None:
    cluster, sync, vhost = _cluster(channel), _sync(channel), channel.vhost
    action = f"declare {vhost.rs('queue', record.name)}"
    if stream_locator is not None:  # its members and leader (docs/REPLICATION.md, "Membership")
        node, members = await running_nodes.place_new_stream(
            cluster, vhost.name, record.name, record.arguments.get("x-initial-cluster-size"),
            stream_locator)
        record = dataclasses.replace(record, node=node, members=members)
    leased = record.exclusive or record.auto_delete or not record.durable
    lease = _lease(cluster, action) if leased else 0
    await sync.deleted(record.vhost, record.name)  # the model let it go: etcd first
    try:
        result = await cluster.store.declare_queue(record, lease)
    except EtcdUnavailable as exc:
        if exc.maybe_applied:
            _undo_later(cluster, record)
        raise unavailable(action) from None
    await _settle(cluster, result.revision, action)
    queue = vhost.queues.get(record.name)
    if queue is None and isinstance(result, Created) and result.record.node == cluster.node:
        raise InternalError(f"cannot create {vhost.rs('queue', record.name)} on this node")
    if channel.closed:
        return
    channel.last_queue = record.name
    if queue is not None and not isinstance(result, Created):
        queue.touch()
    if not method.nowait:
        count, consumers = (queue.message_count, queue.consumer_count) if queue else (0, 0)
        channel.session.write(codec.encode_declare_ok(channel.number, record.name, count,
                                                      consumers))


def _undo_later(cluster: ClusterRuntime, record: QueueRecord) -> None:
    """A refused declaration's txn may have been applied, now or later (etcd may still hold
    the request): read the key until etcd has answered for UNDO_WINDOW_S, and delete the queue
    if it is the one this declaration wrote (its `storage_id`, fresh for every declaration)."""
    async def undo() -> None:
        loop = asyncio.get_running_loop()
        answered_since: float | None = None
        while answered_since is None or loop.time() - answered_since < UNDO_WINDOW_S:
            try:
                found = await cluster.store.get_queue(record.vhost, record.name)
                if found is not None and found.storage_id == record.storage_id:
                    await cluster.store.delete_queue(record.vhost, record.name,
                                                     if_revision=found.mod_revision)
                    log.info("undid a refused queue declaration", queue=record.name,
                             vhost=record.vhost)
                    return
                if found is not None:  # another declaration holds the name: ours cannot apply
                    return
                answered_since = answered_since or loop.time()
            except EtcdException:
                answered_since = None
            await asyncio.sleep(UNDO_PAUSE_S)
    task = asyncio.get_running_loop().create_task(undo())
    _undoing.add(task)
    task.add_done_callback(_undoing.discard)


_undoing: set[asyncio.Task[None]] = set()


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
    cluster, vhost = _cluster(channel), channel.vhost
    action = f"delete {vhost.rs('queue', name)}"
    record = cluster.cache.queue(vhost.name, name) if queue is not None else None
    count, later = 0, []
    if queue is not None:  # the cache may apply the delete before this step resumes
        count = queue.count_on_delete
        later = _cancels_after_reply(channel, queue)
    try:
        revision = await cluster.store.delete_queue(
            vhost.name, name, if_revision=record.mod_revision if record else 0)
    except EtcdUnavailable:
        for owner, consumer in later:  # still consuming: the closing channel cancels them
            owner.consumers[consumer.tag] = consumer
        raise unavailable(action) from None
    if revision is not None and queue is not None and vhost.queues.get(name) is queue:
        count = _sync(channel).remove_local(vhost, queue)
    if revision is not None:
        await _settle(cluster, revision, action)
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
