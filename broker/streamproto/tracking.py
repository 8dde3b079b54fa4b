"""QueryOffset, StoreOffset, QueryPublisherSequence and StreamStats wherever the stream is.

A node with a copy of the stream (its leader, or a replica: tracking records replicate inside
the log) answers the queries from its own log; StoreOffset on a replica goes to the leader
through the stream's replication (`store_at_leader`, the path of AMQP 0.9.1 offsets acked on a
replica), and on the leader it is written and shipped to the replicas at once (`appended`). A
node with no copy does what RabbitMQ's stream reader does (it looks the leader up): it asks the
leader's node over the cluster link (`stream.query`, answered here from that node's copy) and
sends StoreOffset to it (`stream.store_offset`). The leader's node down, or no answer:
STREAM_NOT_AVAILABLE, and a StoreOffset is dropped (RabbitMQ only logs it).

Must not know: AMQP, etcd, frames beyond the Decoder and encoders. Single-threaded, on the
event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from leveret.broker.cluster.link import LinkError
from leveret.broker.model.stream import StreamQueue
from leveret.broker.process import logs
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import consuming, publishing, streams
from leveret.broker.streamproto import frames as f
from leveret.storage import StorageError

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.cluster.link import Link
    from leveret.broker.streamproto.peers import Peers
    from leveret.broker.streamproto.session import StreamSession

log = logs.get("leveret.stream_connection")

QUERY = "stream.query"  # request {vhost, stream, what, reference} -> [code, value]
STORE = "stream.store_offset"  # message {vhost, stream, offsets: [[name hex, offset], ...]}
ASK_TIMEOUT_S = 10.0
_tasks: set[asyncio.Task[None]] = set()


# -- answers from a local copy (leader or replica), shared by both paths


def offset_answer(queue: StreamQueue, reference: str) -> tuple[int, int]:
    stored = queue.stored_offset(reference.encode("utf-8")) if reference else None
    if stored is None or stored < 0:
        return k.NO_OFFSET, 0
    return k.OK, stored


def sequence_answer(queue: StreamQueue, reference: str) -> tuple[int, int]:
    last = queue.last_publishing_id(reference.encode("utf-8")) if reference else 0
    return k.OK, max(0, last)


def store_local(queue: StreamQueue, offsets: dict[bytes, int]) -> None:
    """Store on this node's copy: a replica sends them to its leader (which writes them into
    the log, bringing them back to every member); the leader writes them and ships at once."""
    if queue.deleted:
        return
    replication = queue.replication
    if replication.store_at_leader(offsets):
        return
    if replication.role == "replica":
        return  # between leaders: dropped, as RabbitMQ drops a store with no leader
    try:
        queue.log.store_offsets(offsets)
    except StorageError as exc:
        log.error("storing a stream-protocol offset failed", stream=queue.name, error=str(exc))
        return
    replication.appended()  # a replicated stream's leader ships it


# -- a node with no copy: ask the leader's node


def _spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def _leader_link(s: StreamSession, name: str) -> Link | None:
    if not streams.held_elsewhere(s, name):
        return None
    peers = s.server.peers
    leader, _ = peers.placement(s.vhost.name, name, s.vhost.queues[name].holder)
    return peers.link_to(leader)


def ask_leader(s: StreamSession, key: int, corr: int, name: str, what: str, reference: str,
               encode: Callable[[Any], bytes], empty: bytes) -> None:
    """Answer `key` with what the leader's node says (`encode` makes the body of an OK)."""
    link = _leader_link(s, name)
    if link is None:
        s.send(f.response(key, corr, k.STREAM_NOT_AVAILABLE, empty))
        return
    body = {"vhost": s.vhost.name, "stream": name, "what": what, "reference": reference}

    async def ask() -> None:
        try:
            code, value = await link.call(QUERY, body, timeout=ASK_TIMEOUT_S)
            answer = encode(value) if code == k.OK else empty
        except (LinkError, ValueError, TypeError) as exc:  # closed, timed out, failed there
            log.warning("a stream query to the leader's node failed", stream=name,
                        error=str(exc))
            code, answer = k.STREAM_NOT_AVAILABLE, empty
        if not s.closed:
            s.send(f.response(key, corr, int(code), answer))
            s.flush()

    _spawn(ask())


