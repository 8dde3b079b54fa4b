"""The stream protocol's stream management: Create, Delete, Route, Partitions,
StreamStats, CreateSuperStream and DeleteSuperStream.

Streams are the model's stream queues. Create, Delete, CreateSuperStream and DeleteSuperStream
run the model's checks at once, with RabbitMQ's response codes (rabbit_stream_manager,
rabbit_stream_reader: PRECONDITION_FAILED, ACCESS_REFUSED, STREAM_ALREADY_EXISTS,
STREAM_DOES_NOT_EXIST), then change the topology through the topology port
(`broker.topology`), one node or a cluster alike: on one node the port never waits and the
step, started eagerly (`process/eager.py`), answers in the turn that read the command; in a
cluster it answers once every running node has applied the change. The store unreachable or too slow
(`TopologyError`): INTERNAL_ERROR.

CreateSuperStream answers as rabbit_stream_manager:create_super_stream does: partitions named
and bound with the keys the client sent, as they are (a blank key is a key); a partition name
given twice is STREAM_ALREADY_EXISTS and nothing is made; a failure on the way removes what was
made (docs/STREAM-PROTOCOL.md, "Super streams"). Route and Partitions take any exchange of the
name, as rabbit_stream_manager does (one made through the management API with no super-stream
marker too), and list its streams only.
Must not know: frames beyond the Decoder and the encoders, which mode the broker runs in.
Single-threaded, on the event loop.
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING, Any

from leveret.broker.cluster.etcd import EtcdException
from leveret.broker.model import superstream
from leveret.broker.model.args import LEADER_LOCATORS
from leveret.broker.model.errors import BrokerError, NotFound, PreconditionFailed
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES
from leveret.broker.model.stream import StreamQueue
from leveret.broker.process import eager, logs
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.broker.topology.port import BindingSpec, ExchangeSpec, QueueSpec, TopologyError
from leveret.storage import OffsetSpec

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

log = logs.get("leveret.stream_connection")
SUPER_STREAM_MARKER = {"x-super-stream": True}
Unavailable = (TopologyError, EtcdException)  # the store cannot take the change now

_LONG_ARGS = {
    "max-length-bytes": "x-max-length-bytes",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
    "initial-cluster-size": "x-initial-cluster-size",
    "stream-filter-size-bytes": "x-stream-filter-size-bytes",
}
_TEXT_ARGS = {"max-age": "x-max-age", "queue-leader-locator": "x-queue-leader-locator"}


def queue_arguments(arguments: dict[str, str]) -> dict[str, Any]:
    """Create's string arguments as queue.declare's (rabbit_stream_manager's mapping), or
    PreconditionFailed where RabbitMQ answers validation_failed. Unknown keys are ignored."""
    out: dict[str, Any] = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        if key in _LONG_ARGS:
            try:
                out[_LONG_ARGS[key]] = int(value)
            except ValueError:
                raise PreconditionFailed(f"invalid value for {key}") from None
        elif key in _TEXT_ARGS:
            out[_TEXT_ARGS[key]] = value
    if out.get("x-initial-cluster-size", 1) <= 0:
        raise PreconditionFailed("initial-cluster-size must be positive")
    locator = out.get("x-queue-leader-locator")  # rabbit_queue_location:queue_leader_locators()
    if locator is not None and locator not in LEADER_LOCATORS:
        raise PreconditionFailed("invalid queue-leader-locator")
    size = out.get("x-stream-filter-size-bytes")
    if size is not None and not 16 <= size <= 255:
        raise PreconditionFailed("stream-filter-size-bytes must be between 16 and 255")
    return out


def correct_name(name: str) -> str | None:
    """rabbit_stream_utils:enforce_correct_name: CR and LF dropped; not empty, not amq.*"""
    name = name.replace("\n", "").replace("\r", "")
    if not name or name.startswith("amq."):
        return None
    return name


def stream_of(s: StreamSession, name: str) -> StreamQueue | None:
    """The stream's copy on this node (its leader or a replica), if any."""
    queue = s.vhost.queues.get(name)
    return queue if isinstance(queue, StreamQueue) and not queue.deleted else None


def stream_known(s: StreamSession, name: str) -> bool:
    """A stream of the vhost, held here or by another node of the cluster."""
    queue = s.vhost.queues.get(name)
    return queue is not None and queue.type == "stream" and not queue.deleted


def held_elsewhere(s: StreamSession, name: str) -> bool:
    """A stream of the vhost with no copy on this node (another node of the cluster holds
    it)."""
    return stream_known(s, name) and stream_of(s, name) is None


def _answer(s: StreamSession, key: int, corr: int, code: int) -> None:
    if not s.closed:
        s.send(f.response(key, corr, code))


def create(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    raw_name = d.string()
    arguments = d.map()
    d.done()
    name = correct_name(raw_name)
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
        args = queue_arguments(arguments)
        s.vhost.check_queue_declaration(name, owner=s, durable=True, arguments=args)
    except BrokerError:
        _answer(s, k.CREATE, corr, k.PRECONDITION_FAILED)
        return
    eager.start_task(_create(s, corr, QueueSpec(name, "stream", durable=True, arguments=args,
                                           owner=s)))


async def _create(s: StreamSession, corr: int, spec: QueueSpec) -> None:
    try:
        declared = await s.broker.topology.declare_queue(s.vhost, spec)
    except BrokerError:  # another kind of queue with that name, declared meanwhile
        _answer(s, k.CREATE, corr, k.STREAM_ALREADY_EXISTS)
        return
    except Unavailable as exc:
        log.warning("cannot create a stream: the metadata store is unavailable",
                    stream=spec.name, error=str(exc))
        _answer(s, k.CREATE, corr, k.INTERNAL_ERROR)
        return
    _answer(s, k.CREATE, corr, k.OK if declared.created else k.STREAM_ALREADY_EXISTS)


def delete(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("configure", name):
        _answer(s, k.DELETE, corr, k.ACCESS_REFUSED)
    elif not stream_known(s, name):
        _answer(s, k.DELETE, corr, k.STREAM_DOES_NOT_EXIST)
    else:
        eager.start_task(_delete(s, corr, name))


async def _delete(s: StreamSession, corr: int, name: str) -> None:
    vhost = s.vhost
    try:
        deleted = await s.broker.topology.delete_queue(vhost, name)
    except Unavailable as exc:
        log.warning("cannot delete a stream: the metadata store is unavailable", stream=name,
                    error=str(exc))
        _answer(s, k.DELETE, corr, k.INTERNAL_ERROR)
        return
    if deleted is None:  # deleted meanwhile, by someone else
        _answer(s, k.DELETE, corr, k.STREAM_DOES_NOT_EXIST)
        return
    _answer(s, k.DELETE, corr, k.OK)
    s.server.stream_deleted(vhost.name, name)


def route(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    routing_key = d.string()
    name = d.string()
    d.done()
    exchange = s.vhost.exchanges.get(name)
    if exchange is None:
        s.send(f.response(k.ROUTE, corr, k.STREAM_DOES_NOT_EXIST, f.i32(0)))
        return
    if not s.allowed("read", name):
        s.send(f.response(k.ROUTE, corr, k.ACCESS_REFUSED, f.i32(0)))
        return
    queues = [q.name for q in exchange.route([routing_key], {}) if _is_stream(q)]
    s.send(f.response(k.ROUTE, corr, k.OK, f.enc_strings(queues)))


def partitions(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    d.done()
    exchange = s.vhost.exchanges.get(name)
    if exchange is None:
        s.send(f.response(k.PARTITIONS, corr, k.STREAM_DOES_NOT_EXIST, f.i32(0)))
        return
    if not s.allowed("read", name):
        s.send(f.response(k.PARTITIONS, corr, k.ACCESS_REFUSED, f.i32(0)))
        return
    names = [q.name for q in superstream.partitions_of(exchange) if _is_stream(q)]
    s.send(f.response(k.PARTITIONS, corr, k.OK, f.enc_strings(names)))


def _is_stream(destination: Any) -> bool:
    """Route and Partitions list streams only: rabbit_stream_manager's
    is_resource_stream_queue."""
    return bool(destination.kind == "queue" and destination.type == "stream")


def stream_stats(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("read", name):
        s.send(f.response(k.STREAM_STATS, corr, k.ACCESS_REFUSED, f.i32(0)))
        return
    queue = stream_of(s, name)
    if queue is None:
        s.send(f.response(k.STREAM_STATS, corr, k.STREAM_DOES_NOT_EXIST, f.i32(0)))
        return
    stats = stats_of(queue)
    body = f.i32(len(stats)) + b"".join(
        f.enc_string(key) + f.i64(value) for key, value in stats.items())
    s.send(f.response(k.STREAM_STATS, corr, k.OK, body))


def stats_of(queue: StreamQueue) -> dict[str, int]:
    """StreamStats of this node's copy, as osiris:get_stats names them (RabbitMQ 3.11 and
    later): the first chunk, the last committed chunk (of a replicated stream, up to what a
    majority holds) and the last chunk this copy has written. A chunk's id is its first
    offset; -1 when there is none."""
    log = queue.log
    if log.committed_offset < log.first_offset:
        return {"first_chunk_id": -1, "committed_chunk_id": -1, "last_chunk_id": -1}
    return {
        "first_chunk_id": log.first_offset,
        "committed_chunk_id": _last_chunk(queue, queue.commit_bound),
        "last_chunk_id": _last_chunk(queue, None),
    }


def _last_chunk(queue: StreamQueue, bound: int | None) -> int:
    """The first offset of the last chunk of records up to `bound` (None: all of the log)."""
    if bound is not None and bound < queue.log.first_offset:
        return -1
    reader = queue.log.reader(OffsetSpec.last(), chunk_types=STREAM_CHUNK_TYPES,
                              limit=None if bound is None else lambda: bound)
    try:
        return reader.position
    finally:
        reader.close()


def create_super_stream(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    names = d.strings()
    keys = d.strings()
    arguments = d.map()
    d.done()
    code, args = _check_super(s, name, names, keys, arguments)
    if code != k.OK:
        _answer(s, k.CREATE_SUPER_STREAM, corr, code)
        return
    eager.start_task(_create_super(s, corr, name, names, keys, args))


def _check_super(s: StreamSession, name: str, names: list[str], keys: list[str],
                 arguments: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """The checks of CreateSuperStream, in RabbitMQ's order; (OK, the partitions' queue
    arguments) or the response code."""
    vhost = s.vhost
    if correct_name(name) is None or not names or len(names) != len(keys):
        return k.PRECONDITION_FAILED, {}
    if not all(s.allowed("configure", n) for n in [name, *names]) or not s.allowed(
            "write", name):
        return k.ACCESS_REFUSED, {}
    if name in vhost.exchanges or any(n in vhost.queues for n in names):
        return k.STREAM_ALREADY_EXISTS, {}
    try:
        args = queue_arguments(arguments)
    except PreconditionFailed:
        return k.PRECONDITION_FAILED, {}
    if len(set(names)) != len(names):  # the second declaration of a name finds the first
        return k.STREAM_ALREADY_EXISTS, {}
    try:
        _keys, _names, queue_args = superstream.plan(vhost, name, partitions=len(names),
                                                     names=names, arguments=args)
        vhost.check_exchange_declaration(name, "direct", durable=True, auto_delete=False,
                                         internal=False, arguments=SUPER_STREAM_MARKER)
        for queue_name in names:
            vhost.check_queue_declaration(queue_name, owner=s, durable=True,
                                          arguments=queue_args)
    except BrokerError:
        return k.PRECONDITION_FAILED, {}
    return k.OK, queue_args


async def _create_super(s: StreamSession, corr: int, name: str, names: list[str],
                        keys: list[str], args: dict[str, Any]) -> None:
    """The exchange, then each partition (placed as a Create's stream is) and its binding,
    each settled before the next, so consecutive partitions see the leaders placed before
    them. A failure removes what was made."""
    topology, vhost = s.broker.topology, s.vhost
    made: list[str] = []
    exchange_made = False
    try:
        await topology.declare_exchange(vhost, ExchangeSpec(
            name, "direct", durable=True, arguments=SUPER_STREAM_MARKER))
        exchange_made = True
        for order, (key, queue_name) in enumerate(zip(keys, names, strict=True)):
            declared = await topology.declare_queue(vhost, QueueSpec(
                queue_name, "stream", durable=True, arguments=args, owner=s))
            if not declared.created:
                raise PreconditionFailed(f"there is already a queue named {queue_name}")
            made.append(queue_name)
            await topology.bind(vhost, BindingSpec(
                name, "queue", queue_name, key, {"x-stream-partition-order": order}))
    except Unavailable as exc:
        log.warning("cannot create a super stream: the metadata store is unavailable",
                    stream=name, error=str(exc))
        await _unmake(s, name if exchange_made else None, made)
        _answer(s, k.CREATE_SUPER_STREAM, corr, k.INTERNAL_ERROR)
        return
    except BrokerError:  # declared meanwhile, by someone else
        await _unmake(s, name if exchange_made else None, made)
        _answer(s, k.CREATE_SUPER_STREAM, corr, k.PRECONDITION_FAILED)
        return
    _answer(s, k.CREATE_SUPER_STREAM, corr, k.OK)


async def _unmake(s: StreamSession, exchange: str | None, queues: list[str]) -> None:
    """Remove what a refused CreateSuperStream made (what cannot be removed stays)."""
    topology, vhost = s.broker.topology, s.vhost
    for queue_name in queues:
        with suppress(BrokerError, *Unavailable):
            await topology.delete_queue(vhost, queue_name)
    if exchange is not None:
        with suppress(BrokerError, *Unavailable):
            await topology.delete_exchange(vhost, exchange)


def delete_super_stream(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """The exchange (its bindings with it), then each partition stream."""
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("configure", name):
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.ACCESS_REFUSED)
        return
    exchange = s.vhost.exchanges.get(name)
    if not isinstance(exchange, superstream.SuperStreamExchange):
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.STREAM_DOES_NOT_EXIST)
        return
    partitions = [q.name for q in exchange.partitions() if q.type == "stream"]
    eager.start_task(_delete_super(s, corr, name, partitions))


async def _delete_super(s: StreamSession, corr: int, name: str, partitions: list[str],
                        ) -> None:
    topology, vhost = s.broker.topology, s.vhost
    deleted: list[str] = []
    try:
        if not await topology.delete_exchange(vhost, name):
            raise NotFound(name)  # deleted meanwhile, by someone else
        for queue_name in partitions:
            if await topology.delete_queue(vhost, queue_name) is not None:
                deleted.append(queue_name)
    except Unavailable as exc:
        log.warning("cannot delete a super stream: the metadata store is unavailable",
                    stream=name, error=str(exc))
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.INTERNAL_ERROR)
        return
    except BrokerError:
        _answer(s, k.DELETE_SUPER_STREAM, corr, k.STREAM_DOES_NOT_EXIST)
        return
    _answer(s, k.DELETE_SUPER_STREAM, corr, k.OK)
    for stream in deleted:
        s.server.stream_deleted(vhost.name, stream)
