"""The cluster link's handshake: settings, typed errors, and the mutual shared-secret proof.

Role: admit a peer node, or refuse it with a typed `HandshakeError` whose message is one line
for the operator. Client and server each send a HELLO with a fresh 32-byte random nonce; each
answers the other's nonce with HMAC-SHA256(secret, role, nonce, client node, server node,
cluster), the server in its HELLO, the client in its AUTH; the server ends with READY. The side
that finds a mismatch (protocol version, cluster name, node name, proof) sends CLOSE with a
code and the reason, so that both sides raise the same error class. The secret never crosses
the wire, and the role in the proof keeps one side's answer from serving as the other's.

It must not know AMQP, queues, etcd or sockets: it reads and writes frames through a
`FrameIO` (the Link).

Threading: one event loop; a handshake is one coroutine per connection.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from leveret.broker.cluster import link_frames as lf
from leveret.broker.cluster.link_frames import Frame, FrameType

PROTOCOL_VERSION = 2  # 2: the two-call stream.sync with epoch ranges, fenced tails
MAGIC = "leveret-link"
NONCE_SIZE = 32


@dataclass(frozen=True)
class LinkConfig:
    cluster: str
    node: str
    secret: bytes
    max_payload: int = lf.DEFAULT_MAX_PAYLOAD
    # a HEARTBEAT goes out every interval while nothing else waits to be sent; a peer from
    # which nothing at all (any frame) has arrived for the timeout is dropped. The broker
    # passes its `cluster_heartbeat_*` settings (docs/CONFIGURATION.md#failure-detection)
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 2.0
    handshake_timeout_s: float = 10.0
    call_timeout_s: float = 30.0
    max_outstanding_calls: int = 1024
    max_concurrent_requests: int = 64
    write_high_water: int = 1024 * 1024  # bytes queued in the transport before senders wait
    close_grace_s: float = 2.0  # a closed link's unsent bytes get this long, then are dropped


class LinkError(Exception):
    """Anything that goes wrong on a cluster link."""


class HandshakeError(LinkError):
    """The peer could not be admitted (or did not admit us); `str()` is one log line."""

    code = "handshake"

    def __init__(self, message: str, peer: str = "") -> None:
        super().__init__(f"{message} (peer {peer})" if peer else message)
        self.detail = message
        self.peer = peer


class AuthenticationFailed(HandshakeError):
    code = "auth"


class ClusterMismatch(HandshakeError):
    code = "cluster"


class VersionMismatch(HandshakeError):
    code = "version"


class NodeNameRejected(HandshakeError):
    code = "node"


class PeerStarting(HandshakeError):
    """The server is a node still starting (its handlers are not all registered): the dialer
    tries again soon, and neither side counts it as a link."""

    code = "starting"


REFUSALS: dict[str, type[HandshakeError]] = {
    cls.code: cls for cls in (AuthenticationFailed, ClusterMismatch, VersionMismatch,
                              NodeNameRejected, PeerStarting)
}


def proof(secret: bytes, role: bytes, nonce: bytes, client: str, server: str,
          cluster: str) -> bytes:
    """HMAC-SHA256(secret, the fields, each u32-length-prefixed); `role` is b"server" or
    b"client"."""
    parts = (b"leveret link v1", role, nonce, client.encode(), server.encode(), cluster.encode())
    message = b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hmac.new(secret, message, hashlib.sha256).digest()


def hello(config: LinkConfig, nonce: bytes, answer: bytes | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"magic": MAGIC, "version": PROTOCOL_VERSION,
                           "cluster": config.cluster, "node": config.node, "nonce": nonce.hex()}
    if answer is not None:
        obj["proof"] = answer.hex()
    return obj


class FrameIO(Protocol):
    peer_address: str

    async def read_frame(self) -> Frame: ...

    def send_control(self, frame_type: FrameType, obj: dict[str, Any]) -> None: ...


def _hex(obj: dict[str, Any], name: str, frame_type: FrameType) -> bytes:
    try:
        return bytes.fromhex(lf.field(obj, name, str, frame_type))
    except ValueError:
        raise lf.MalformedPayload(f"{frame_type.name} {name!r} is not hex") from None


class Handshake:
    """One side's handshake over a FrameIO; `run()` returns the peer's node name. A server
    whose `admit()` answers False refuses a valid HELLO with `PeerStarting`."""

    def __init__(self, io: FrameIO, config: LinkConfig, client: bool,
                 admit: Callable[[], bool] | None = None) -> None:
        self.io = io
        self.config = config
        self.client = client
        self.admit = admit

    async def run(self) -> str:
        return await (self._client() if self.client else self._server())

    async def _expect(self, frame_type: FrameType) -> dict[str, Any]:
        frame = await self.io.read_frame()
        if frame.type is FrameType.CLOSE:
            obj = lf.decode_json(frame)
            refusal = REFUSALS.get(str(obj.get("code")), HandshakeError)
            raise refusal(f"refused by the peer: {obj.get('message')}", self.io.peer_address)
        if frame.type is not frame_type:
            raise HandshakeError(f"expected {frame_type.name} in the handshake, got "
                                 f"{frame.type.name}", self.io.peer_address)
        return lf.decode_json(frame)

    def _refuse(self, error: HandshakeError) -> HandshakeError:
        self.io.send_control(FrameType.CLOSE, {"code": error.code, "message": error.detail})
        return error

    def _check_hello(self, obj: dict[str, Any]) -> str:
        """The peer's node name, once its HELLO's magic, version and cluster are ours."""
        cfg, peer = self.config, self.io.peer_address
        if obj.get("magic") != MAGIC:
            raise HandshakeError("not a Leveret cluster link", peer)
        version = obj.get("version")
        if version != PROTOCOL_VERSION:
            raise self._refuse(VersionMismatch(
                f"link protocol version {version!r} is not this node's {PROTOCOL_VERSION}", peer))
        cluster = obj.get("cluster")
        if cluster != cfg.cluster:
            raise self._refuse(ClusterMismatch(
                f"peer belongs to cluster {cluster!r}, this node to {cfg.cluster!r}", peer))
        node = lf.field(obj, "node", str, FrameType.HELLO)
        if not node or node == cfg.node:
            raise self._refuse(NodeNameRejected(
                f"peer node name {node!r} is empty or this node's own", peer))
        return str(node)

    def _check_proof(self, obj: dict[str, Any], frame_type: FrameType, expected: bytes,
                     peer: str) -> None:
        if not hmac.compare_digest(expected, _hex(obj, "proof", frame_type)):
            raise self._refuse(AuthenticationFailed(
                f"shared-secret check failed between nodes {self.config.node!r} and {peer!r}: "
                "their cluster secrets differ", self.io.peer_address))

    async def _client(self) -> str:
        cfg = self.config
        nonce = os.urandom(NONCE_SIZE)
        self.io.send_control(FrameType.HELLO, hello(cfg, nonce))
        obj = await self._expect(FrameType.HELLO)
        server = self._check_hello(obj)
        server_nonce = _hex(obj, "nonce", FrameType.HELLO)
        self._check_proof(obj, FrameType.HELLO,
                          proof(cfg.secret, b"server", nonce, cfg.node, server, cfg.cluster),
                          server)
        answer = proof(cfg.secret, b"client", server_nonce, cfg.node, server, cfg.cluster)
        self.io.send_control(FrameType.AUTH, {"proof": answer.hex()})
        await self._expect(FrameType.READY)
        return server

    async def _server(self) -> str:
        cfg = self.config
        obj = await self._expect(FrameType.HELLO)
        client = self._check_hello(obj)
        if self.admit is not None and not self.admit():
            raise self._refuse(PeerStarting(f"node {cfg.node!r} is starting",
                                            self.io.peer_address))
        client_nonce = _hex(obj, "nonce", FrameType.HELLO)
        nonce = os.urandom(NONCE_SIZE)
        answer = proof(cfg.secret, b"server", client_nonce, client, cfg.node, cfg.cluster)
        self.io.send_control(FrameType.HELLO, hello(cfg, nonce, answer))
        auth = await self._expect(FrameType.AUTH)
        self._check_proof(auth, FrameType.AUTH,
                          proof(cfg.secret, b"client", nonce, client, cfg.node, cfg.cluster),
                          client)
        self.io.send_control(FrameType.READY, {})
        return client