def store_remote(s: StreamSession, name: str, offsets: dict[bytes, int]) -> None:
    link = _leader_link(s, name)
    if link is None:
        log.warning("stream-protocol offset not stored: the stream's leader cannot be reached",
                    stream=name)
        return
    try:
        link.post(STORE, {"vhost": s.vhost.name, "stream": name,
                          "offsets": [[ref.hex(), offset] for ref, offset in offsets.items()]})
    except LinkError as exc:
        log.warning("stream-protocol offset not stored", stream=name, error=str(exc))


def install(broker: Broker, peers: Peers) -> None:
    """Answer other nodes' stream queries and stores from this node's copies (on one node,
    no other node asks)."""

    def local(body: dict[str, object]) -> StreamQueue | None:
        vhost = broker.vhosts.get(str(body.get("vhost")))
        queue = vhost.queues.get(str(body.get("stream"))) if vhost is not None else None
        return queue if isinstance(queue, StreamQueue) and not queue.deleted else None

    async def query(_link: Link, body: object) -> list[object]:
        if not isinstance(body, dict) or (queue := local(body)) is None:
            return [k.STREAM_NOT_AVAILABLE, None]
        what, reference = body.get("what"), str(body.get("reference") or "")
        if what == "offset":
            return list(offset_answer(queue, reference))
        if what == "sequence":
            return list(sequence_answer(queue, reference))
        if what == "stats":
            return [k.OK, streams.stats_of(queue)]
        raise ValueError(f"unknown stream query {what!r}")

    async def store(_link: Link, body: object) -> None:
        if isinstance(body, dict) and (queue := local(body)) is not None:
            store_local(queue, {bytes.fromhex(str(ref)): int(offset)
                                for ref, offset in body.get("offsets", [])})

    peers.serve({QUERY: query}, {STORE: store})


# -- the handlers: the local ones of consuming, publishing and streams, unless held elsewhere


def _u64(value: int) -> bytes:
    return f.u64(int(value))


def _stats(value: dict[str, int] | None) -> bytes:
    stats = dict(value or {})
    return f.i32(len(stats)) + b"".join(
        f.enc_string(str(key)) + f.i64(int(v)) for key, v in stats.items())


def _wrap(key: int, what: str, with_reference: bool, permission: Callable[..., bool],
          handler: Callable[[StreamSession, f.Decoder, int], None],
          encode: Callable[[Any], bytes], empty: bytes
          ) -> Callable[[StreamSession, f.Decoder, int], None]:
    def wrapped(s: StreamSession, d: f.Decoder, version: int) -> None:
        copy = f.Decoder(d.data, d.pos)
        try:
            corr = copy.u32()
            reference = copy.string() if with_reference else ""
            name = copy.string()
            copy.done()
        except f.FrameError:
            handler(s, d, version)  # the handler fails it as a malformed frame
            return
        if permission(s, name) and streams.held_elsewhere(s, name):
            ask_leader(s, key, corr, name, what, reference, encode, empty)
            return
        handler(s, d, version)

    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped


def handlers() -> dict[int, Callable[[StreamSession, f.Decoder, int], None]]:
    """QueryOffset, QueryPublisherSequence and StreamStats, answered by the leader's node when
    this node has no copy; StoreOffset on any node."""
    def read(s: StreamSession, name: str) -> bool:
        return s.allowed("read", name)

    def read_or_write(s: StreamSession, name: str) -> bool:
        return s.allowed("read", name) or s.allowed("write", name)

    return {
        k.QUERY_OFFSET: _wrap(k.QUERY_OFFSET, "offset", True, read, consuming.query_offset,
                              _u64, f.u64(0)),
        k.QUERY_PUBLISHER_SEQUENCE: _wrap(
            k.QUERY_PUBLISHER_SEQUENCE, "sequence", True, read_or_write,
            publishing.query_publisher_sequence, _u64, f.u64(0)),
        k.STREAM_STATS: _wrap(k.STREAM_STATS, "stats", False, read, streams.stream_stats,
                              _stats, f.i32(0)),
        k.STORE_OFFSET: store_offset,
    }


def store_offset(s: StreamSession, d: f.Decoder, _version: int) -> None:
    """No response, as RabbitMQ: what cannot be stored is only logged."""
    reference = d.string()
    name = d.string()
    offset = d.u64()
    d.done()
    ref = reference.encode("utf-8")
    if not ref or len(ref) > 255 or not s.allowed("read", name):
        return
    queue = streams.stream_of(s, name)
    if queue is not None:
        store_local(queue, {ref: offset})
    elif streams.held_elsewhere(s, name):
        store_remote(s, name, {ref: offset})
