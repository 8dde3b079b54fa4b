"""The stream protocol's stream management: Create, Delete, Route, Partitions,
StreamStats, CreateSuperStream and DeleteSuperStream.

Streams are the model's stream queues, declared and deleted through the vhost with the same
checks as a queue.declare of `x-queue-type: stream`; RabbitMQ's answers (rabbit_stream_manager,
rabbit_stream_reader) map the model's errors to response codes.
Must not know: frames beyond the Decoder and the encoders. Single-threaded, on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leveret.broker.model import superstream
from leveret.broker.model.errors import BrokerError, NotFound, PreconditionFailed
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES
from leveret.broker.model.stream import StreamQueue
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import frames as f
from leveret.storage import OffsetSpec

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

_LONG_ARGS = {
    "max-length-bytes": "x-max-length-bytes",
    "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
    "initial-cluster-size": "x-initial-cluster-size",
    "stream-filter-size-bytes": "x-stream-filter-size-bytes",
}
_TEXT_ARGS = {"max-age": "x-max-age", "queue-leader-locator": "x-queue-leader-locator"}
LEADER_LOCATORS = ("client-local", "balanced")


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
    locator = out.get("x-queue-leader-locator")
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
    queue = s.vhost.queues.get(name)
    return queue if isinstance(queue, StreamQueue) and not queue.deleted else None


def create(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    raw_name = d.string()
    arguments = d.map()
    d.done()
    s.send(f.response(k.CREATE, corr, _create(s, raw_name, arguments)))


def _create(s: StreamSession, raw_name: str, arguments: dict[str, str]) -> int:
    name = correct_name(raw_name)
    if name is None:
        return k.PRECONDITION_FAILED
    if not s.allowed("configure", name):
        return k.ACCESS_REFUSED
    if name in s.vhost.queues:
        return k.STREAM_ALREADY_EXISTS
    try:
        args = queue_arguments(arguments)
        s.vhost.declare_queue(name, owner=s, durable=True, arguments=args)
    except (PreconditionFailed, BrokerError):
        return k.PRECONDITION_FAILED
    return k.OK


def delete(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("configure", name):
        s.send(f.response(k.DELETE, corr, k.ACCESS_REFUSED))
        return
    queue = stream_of(s, name)
    if queue is None:
        s.send(f.response(k.DELETE, corr, k.STREAM_DOES_NOT_EXIST))
        return
    s.vhost.delete_queue(queue)
    s.send(f.response(k.DELETE, corr, k.OK))
    s.server.stream_deleted(s.vhost.name, name)


def route(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    routing_key = d.string()
    name = d.string()
    d.done()
    exchange = s.vhost.exchanges.get(name)
    if exchange is None or not isinstance(exchange, superstream.SuperStreamExchange):
        s.send(f.response(k.ROUTE, corr, k.STREAM_DOES_NOT_EXIST, f.i32(0)))
        return
    if not s.allowed("read", name):
        s.send(f.response(k.ROUTE, corr, k.ACCESS_REFUSED, f.i32(0)))
        return
    queues = [q.name for q in exchange.route([routing_key], {})]
    s.send(f.response(k.ROUTE, corr, k.OK, f.enc_strings(queues)))


def partitions(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    d.done()
    exchange = s.vhost.exchanges.get(name)
    if exchange is None or not isinstance(exchange, superstream.SuperStreamExchange):
        s.send(f.response(k.PARTITIONS, corr, k.STREAM_DOES_NOT_EXIST, f.i32(0)))
        return
    if not s.allowed("read", name):
        s.send(f.response(k.PARTITIONS, corr, k.ACCESS_REFUSED, f.i32(0)))
        return
    names = [q.name for q in exchange.partitions()]
    s.send(f.response(k.PARTITIONS, corr, k.OK, f.enc_strings(names)))


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
    """StreamStats of this node's copy: osiris's first and committed chunk ids."""
    log = queue.log
    empty = log.committed_offset < log.first_offset
    last_chunk = -1
    if not empty:  # the first offset of the last committed chunk, as osiris names chunks
        reader = log.reader(OffsetSpec.last(), chunk_types=STREAM_CHUNK_TYPES)
        last_chunk = reader.position
        reader.close()
    return {
        "first_chunk_id": -1 if empty else log.first_offset,
        "committed_chunk_id": last_chunk,
    }


def create_super_stream(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    names = d.strings()
    keys = d.strings()
    arguments = d.map()
    d.done()
    s.send(f.response(k.CREATE_SUPER_STREAM, corr,
                      _create_super(s, name, names, keys, arguments)))


def _create_super(s: StreamSession, name: str, names: list[str], keys: list[str],
                  arguments: dict[str, str]) -> int:
    if correct_name(name) is None or not names or len(names) != len(keys):
        return k.PRECONDITION_FAILED
    if not all(s.allowed("configure", n) for n in [name, *names]) or not s.allowed(
            "write", name):
        return k.ACCESS_REFUSED
    if name in s.vhost.exchanges or any(n in s.vhost.queues for n in names):
        return k.STREAM_ALREADY_EXISTS
    if names != [f"{name}-{key}" for key in keys]:
        return _create_named_partitions(s, name, names, keys, arguments)
    try:
        superstream.add(s.vhost, name, binding_keys=keys,
                        arguments=queue_arguments(arguments), owner=s)
    except BrokerError:
        return k.PRECONDITION_FAILED
    return k.OK


def _create_named_partitions(s: StreamSession, name: str, names: list[str], keys: list[str],
                             arguments: dict[str, str]) -> int:
    """Partitions whose names are not `<super stream>-<key>`: declared one by one."""
    vhost = s.vhost
    try:
        args = queue_arguments(arguments)
        args.setdefault("x-queue-leader-locator", "balanced")
        vhost.declare_exchange(name, "direct", durable=True, arguments={"x-super-stream": True})
        for order, (key, queue_name) in enumerate(zip(keys, names, strict=True)):
            vhost.declare_queue(queue_name, owner=s, durable=True, arguments=args)
            vhost.bind(name, "queue", queue_name, key, {"x-stream-partition-order": order})
    except BrokerError:
        for queue_name in names:
            queue = vhost.queues.get(queue_name)
            if queue is not None:
                vhost.delete_queue(queue)
        if name in vhost.exchanges:
            vhost.delete_exchange(name)
        return k.PRECONDITION_FAILED
    return k.OK


def delete_super_stream(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    name = d.string()
    d.done()
    if not s.allowed("configure", name):
        s.send(f.response(k.DELETE_SUPER_STREAM, corr, k.ACCESS_REFUSED))
        return
    exchange = s.vhost.exchanges.get(name)
    if exchange is None or not isinstance(exchange, superstream.SuperStreamExchange):
        s.send(f.response(k.DELETE_SUPER_STREAM, corr, k.STREAM_DOES_NOT_EXIST))
        return
    try:
        deleted = superstream.delete(s.vhost, name)
    except NotFound:
        s.send(f.response(k.DELETE_SUPER_STREAM, corr, k.STREAM_DOES_NOT_EXIST))
        return
    s.send(f.response(k.DELETE_SUPER_STREAM, corr, k.OK))
    for stream in deleted:
        s.server.stream_deleted(s.vhost.name, stream)
