"""The stream protocol's listeners (plain on stream_port, TLS on stream_tls_port), the command
table, and the registry of stream connections.

`start(server)` is the one call the broker's Server makes: it binds the listeners next to the
AMQP ones (their sockets join `server.listeners`, so they stop accepting with them) and stops
the connections before the broker closes its queues. The advertised host and port are what
Open and Metadata announce (settings stream_advertised_host and stream_advertised_port; by
default the port the client used, and the host `advertise.py` chooses: `localhost` for a
client over loopback, else the address it connected to; in a cluster, the node's record's).
Must not know: AMQP 0.9.1. Single-threaded, on the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from leveret.broker.process import listen, logs
from leveret.broker.streamproto import (
    advertise,
    amqp10,  # noqa: F401 - registers the record converter
    cluster,
    consuming,
    handshake,
    publishing,
    registry,
    streams,
    tracking,
)
from leveret.broker.streamproto import constants as k
from leveret.broker.streamproto.peers import Peers, peers_of
from leveret.broker.streamproto.session import StreamSession
from leveret.broker.streamproto.settings import Settings

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.process.config import Config
    from leveret.broker.streamproto import frames

log = logs.get("leveret.stream_server")
DEFAULT_PORT = 5552
DEFAULT_TLS_PORT = 5551
SWEEP_S = 0.5  # how often publishers of deleted streams are looked for
Handler = Callable[[StreamSession, "frames.Decoder", int], None]

HANDLERS: dict[int, Handler] = {
    k.PEER_PROPERTIES: handshake.peer_properties,
    k.SASL_HANDSHAKE: handshake.sasl_handshake,
    k.SASL_AUTHENTICATE: handshake.sasl_authenticate,
    k.TUNE: handshake.tune,
    k.OPEN: handshake.open_,
    k.CLOSE: handshake.close,
    k.HEARTBEAT: handshake.heartbeat,
    k.EXCHANGE_COMMAND_VERSIONS: handshake.exchange_command_versions,
    k.DECLARE_PUBLISHER: cluster.declare_publisher,  # publishing's, or a stream held elsewhere
    k.PUBLISH: publishing.publish,
    k.QUERY_PUBLISHER_SEQUENCE: publishing.query_publisher_sequence,
    k.DELETE_PUBLISHER: publishing.delete_publisher,
    k.SUBSCRIBE: cluster.subscribe,  # consuming's, or a stream held elsewhere
    k.CREDIT: consuming.credit,
    k.UNSUBSCRIBE: consuming.unsubscribe,
    k.QUERY_OFFSET: consuming.query_offset,
    k.CONSUMER_UPDATE | k.RESPONSE: consuming.consumer_update_response,
    k.CREATE: streams.create,
    k.DELETE: streams.delete,
    k.METADATA: cluster.metadata,
    k.ROUTE: streams.route,
    k.PARTITIONS: streams.partitions,
    k.STREAM_STATS: streams.stream_stats,
    k.CREATE_SUPER_STREAM: streams.create_super_stream,
    k.DELETE_SUPER_STREAM: streams.delete_super_stream,
    k.RESOLVE_OFFSET_SPEC: consuming.resolve_offset_spec,
    # QueryOffset, QueryPublisherSequence, StreamStats: the local ones, or the leader's node
    # asked; StoreOffset: to the local copy or the leader
    **tracking.handlers(),
}
PRE_OPEN = frozenset({k.PEER_PROPERTIES, k.SASL_HANDSHAKE, k.SASL_AUTHENTICATE, k.TUNE,
                      k.OPEN, k.CLOSE, k.HEARTBEAT})


class StreamServer:
    """The stream listeners of one broker, and their connections."""

    def __init__(self, broker: Broker, settings: Settings, peers: Peers) -> None:
        self.broker = broker
        self.settings = settings
        self.peers = peers  # the other nodes (peers.py): a stream's leader, their endpoints
        self.handlers = HANDLERS
        self.pre_open = PRE_OPEN
        self.sessions: set[StreamSession] = set()
        self.listeners: list[asyncio.Server] = []
        self.port = 0  # as bound (0: no plain listener)
        self.tls_port = 0
        # bound port -> whether `localhost` reaches that listener at every address it names
        self.localhost_reaches: dict[int, bool] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def advertised(self, session: StreamSession) -> tuple[str, int]:
        """The endpoint Open and Metadata announce to this session (advertise.py)."""
        host = self.settings.advertised_host or self.peers.own_host()
        port = self.settings.advertised_port
        if not host or not port:
            sock = session.transport.get_extra_info("sockname") if session.transport else None
            if not host:
                host = (advertise.default_host(str(sock[0]),
                                               self.localhost_reaches.get(sock[1], False))
                        if sock else advertise.LOCALHOST)
            if not port:
                port = sock[1] if sock else 0
        return host, port

    def alarm_changed(self) -> None:
        """A resource alarm cleared: blocked publishers are read again."""
        if self.broker.alarm is None:
            for session in list(self.sessions):
                session.unblock()

    def forget(self, session: StreamSession) -> None:
        session._release()
        self.sessions.discard(session)

    def start_sweeping(self) -> None:
        self._sweep = asyncio.get_running_loop().call_later(SWEEP_S, self.sweep)

    def sweep(self) -> None:
        """Publishers of a stream deleted by other means than this protocol's Delete (AMQP
        queue.delete, the management API, another node of the cluster) learn it as
        RabbitMQ tells them: MetadataUpdate STREAM_NOT_AVAILABLE. (Subscribers learn it at
        once, through their consumer's cancel.)"""
        for session in list(self.sessions):
            gone = [pid for pid, p in session.publishers.items() if p.queue.deleted]
            streams = {session.publishers.pop(pid).stream for pid in gone}
            for stream in streams:
                session.stream_unavailable(stream)
            if streams:
                session.flush()
        self.start_sweeping()

    def stream_deleted(self, vhost: str, name: str) -> None:
        """Another connection's publishers and subscribers of a deleted stream learn it as
        RabbitMQ tells them: a MetadataUpdate with STREAM_NOT_AVAILABLE."""
        for session in list(self.sessions):
            if session.vhost is None or session.vhost.name != vhost:
                continue
            gone = [pid for pid, p in session.publishers.items() if p.stream == name]
            for pid in gone:
                del session.publishers[pid]
            if gone:
                session.stream_unavailable(name)

    async def listen(self, host: str, port: int, context: ssl.SSLContext | None) -> int:
        loop = asyncio.get_running_loop()
        tls = context is not None
        sock = listen.socket_for(host, port)
        if sock is None:
            listener = await loop.create_server(lambda: StreamSession(self, tls), host, port,
                                                reuse_address=True, backlog=1024, ssl=context)
        else:
            listener = await loop.create_server(lambda: StreamSession(self, tls), sock=sock,
                                                backlog=1024, ssl=context)
        self.listeners.append(listener)
        bound: int = listener.sockets[0].getsockname()[1]
        self.localhost_reaches[bound] = await _localhost_reaches(listener, bound)
        log.info("listening for the stream protocol", host=host, port=bound, tls=tls)
        return bound

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        for listener in self.listeners:
            listener.close()
        for session in list(self.sessions):
            session.force_close()
        for _ in range(50):
            if not self.sessions:
                break
            await asyncio.sleep(0.02)
        for session in list(self.sessions):
            if session.transport is not None:
                session.transport.abort()


async def _localhost_reaches(listener: asyncio.Server, port: int) -> bool:
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(advertise.LOCALHOST, port,
                                                             type=socket.SOCK_STREAM)
    except OSError:
        return False
    return advertise.localhost_reaches(listener.sockets, [str(i[4][0]) for i in infos])


class Host(Protocol):
    """What `start` needs of the starting `leveret.broker.server.Server` (a Protocol: that
    module imports this one)."""

    stream_server: StreamServer | None

    @property
    def config(self) -> Config: ...

    @property
    def broker(self) -> Broker | None: ...  # set before the stream listeners start

    @property
    def host(self) -> str: ...


def _tls_context(server: Host) -> ssl.SSLContext | None:
    config = server.config
    if not config.stream_tls_port or config.tls_certfile is None or config.tls_keyfile is None:
        return None
    context: ssl.SSLContext = listen.tls_context(config)  # the amqps listener's, shared
    return context


async def start(server: Host) -> StreamServer | None:
    """Bind the stream listeners of a starting Server (its broker is up). A listener on its
    default port that is taken (another broker on this machine) is skipped with a warning; a
    port that was chosen and is taken stops the start, in one line."""
    config = server.config
    context = _tls_context(server)
    wanted: list[tuple[int, ssl.SSLContext | None, str, int]] = [
        (config.stream_port, None, "--stream-port", DEFAULT_PORT)]
    if context is not None:
        wanted.append((config.stream_tls_port, context, "--stream-tls-port", DEFAULT_TLS_PORT))
    wanted = [w for w in wanted if w[0]]
    if not wanted:
        return None
    settings = Settings(advertised_host=config.stream_advertised_host,
                        advertised_port=config.stream_advertised_port)
    broker = server.broker
    assert broker is not None, "the broker starts before its stream listeners"
    peers = peers_of(broker)
    streams_server = StreamServer(broker, settings, peers)
    host = server.host
    for port, tls, flag, default in wanted:
        try:
            bound = await streams_server.listen(host, port, tls)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and port == default:
                log.warning("stream protocol port in use; not listening on it", port=port,
                            setting=flag)
                continue
            await streams_server.stop()
            broker.close()
            raise listen.ServerError(listen.listen_error(exc, host, port, flag)) from None
        if tls is None:
            streams_server.port = bound
        else:
            streams_server.tls_port = bound
    broker.alarm_listeners.append(streams_server.alarm_changed)
    server.stream_server = streams_server
    registry.register(broker, streams_server)
    tracking.install(broker, peers)  # other nodes' queries of this node's copies
    streams_server.start_sweeping()
    return streams_server
