"""Running the broker: the listener, signal handling and an orderly shutdown.

`run(config)` starts the AMQP listener on the configured host and port (by default `::`, one
socket for IPv4 and IPv6: see `listen`), logs one line when it listens, and on SIGINT or SIGTERM
stops accepting, closes every connection with 320 CONNECTION_FORCED, flushes what must reach
the disk, and returns 0. A port that is taken raises ServerError with one clear sentence.
With `etcd` set, the node listens on its cluster port (`cluster.peers`), joins its cluster
(`cluster.membership`), then links to its peers once its listeners are up; it leaves last.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import gc
import os
import resource
import signal
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from leveret.broker.access.definitions import DefinitionsError, load_file
from leveret.broker.broker import VERSION, WAL_FOLDER, Broker
from leveret.broker.cluster import access_sync, topology_sync
from leveret.broker.cluster.etcd import EtcdClient, EtcdException
from leveret.broker.cluster.link import LinkConfig
from leveret.broker.cluster.membership import (
    ClusterKeys,
    Membership,
    MembershipError,
    parse_endpoints,
    read_secret,
)
from leveret.broker.cluster.peers import ClusterLinks
from leveret.broker.cluster.runtime import ClusterRuntime
from leveret.broker.cluster.topology import TopologyStore
from leveret.broker.cluster.topology_cache import TopologyCache
from leveret.broker.cluster.topology_keys import TopologyKeys
from leveret.broker.management import cluster_views, local_token
from leveret.broker.management.app import ManagementServer
from leveret.broker.metadata.recorder import RestoreError
from leveret.broker.metadata.store import MetastoreError
from leveret.broker.process import listen, logs
from leveret.broker.process.config import Config
from leveret.broker.process.listen import (
    ServerError as ServerError,  # the CLI and tests import it here
)
from leveret.broker.process.listen import listen_error as listen_error
from leveret.broker.process.listen import tls_context as tls_context
from leveret.broker.remote.forwarding import Forwarder
from leveret.broker.remote.tunnel_server import TunnelServer
from leveret.broker.session.connection import Session
from leveret.broker.streamproto import server as stream_listeners
from leveret.broker.streamproto.server import StreamServer
from leveret.broker.topology.cluster import ClusterTopology
from leveret.broker.workers.pool import Listener, WorkerPool, usable_cores
from leveret.storage import wal

log = logs.get("leveret.server")


def check_writable(data_dir: Path) -> None:
    """Refuse a data directory that cannot be written (a read-only mount, no permission), at
    once and in one line, rather than failing at the first declaration. Creating an empty file
    needs no free space, so a full disk still starts (and its consumers can drain it)."""
    probe = data_dir / ".leveret-write-check"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise ServerError(f"data directory {data_dir} is not writable: {exc.strerror}") from None


def lock_queues(data_dir: Path) -> int:
    """One exclusive flock over the node's queue folders, held for the server's life, so that
    a durable or quorum queue's log needs no descriptor of its own for a lock of its folder
    (with 1,000 quorum queues, 1,000 descriptors a node: docs/QUORUM-QUEUES.md, "Many
    queues"). A second `leveret serve` on the same data directory is refused at once."""
    queues = data_dir / "queues"
    try:
        queues.mkdir(exist_ok=True)
        fd = os.open(queues, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ServerError(f"data directory {data_dir} is not writable: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServerError(f"data directory {data_dir} is in use by another leveret "
                          "serve") from None
    return fd


def replay_wal(data_dir: Path) -> None:
    """Before any log opens (and after lock_queues: no other process writes them): the bytes
    the node's write-ahead log made durable go back into their segment files (storage/wal.py),
    then the logs' own recovery runs as always. A failure stops the start: opening the logs
    without those bytes would lose what was confirmed."""
    try:
        done = wal.replay(data_dir / WAL_FOLDER)
    except OSError as exc:
        raise ServerError(f"cannot replay the write-ahead log in {data_dir / WAL_FOLDER}: "
                          f"{exc.strerror}") from None
    if done.files:
        log.info("write-ahead log replayed", files=done.files, records=done.records,
                 applied=done.applied, missing=done.missing, forgotten=done.forgotten,
                 torn=",".join(done.torn))


class Server:
    """A started broker: its listeners and state, stoppable from the same loop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._queues_lock = -1  # lock_queues' descriptor while the server runs
        self.broker: Broker | None = None
        self.listeners: list[asyncio.Server | Listener] = []
        self.pool: WorkerPool | None = None  # --workers N > 1: the wire workers
        self.stopped = asyncio.Event()
        self.on_stop: list[Callable[[], Awaitable[None]]] = []
        self.management: ManagementServer | None = None
        self.membership: Membership | None = None
        self.cluster_links: ClusterLinks | None = None
        self.etcd: EtcdClient | None = None
        self.stream_server: StreamServer | None = None  # RabbitMQ's stream protocol
        # the address the AMQP listeners are bound to, set as they bind: the configured host,
        # or for the default `::` (both families) or `0.0.0.0` (no IPv6 on this host)
        self.host = config.host

    @property
    def port(self) -> int:
        sock = self.listeners[0].sockets[0]
        return int(sock.getsockname()[1])

    async def start(self) -> None:
        config = self.config
        try:
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServerError(
                f"cannot create data directory {config.data_dir}: {exc.strerror}"
            ) from None
        check_writable(config.data_dir)
        self._queues_lock = lock_queues(config.data_dir)
        try:
            replay_wal(config.data_dir)
            context = tls_context(config) if config.tls_port else None
            await self._join_cluster()
            try:
                await self._start_broker(context)
            except ServerError:
                await self._leave_cluster()
                raise
        except BaseException:
            self._unlock_queues()
            raise
        if self.cluster_links is not None:
            await self.cluster_links.start()

    async def _leave_cluster(self) -> None:
        if self.cluster_links is not None:
            await self.cluster_links.close()
        if self.membership is not None:
            await self.membership.close()  # revokes the lease: the node's record goes at once

    async def _join_cluster(self) -> None:
        """In cluster mode, register this node in etcd (or refuse to start, in one line)."""
        config = self.config
        if not config.etcd:
            return
        try:
            endpoints = parse_endpoints(config.etcd)
            secret = read_secret(config.cluster_secret, config.cluster_secret_file)
        except MembershipError as exc:
            raise ServerError(str(exc)) from None
        client = EtcdClient(endpoints)
        link_config = LinkConfig(config.cluster_name, config.node_name, secret.encode(),
                                 heartbeat_interval_s=config.cluster_heartbeat_interval_s,
                                 heartbeat_timeout_s=config.cluster_heartbeat_timeout_s)
        links = ClusterLinks(client, config.cluster_name, config.node_name, secret.encode(),
                             version=VERSION, host=config.host, port=config.cluster_port,
                             config=link_config)
        try:
            await links.listen()  # before the record: a peer that sees it can link at once
        except OSError as exc:
            await client.close()
            raise ServerError(listen_error(exc, config.host, config.cluster_port,
                                           "--cluster-port")) from None
        record = {"version": VERSION, "advertise_host": config.advertise_host,
                  "amqp_port": config.port, "cluster_port": links.port,
                  "management_port": config.management_port,
                  # where stream clients reach this node (Metadata on other nodes names it)
                  "stream_host": config.stream_advertised_host,
                  "stream_port": config.stream_advertised_port or config.stream_port}
        membership = Membership(client, config.cluster_name, config.node_name,
                                secret, config.cluster_lease_ttl_s, record)
        membership.listeners.append(links.set_in_cluster)
        try:
            await membership.join()
        except MembershipError as exc:
            await links.close()
            await membership.close()
            raise ServerError(str(exc)) from None
        await links.read_records()  # the running nodes, known before any link is up
        self.membership = membership
        self.cluster_links = links
        self.etcd = client

    async def _start_broker(self, context: ssl.SSLContext | None) -> None:
        config = self.config
        try:
            self.broker = Broker(config, asyncio.get_running_loop(), queues_locked=True)
        except (RestoreError, MetastoreError) as exc:
            raise ServerError(str(exc)) from None
        broker = self.broker
        membership = broker.membership = self.membership
        broker.cluster_links = self.cluster_links
        if membership is not None:
            alarms = broker.alarms
            broker.alarm_listeners.append(lambda: membership.set_alarms(
                [name for name, on in (("memory", alarms.memory), ("disk", alarms.disk)) if on]))
            await self._start_topology(broker)
        if config.definitions is not None:
            try:  # in cluster mode, through etcd: the cluster's cache is loaded by now
                await load_file(broker, config.definitions)
            except DefinitionsError as exc:
                broker.close()
                raise ServerError(str(exc)) from None
        processes = config.workers or usable_cores()
        bound: list[socket.socket] | None = None
        if processes > 1:
            # The port first: a port in use is one line, with no worker started for nothing.
            bound = self._bind(broker, config.port, "--port")
            self.pool = WorkerPool(processes - 1, lambda: Session(broker), config.frame_max,
                                   config.loop)
            try:
                await self.pool.start()
            except OSError as exc:
                await self.pool.stop()
                for sock in bound:
                    sock.close()
                broker.close()
                raise ServerError(f"cannot start the wire workers: {exc}") from None
            broker.alarms.worker_pids = self.pool.pids
        self.listeners.append(await self._listen(broker, config.port, None, "--port", bound))
        log.info("listening", host=self.host, port=self.port, data_dir=str(config.data_dir))
        if context is not None:
            tls = await self._listen(broker, config.tls_port, context, "tls_port")
            self.listeners.append(tls)
            log.info("listening for amqps", host=self.host,
                     port=tls.sockets[0].getsockname()[1])
        await stream_listeners.start(self)
        broker.alarms.start()
        if config.management_port:
            await self._start_management(broker)

    async def _start_topology(self, broker: Broker) -> None:
        """Cluster mode: every layer registers on the runtime, then the topology cache's
        first load fills the model before any client is served."""
        config = self.config
        assert self.etcd is not None and self.membership is not None
        assert self.cluster_links is not None
        keys = TopologyKeys(ClusterKeys(config.cluster_name).root + "topology/")
        cache = TopologyCache(self.etcd, keys)
        broker.cluster = ClusterRuntime(
            node=config.node_name, cluster=config.cluster_name, client=self.etcd,
            membership=self.membership, links=self.cluster_links,
            store=TopologyStore(self.etcd, keys), cache=cache)
        topology_sync.install(broker)
        assert broker.topology_sync is not None
        broker.topology = ClusterTopology(broker.cluster, broker.topology_sync,
                                          config.queue_leader_locator)
        access_sync.install(broker)
        cluster_views.install(broker, broker.cluster)  # the HTTP API's questions from other nodes
        forwarder = broker.forwarder = Forwarder(broker, TunnelServer(broker))
        forwarder.serve(self.cluster_links)  # the tunnels other nodes open to this one
        try:
            await cache.start()
            await access_sync.first_boot(broker)
            await topology_sync.loaded(broker)
        except EtcdException as exc:
            broker.close()
            raise ServerError(f"cannot read the cluster's topology from etcd: {exc}") from None
        self.on_stop.append(cache.close)

    def _bind(self, broker: Broker, port: int, flag: str) -> list[socket.socket]:
        """The AMQP port's sockets, bound, for the wire workers' listener."""
        host = self.config.host
        try:
            return listen.sockets_for(host, port)
        except OSError as exc:
            broker.close()
            raise ServerError(listen_error(exc, host, port, flag)) from None

    async def _listen(self, broker: Broker, port: int, ssl_context: ssl.SSLContext | None,
                      flag: str, bound: list[socket.socket] | None = None,
                      ) -> asyncio.Server | Listener:
        loop = asyncio.get_running_loop()
        host = self.config.host
        if self.pool is not None and ssl_context is None:
            sockets = bound if bound is not None else self._bind(broker, port, flag)
            self.host = listen.address_of(host, sockets[0] if listen.is_dual_stack(host) else None)
            return self.pool.listen(sockets)
        try:
            sock = listen.socket_for(host, port)
            host = self.host = listen.address_of(host, sock)
            if sock is None:
                return await loop.create_server(
                    lambda: Session(broker, tls=ssl_context is not None), host, port,
                    reuse_address=True, backlog=4096, ssl=ssl_context,
                )
            return await loop.create_server(
                lambda: Session(broker, tls=ssl_context is not None), sock=sock,
                backlog=4096, ssl=ssl_context,
            )
        except OSError as exc:
            broker.close()
            raise ServerError(listen_error(exc, host, port, flag)) from None

    async def _start_management(self, broker: Broker) -> None:
        """The management HTTP API on the same loop (config.management_port, 0 = off)."""
        config = self.config
        host = config.management_host or config.host
        # the operator tools' credential (docs/CLI.md#the-local-credential)
        token = local_token.token_for(read_secret(config.cluster_secret, config.cluster_secret_file)
                                      if config.etcd else None)
        local_token.write_token(config.data_dir, token)
        management = ManagementServer(broker, host, config.management_port, self.port,
                                      amqp_host=self.host, cli_token=token)
        try:
            await management.start()
        except OSError as exc:
            for listener in self.listeners:
                listener.close()
            broker.close()
            if exc.errno == errno.EADDRINUSE:
                raise ServerError(
                    f"management port {config.management_port} on {host} is already in use; "
                    "pass --management-port (0 disables the management API)"
                ) from None
            raise ServerError(
                f"cannot listen on {host}:{config.management_port}: {exc.strerror}"
            ) from None
        self.management = management

    def _unlock_queues(self) -> None:
        if self._queues_lock >= 0:
            os.close(self._queues_lock)
            self._queues_lock = -1

    async def stop(self) -> None:
        """Stop accepting, close connections with 320, flush, and finish."""
        if self.stopped.is_set():
            return
        if self.broker is not None:
            self.broker.alarms.stop()
        for listener in self.listeners:
            listener.close()
        if self.management is not None:
            await self.management.stop()
        if self.stream_server is not None:
            await self.stream_server.stop()
        broker = self.broker
        if broker is not None:
            broker.commit_pending()
            await asyncio.sleep(0)  # a turn: the sessions write the confirms it settled
            for session in list(broker.connections):
                session.force_close()
            deadline = asyncio.get_running_loop().time() + 2.0
            while broker.connections and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            for session in list(broker.connections):
                session.abort()
            broker.close()
        self._unlock_queues()
        if self.pool is not None:
            await self.pool.stop()
        for callback in self.on_stop:
            await callback()
        for listener in self.listeners:
            await listener.wait_closed()
        await self._leave_cluster()
        self.stopped.set()
        log.info("stopped")


def settle_garbage_collector() -> None:
    """Keep the cyclic garbage collector out of the delivery path.

    Everything alive after start-up (modules, classes, restored state) is moved out of the
    collector's sight, and the youngest generation is collected less often: the per-message
    objects die young by reference counting, so full collections only cost latency."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard limit, as RabbitMQ's packaging does:
    every connection is a descriptor, and every durable queue and stream keeps three open (its
    active segment, its index and the lock on its folder), so a default soft limit of 1024
    would refuse queues after a few hundred."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            return
        log.info("raised the open files limit", soft=soft, now=wanted)


async def serve(config: Config) -> int:
    """Run until SIGINT or SIGTERM; returns the process exit code."""
    raise_open_files_limit()
    server = Server(config)
    await server.start()
    settle_garbage_collector()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
    return 0
