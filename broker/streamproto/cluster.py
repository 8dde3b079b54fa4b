"""The stream protocol over the nodes: where a stream lives, as Metadata tells it, and
RabbitMQ's answer for what this node cannot serve of a stream it does not lead.

In a cluster every node's model has every queue of the cluster. A stream's topology record
names its leader (`node`) and, for a replicated stream, its members; a node that is neither has
it as a `RemoteQueue`, a replica holds a real `StreamQueue` with role "replica". Metadata names the
leader and the running replicas, each with the stream endpoint of its node record in etcd
(`stream_host`, `stream_port`: its `--stream-advertised-host` / port, else its `advertise_host`
and stream port; records of older nodes fall back to `advertise_host` and 5552), as the links
keep the running nodes' records (`ClusterLinks.records`); this node is announced as Open
announces it. A stream whose leader's node is not running is STREAM_NOT_AVAILABLE with no
leader (0xFFFF), as RabbitMQ answers a stream without a leader.

Subscribe on a node with no member of the stream is STREAM_NOT_AVAILABLE, as RabbitMQ answers
it (a replica serves subscribers). DeclarePublisher on a node that does not lead the stream is
STREAM_NOT_AVAILABLE too: RabbitMQ's node would write to a remote leader over Erlang
distribution, Leveret's stream connections do not forward (a replica nacks stream-protocol
publishes); clients that look Metadata up connect to the leader.

Where the nodes are comes from the broker's peers (`peers.py`): on one node every stream is
here, Metadata always names this node, and nothing is held elsewhere.
Must not know: AMQP, etcd, whether the broker runs in a cluster. Single-threaded, on the event
loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from leveret.broker.model.stream import StreamQueue
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto import consuming, publishing
from leveret.broker.streamproto import frames as f
from leveret.broker.streamproto.streams import held_elsewhere, stream_known

if TYPE_CHECKING:
    from leveret.broker.streamproto.peers import Endpoint, Peers
    from leveret.broker.streamproto.session import StreamSession

NO_LEADER = 0xFFFF


def _endpoint(peers: Peers, here: Endpoint, node: str) -> Endpoint | None:
    return here if node == peers.node else peers.endpoint(node)


def metadata(s: StreamSession, d: f.Decoder, _version: int) -> None:
    corr = d.u32()
    names = d.strings()
    d.done()
    here = s.server.advertised(s)
    peers = s.server.peers
    found: dict[str, tuple[int, Endpoint | None, list[Endpoint]]] = {}
    for name in dict.fromkeys(names):
        if not (s.allowed("read", name) or s.allowed("write", name)):
            found[name] = (k.ACCESS_REFUSED, None, [])
            continue
        if not stream_known(s, name):
            found[name] = (k.STREAM_DOES_NOT_EXIST, None, [])
            continue
        leader, replicas = peers.placement(s.vhost.name, name, s.vhost.queues[name].holder)
        at = _endpoint(peers, here, leader)
        seen = [e for e in (_endpoint(peers, here, r) for r in replicas) if e is not None]
        found[name] = (k.OK if at is not None else k.STREAM_NOT_AVAILABLE, at, seen)
    endpoints = peers.announced(
        here, {e for _, at, seen in found.values() for e in ([at] if at else []) + seen})
    brokers = f.i32(len(endpoints)) + b"".join(
        f.u16(i) + f.enc_string(host) + f.u32(port) for i, (host, port) in enumerate(endpoints))
    entries = []
    for name, (code, at, seen) in found.items():
        index = endpoints.index(at) if at is not None else NO_LEADER
        entries.append(f.enc_string(name) + f.u16(code) + f.u16(index) + f.i32(len(seen))
                       + b"".join(f.u16(endpoints.index(e)) for e in seen))
    body = f.u32(corr) + brokers + f.i32(len(entries)) + b"".join(entries)
    s.send(f.frame(k.METADATA | k.RESPONSE, 1, body))


Handler = Callable[["StreamSession", f.Decoder, int], None]


def not_held(s: StreamSession, name: str) -> bool:
    """No member of the stream on this node (Subscribe is refused)."""
    return held_elsewhere(s, name)


def not_led(s: StreamSession, name: str) -> bool:
    """The stream is held elsewhere, or this node has a replica of it (DeclarePublisher is
    refused: a stream-protocol publish to a replica would be nack'ed)."""
    queue = s.vhost.queues.get(name)
    if isinstance(queue, StreamQueue) and queue.role == "replica":
        return True
    return not_held(s, name)


def _held_elsewhere(key: int, peek: Callable[[f.Decoder], tuple[int, str]], permission: str,
                    handler: Handler, elsewhere: Callable[[StreamSession, str], bool]) -> Handler:
    """`handler`, unless its stream is held by another node: then STREAM_NOT_AVAILABLE (after
    the same permission check, so a refusal stays ACCESS_REFUSED)."""

    def wrapped(s: StreamSession, d: f.Decoder, version: int) -> None:
        copy = f.Decoder(d.data, d.pos)
        try:
            corr, name = peek(copy)
        except f.FrameError:
            corr, name = 0, ""
        if name and s.allowed(permission, name) and elsewhere(s, name):
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
                                    publishing.declare_publisher, not_led)
subscribe = _held_elsewhere(k.SUBSCRIBE, _peek_subscribe, "read", consuming.subscribe, not_held)
