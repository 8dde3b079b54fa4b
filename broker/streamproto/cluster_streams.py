"""Create, Delete, CreateSuperStream and DeleteSuperStream of the stream protocol in cluster
mode: through the topology in etcd, as an AMQP 0.9.1 queue.declare / queue.delete of a stream
is in a cluster, so that every node sees the stream (a super stream: its exchange, partitions
and bindings, through `access_store.ClusterAccess`) and its leader is placed as RabbitMQ
places it (`queue-leader-locator`: the policy key, the `queue-leader-locator` argument, else
the node's `queue_leader_locator`).

The checks and their response codes are those of `streams.create` / `streams.delete`
(PRECONDITION_FAILED, ACCESS_REFUSED, STREAM_ALREADY_EXISTS, STREAM_DOES_NOT_EXIST); then the
topology port (`broker.topology`: the placement, record and etcd txn of every front end) runs
in a task, and the answer goes out once every running node has applied the change. etcd
unreachable or too slow (`TopologyError`): INTERNAL_ERROR. On a single node
these hand over to `streams.create` / `streams.delete` unchanged.
Must not know: AMQP, etcd's wire. Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from leveret.broker.access.access_store import ClusterAccess, TopologyUnavailable
from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.model import superstream
from leveret.broker.model.errors import BrokerError, PreconditionFailed
from leveret.broker.model.stream import StreamQueue
from leveret.broker.process import logs
from leveret.broker.streamproto import cluster as placement
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.broker.streamproto import streams
from leveret.broker.topology.port import QueueSpec, TopologyError

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

log = logs.get("leveret.stream_connection")
_tasks: set[asyncio.Task[None]] = set()


def _spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def _answer(s: StreamSession, key: int, corr: int, code: int) -> None:
    if not s.closed:
        s.send(f.response(key, corr, code))
        s.flush()


def create(s: StreamSession, d: f.Decoder, version: int) -> None:
    cluster = s.broker.cluster
    if cluster is None:
        streams.create(s, d, version)
        return
    corr = d.u32()
    raw_name = d.string()
    arguments = d.map()
    d.done()
    name = streams.correct_name(raw_name)
    if name is None:
        _answer(s, k.CREATE, corr, k.PRECONDITION_FAILED)
        return
    if not s.allowed("configure", name):
        _answer(s, k.CREATE, corr, k.ACCESS_REFUSED)
        return
    if name in s.vhost.queues:
        _answer(s, k.CREATE, corr, k.STREAM_ALREADY_EXISTS)
        return
    try:
        args = streams.queue_arguments(arguments)
        s.vhost.check_queue_declaration(name, owner=s, durable=True, arguments=args)
    except (PreconditionFailed, BrokerError):
        _answer(s, k.CREATE, corr, k.PRECONDITION_FAILED)
        return
    _spawn(_create(s, corr, QueueSpec(name, "stream", durable=True, arguments=args)))


async def _create(s: StreamSession, corr: int, spec: QueueSpec) -> None:
    try:
        declared = await s.broker.topology.declare_queue(s.vhost, spec)
    except BrokerError:  # another kind of queue with that name, declared meanwhile
        _answer(s, k.CREATE, corr, k.STREAM_ALREADY_EXISTS)
        return
    except (TopologyError, EtcdException) as exc:
        log.warning("cannot create a stream: the metadata store is unavailable",
                    stream=spec.name, error=str(exc))
        _answer(s, k.CREATE, corr, k.INTERNAL_ERROR)
        return
    if not declared.created:  # declared meanwhile, by someone else
        _answer(s, k.CREATE, corr, k.STREAM_ALREADY_EXISTS)
        return
    _answer(s, k.CREATE, corr, k.OK)


def delete(s: StreamSession, d: f.Decoder, version: int) -> None:
    cluster = s.broker.cluster
    if cluster is None:
        streams.delete(s, d, version)
        return
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("configure", name):
        _answer(s, k.DELETE, corr, k.ACCESS_REFUSED)
        return
    queue = s.vhost.queues.get(name)
    local = isinstance(queue, StreamQueue) and not queue.deleted
    if not local and placement.remote_stream(s, name) is None:
        _answer(s, k.DELETE, corr, k.STREAM_DOES_NOT_EXIST)
        return
    _spawn(_delete(s, corr, name))


async def _delete(s: StreamSession, corr: int, name: str) -> None:
    vhost = s.vhost
    try:
        deleted = await s.broker.topology.delete_queue(vhost, name)
    except (TopologyError, EtcdException) as exc:
        log.warning("cannot delete a stream: the metadata store is unavailable", stream=name,
                    error=str(exc))
        _answer(s, k.DELETE, corr, k.INTERNAL_ERROR)
        return
    if deleted is None:  # deleted meanwhile, by someone else
        _answer(s, k.DELETE, corr, k.STREAM_DOES_NOT_EXIST)
        return
    _answer(s, k.DELETE, corr, k.OK)
    s.server.stream_deleted(vhost.name, name)


def create_super_stream(s: StreamSession, d: f.Decoder, version: int) -> None:
    """CreateSuperStream in cluster mode: `streams.create_super_stream`'s checks and codes,
    then the exchange, each partition (placed over the nodes: `balanced` leaders unless the
    arguments name a locator) and its binding through etcd (`ClusterAccess.add_super_stream`),
    settled on every node before the answer."""
    cluster = s.broker.cluster
    if cluster is None:
        streams.create_super_stream(s, d, version)
        return
    corr = d.u32()
    name = d.string()
    names = d.strings()
    keys = d.strings()
    arguments = d.map()
    d.done()
    key = k.CREATE_SUPER_STREAM
    if streams.correct_name(name) is None or not names or len(names) != len(keys):
        _answer(s, key, corr, k.PRECONDITION_FAILED)
        return
    if not all(s.allowed("configure", n) for n in [name, *names]) or not s.allowed(
            "write", name):
        _answer(s, key, corr, k.ACCESS_REFUSED)
        return
    if name in s.vhost.exchanges or any(n in s.vhost.queues for n in names):
        _answer(s, key, corr, k.STREAM_ALREADY_EXISTS)
        return
    try:
        args = streams.queue_arguments(arguments)
        superstream.plan(s.vhost, name, binding_keys=keys, names=names, arguments=args)
    except BrokerError:
        _answer(s, key, corr, k.PRECONDITION_FAILED)
        return
    _spawn(_create_super(s, ClusterAccess(s.broker, cluster), corr, name, names, keys, args))


async def _create_super(s: StreamSession, access: ClusterAccess, corr: int, name: str,
                        names: list[str], keys: list[str], args: dict[str, Any]) -> None:
    try:
        await access.add_super_stream(s.vhost.name, name, binding_keys=keys, names=names,
                                      arguments=args)
    except TopologyUnavailable as exc:
        log.warning("cannot create a super stream: the metadata store is unavailable",
                    stream=name, error=str(exc))
        _answer(s, k.CREATE_SUPER_STREAM, corr, k.INTERNAL_ERROR)
        return
    except BrokerError:  # declared meanwhile, by someone else
        _answer(s, k.CREATE_SUPER_STREAM, corr, k.PRECONDITION_FAILED)
        return
    _answer(s, k.CREATE_SUPER_STREAM, corr, k.OK)


def delete_super_stream(s: StreamSession, d: f.Decoder, version: int) -> None:
    """DeleteSuperStream in cluster mode: the exchange, then its partitions, through etcd."""
    cluster = s.broker.cluster
    if cluster is None:
        streams.delete_super_stream(s, d, version)
        return
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("configure", name):
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.ACCESS_REFUSED)
        return
    if not isinstance(s.vhost.exchanges.get(name), superstream.SuperStreamExchange):
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.STREAM_DOES_NOT_EXIST)
        return
    _spawn(_delete_super(s, ClusterAccess(s.broker, cluster), corr, name))


async def _delete_super(s: StreamSession, access: ClusterAccess, corr: int, name: str) -> None:
    vhost = s.vhost.name
    try:
        deleted = await access.delete_super_stream(vhost, name)
    except TopologyUnavailable as exc:
        log.warning("cannot delete a super stream: the metadata store is unavailable",
                    stream=name, error=str(exc))
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.INTERNAL_ERROR)
        return
    except BrokerError:  # deleted meanwhile, by someone else
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.STREAM_DOES_NOT_EXIST)
        return
    _answer(s, k.DELETE_SUPER_STREAM, corr, k.OK)
    for stream in deleted:
        s.server.stream_deleted(vhost, stream)
