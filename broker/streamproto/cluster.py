"""The stream protocol in cluster mode: where a stream lives, as Metadata tells it, and
RabbitMQ's answer for what this node cannot serve of a stream held by another node.

Every node's model has every queue of the cluster; a stream held by another node is a
`RemoteQueue` of type stream naming its node (the stream's leader: streams are not replicated
yet). Metadata names that node with the stream endpoint of its node record in etcd
(`stream_host`, `stream_port`: its `--stream-advertised-host` / port, else its
`advertise_host` and stream port; records of older nodes fall back to `advertise_host` and
5552), as the links keep the running nodes' records (`ClusterLinks.records`). A stream whose
node is not running is STREAM_NOT_AVAILABLE with no leader, as RabbitMQ answers a stream
without a leader. Subscribe to a stream held elsewhere is STREAM_NOT_AVAILABLE, as RabbitMQ
answers a node with no member of the stream; so is DeclarePublisher (RabbitMQ's node writes to
a remote leader over Erlang distribution; Leveret's stream connections do not forward yet), and
clients that look up Metadata then connect to the leader.

On a single node (no cluster) Metadata names this node only, as before.
Must not know: AMQP, etcd. Single-threaded, on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.model.remote_queue import RemoteQueue
from leveret.broker.model.stream import StreamQueue
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import consuming, publishing
from leveret.broker.streamproto import frames as f

if TYPE_CHECKING:
    from leveret.broker.streamproto.session import StreamSession

DEFAULT_STREAM_PORT = 5552
NO_LEADER = 0xFFFF
Endpoint = tuple[str, int]


def remote_stream(s: StreamSession, name: str) -> RemoteQueue | None:
    queue = s.vhost.queues.get(name)
    if isinstance(queue, RemoteQueue) and queue.type == "stream" and not queue.deleted:
        return queue
    return None


def node_endpoint(s: StreamSession, node: str) -> Endpoint | None:
    """The stream endpoint of another running node, from its record; None when it is down."""
    cluster = getattr(s.broker, "cluster", None)
    if cluster is None:
        return None
    record: dict[str, Any] | None = cluster.links.records.get(node)
    if record is None:
        return None
    host = record.get("stream_host") or record.get("advertise_host") or ""
    port = record.get("stream_port")
    if not isinstance(port, int) or isinstance(port, bool) or port <= 0:
        port = DEFAULT_STREAM_PORT
    return (str(host), port) if host else None


def metadata(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    names = d.strings()
    d.done()
    here = s.server.advertised(s)
    single = getattr(s.broker, "cluster", None) is None
    leaders: dict[str, Endpoint | None] = {}
    codes: dict[str, int] = {}
    for name in dict.fromkeys(names):
        if not (s.allowed("read", name) or s.allowed("write", name)):
            codes[name] = k.ACCESS_REFUSED
            continue
        queue = s.vhost.queues.get(name)
        if isinstance(queue, StreamQueue) and not queue.deleted:
            codes[name], leaders[name] = k.OK, here
        elif (remote := remote_stream(s, name)) is not None:
            endpoint = node_endpoint(s, remote.node)
            codes[name] = k.OK if endpoint is not None else k.STREAM_NOT_AVAILABLE
            leaders[name] = endpoint
        else:
            codes[name] = k.STREAM_DOES_NOT_EXIST
    # RabbitMQ lists the endpoints of the nodes involved, sorted; a single node always itself
    endpoints = [here] if single else sorted({e for e in leaders.values() if e is not None})
    brokers = f.i32(len(endpoints)) + b"".join(
        f.u16(i) + f.enc_string(host) + f.u32(port) for i, (host, port) in enumerate(endpoints))
    entries = []
    for name, code in codes.items():
        endpoint = leaders.get(name)
        leader = endpoints.index(endpoint) if code == k.OK and endpoint else NO_LEADER
        entries.append(f.enc_string(name) + f.u16(code) + f.u16(leader) + f.i32(0))
    body = f.u32(corr) + brokers + f.i32(len(entries)) + b"".join(entries)
    s.send(f.frame(k.METADATA | k.RESPONSE, 1, body))


Handler = Callable[["StreamSession", f.Decoder, int], None]


def _held_elsewhere(key: int, peek: Callable[[f.Decoder], tuple[int, str]], permission: str,
                    handler: Handler) -> Handler:
    """`handler`, unless its stream is held by another node: then STREAM_NOT_AVAILABLE (after
    the same permission check, so a refusal stays ACCESS_REFUSED)."""

    def wrapped(s: StreamSession, d: f.Decoder, version: int) -> None:
        copy = f.Decoder(d.data, d.pos)
        try:
            corr, name = peek(copy)
        except f.FrameError:
            corr, name = 0, ""
        if name and s.allowed(permission, name) and remote_stream(s, name) is not None:
            s.send(f.response(key, corr, k.STREAM_NOT_AVAILABLE))
            return
        handler(s, d, version)

    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped


def _peek_publisher(d: f.Decoder) -> tuple[int, str]:
    corr = d.u32()
    d.u8()
    d.string()
    return corr, d.string()


def _peek_subscribe(d: f.Decoder) -> tuple[int, str]:
    corr = d.u32()
    d.u8()
    return corr, d.string()


declare_publisher = _held_elsewhere(k.DECLARE_PUBLISHER, _peek_publisher, "write",
                                    publishing.declare_publisher)
subscribe = _held_elsewhere(k.SUBSCRIBE, _peek_subscribe, "read", consuming.subscribe)
